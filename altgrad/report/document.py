"""Assemble report.md and its PNG figures from one or more sweep folders."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from altgrad.report import outliers, plots, provenance, tables
from altgrad.report import study_records as records
from altgrad.report.benefit import stability_thresholds, ulp_benefits
from altgrad.report.caveats import caveat_lines, tuning_runs
from altgrad.report.cells import Cell, group_cells
from altgrad.report.findings import findings
from altgrad.report.ladder import ladder, recovery
from altgrad.report.load import Job, load_sweeps
from altgrad.report.mechanism import has_updates, speeds
from altgrad.report.order import OPTIMIZER_ORDER, rank
from altgrad.report.sensitivity import neighbours
from altgrad.report.stages import attribute_failures
from altgrad.report.study import SameGrid, StudyResult, analyse, declared_endpoints, endpoint_problems, label_of

REPORT_NAME = "report.md"


def _figure(path: Path | None, caption: str, missing: str) -> str:
    return f"![{caption}]({path.name})" if path is not None else f"_{missing}_"


def same_grid_rule(jobs: Sequence[Job]) -> SameGrid | None:
    """Whether two formats give the same grid under the runs' scaling and overflow (the quantization library's
    ``altgrad.quant.grids``): formats that both ran compare their runs' whole format config (gradient format
    included); a declared format that did not run is compared under the scaling the runs used. None when the
    library has no such rule (every format is then its own arm)."""
    try:
        from altgrad.quant.grids import run_grid_key, same_grid
    except ImportError:
        return None
    configs: dict[str, dict] = {}
    for job in jobs:
        fmt = job.config.get("format")
        if isinstance(fmt, dict) and fmt.get("name") and job.format not in configs:
            configs[job.format] = fmt
    quantized = [c for c in configs.values() if isinstance(c.get("scaling"), dict)]
    scaling = quantized[0]["scaling"] if quantized else None
    overflow = (quantized[0].get("overflow") if quantized else None) or "saturate"

    def rule(a: str, b: str) -> bool:
        try:
            if a in configs and b in configs:
                return run_grid_key(configs[a]) == run_grid_key(configs[b])
            return bool(same_grid(a, b, scaling, overflow))
        except (ValueError, KeyError, TypeError):  # a name the library does not know is its own grid
            return False

    return rule


def study_curves(results: Sequence[StudyResult]) -> list[plots.CurveGroup]:
    """The declared studies' evaluation curves: one line per format × arm (its declared lr), and a dashed one per
    lr sensitivity run of an arm."""
    groups: dict[tuple[str, str, float | None, bool], list[Job]] = {}
    for result in results:
        off = {id(j) for j in result.off_lr}
        for job in result.jobs:
            groups.setdefault((job.format, label_of(job, result.endpoint), job.lr, id(job) in off), []).append(job)
    return [plots.CurveGroup(fmt, arm, arm + (f" lr={lr:g} (lr sensitivity)" if dashed else ""), tuple(jobs), dashed)
            for (fmt, arm, lr, dashed), jobs in sorted(groups.items(), key=lambda kv: (
                kv[0][3], rank(OPTIMIZER_ORDER, kv[0][1]), kv[0][2] or 0.0))]


REFERENCE_LINE = "reference"
"""The palette key of a ladder's reference line (drawn in every format's panel)."""


def ladder_curves(result: StudyResult) -> list[plots.CurveGroup]:
    """The failure-stage ladder's curves: per format of the family one line per rung in ladder order, and the
    reference cell's line (dashed) in each of those panels."""
    stages = result.endpoint.stages
    if stages is None:
        return []
    jobs = (*result.jobs, *result.ladder_jobs)
    reference = tuple(j for j in jobs if j.format == stages.reference_format and j.arm == stages.reference_arm)
    groups = []
    for fmt in result.formats:
        groups += [plots.CurveGroup(fmt, arm, arm, members) for arm in stages.arms
                   if (members := tuple(j for j in jobs if j.format == fmt and j.arm == arm))]
        if reference and any(g.panel == fmt for g in groups):
            groups.append(plots.CurveGroup(fmt, REFERENCE_LINE,
                                           f"{stages.reference_format} {stages.reference_arm} (reference)",
                                           reference, dashed=True))
    return groups


def scans_and_picks(cells: Sequence[Cell]) -> tuple[list[Cell], list[Job]]:
    """An undeclared sweep: per arm and context, the lr with the lowest mean final loss (its curve is shown) and
    the jobs of every arm that ran several lrs (the lr–loss figure)."""
    by_arm: dict[tuple, list[Cell]] = {}
    for c in cells:
        by_arm.setdefault(tuple((k, v) for k, v in c.key if k != "lr"), []).append(c)
    shown, scanned = [], []
    for members in by_arm.values():
        if len(members) == 1:
            shown.append(members[0])
            continue
        scanned += [j for c in members for j in c.jobs]
        best = min(members, key=lambda c: (c.loss_summary().mean is None, c.loss_summary().mean or 0.0))
        shown.append(best)
    order = {id(c): i for i, c in enumerate(cells)}
    return sorted(shown, key=lambda c: order[id(c)]), scanned


def write_report(sweep_dirs: Sequence[str | os.PathLike[str]], out_dir: str | os.PathLike[str] | None = None,
                 threshold: float = 0.0, command: str | None = None) -> Path:
    """Read the sweeps, write report.md and its figures into out_dir (default: the first sweep dir); its path."""
    sweep = load_sweeps(sweep_dirs)
    out = Path(out_dir) if out_dir is not None else sweep.roots[0]
    out.mkdir(parents=True, exist_ok=True)

    cells = group_cells(sweep.jobs)
    main_cells = [c for c in cells if c["stage"] is None]  # stage is set for failure_stage jobs only
    stage_cells = [c for c in cells if c["stage"] is not None]
    benefits = ulp_benefits(cells)
    attributions = attribute_failures(sweep.jobs, threshold)
    thresholds = stability_thresholds(cells)
    diverged = sweep.by_state("diverged")
    not_completed = [j for j in sweep.jobs if j.state != "completed"]
    diag_names = tables.diagnostic_names(cells)
    rule = same_grid_rule(sweep.jobs)
    studies = [(next((j.get("experiment") for j in js if j.get("experiment")), None), analyse(ep, js, rule))
               for ep, js in declared_endpoints(sweep.jobs)]
    results = [result for _, result in studies]
    in_studies = {id(j) for r in results for j in (*r.jobs, *r.ladder_jobs)}
    outside_studies = [j for j in sweep.jobs if id(j) not in in_studies]
    near = [neighbours(r, outside_studies) for r in results]
    bad_declarations = endpoint_problems(sweep.jobs)
    speed = speeds(main_cells or cells)
    palette = plots.arm_palette([j.arm for j in sweep.jobs])

    if results:  # the evaluation's curves; the tuning runs go to the lr–loss figure
        val_png = plots.plot_curves(study_curves(results), out / "val_loss.png", palette,
                                    title="Validation loss of the evaluation", log_y=True)
        declared = [j for r in results for j in r.declared_jobs]
        scans = [j for runs in tuning_runs(declared, outside_studies).values() for js in runs.values() for j in js]
        picks = {(j.format, j.arm): j.lr for j in declared if j.lr is not None}
        ring = "lr the evaluation used"
        if not declared:  # no evaluation yet: the tuning stages' records alone, each scan's pick ringed
            scans = records.tuning_jobs(outside_studies)
            picks = {(c.format, c.arm): c.pick for c in records.tuning(scans) if c.pick is not None}
            ring = "the pick, lowest mean (no evaluation run yet)"
    else:
        shown, scans = scans_and_picks(main_cells)
        val_png = plots.plot_val_loss(shown, out / "val_loss.png", palette=palette)
        picks, ring = {}, "lr the evaluation used"
    lr_png = plots.plot_lr_scan(scans, out / "lr_loss.png", palette, picks, ring=ring)
    stage_val_png = plots.plot_val_loss(stage_cells, out / "val_loss_failure_stage.png",
                                        title="Validation loss per failure stage")
    benefit_png = plots.plot_benefit(benefits, out / "benefit.png")
    diag_png = plots.plot_diagnostics(main_cells or cells, diag_names, out / "diagnostics.png")
    grid_png, grid_note = plots.plot_format_grids([c["format"] for c in cells], out / "format_grids.png")
    # failure_stage runs differ by stage, which the parallel axes do not show; keep them out unless alone
    parallel_png = plots.plot_parallel([j for c in (main_cells or cells) for j in c.jobs],
                                       out / "parallel_coordinates.png")

    parts = [
        "# AltGrad sweep report",
        "",
        "Sweeps: " + ", ".join(f"`{r}`" for r in sweep.roots) + (f"  \nCommand: `{command}`" if command else ""),
        "",
        "## Findings",
        "",
        findings(sweep, cells, benefits, attributions, threshold, studies, rule, near),
        "",
    ]
    study_records = provenance.applies(sweep.jobs)  # a study's records (arms, data files): study 2 onwards
    if study_records:
        tuned = records.tuning(sweep.jobs, [j for r in results for j in r.declared_jobs])
        horizons = sorted({r.endpoint.horizon for r in results if r.endpoint.horizon is not None})
        pilot = records.pilot_rows(sweep.jobs, horizons)
        power = records.read_power(sweep.roots)
        margins = sorted({r.endpoint.tie_margin for r in results if r.endpoint.label == "arm"})
        extra = records.horizon_lines(results) + records.tuning_lines(tuned, margins[0] if margins else None)
        extra += [line for r in results if r.endpoint.label == "arm" for line in records.mechanism_lines(r)]
        extra += [line for r in results if r.endpoint.label == "arm" for line in outliers.finding_lines(r)]
        if any(r.endpoint.label == "arm" for r in results) or power is not None:
            extra.append(records.power_line(power))
            extra += [line for r in results if r.endpoint.label == "arm"
                      for line in [records.power_check_line(power, r)] if line]
        parts[-2] += "".join(f"\n- {line}" for line in extra)
    caveats = caveat_lines(sweep.jobs, [j for result in results for j in result.declared_jobs], results)
    if caveats:
        parts += ["### Caveats", "", "\n".join(f"- {line}" for line in caveats), ""]
    for k, (experiment, result) in enumerate(studies):
        mantissa_png = plots.plot_study_by_mantissa(result, out / ("study_by_mantissa.png" if k == 0 else
                                                                  f"study_by_mantissa_{k}.png"), palette)
        parts += [f"## Declared endpoint{f' ({experiment})' if experiment else ''}", "",
                  result.endpoint.describe() + ".", "",
                  ("Δ per seed = treatment − reference; a diverged or never-learning run enters with "
                   f"{result.endpoint.failure_value.replace('_', ' ')}; crashed or missing runs leave their seed "
                   "unpaired. Verdicts: `benefit`/`harm` when the adjusted p < α, `tie` when the adjusted "
                   "equivalence (TOST) p < α, `not established` otherwise: a statement about the evidence, never "
                   "evidence of no difference. `seeds a TOST needs`: the seed pairs for 80 % power to show a tie when "
                   "the true Δ is 0, from the paired SD, at the level each test is sure to get under the correction "
                   f"({result.single_test_level:.3g}); `underpowered` when fewer ran."), "",
                  tables.study_table(result), ""]
        if result.secondary:
            parts += [(f"Secondary family (the why, by intervention; {result.endpoint.correction} over its "
                       f"{len(result.secondary)} tests, apart from the primary family; an interaction Δ(first) − "
                       "Δ(second) is the per-seed difference of two contrasts' Δ in one format):"), "",
                      tables.study_table(result, result.secondary), ""]
        if result.controls:
            parts += [(f"Controls (expected ≈ 0): a `tie` only when the {result.endpoint.correction}-corrected "
                       f"equivalence test (TOST ±{result.endpoint.tie_margin:g}) rejects over the "
                       f"{len(result.controls)} control tests; a control never claims a difference:"), "",
                      tables.study_table(result, result.controls), ""]
        lad = ladder(result)
        if lad is not None:
            ladder_png = plots.plot_ladder(lad, out / ("failure_ladder.png" if k == 0 else f"failure_ladder_{k}.png"))
            curves_png = plots.plot_curves(
                ladder_curves(result), out / ("failure_ladder_curves.png" if k == 0 else
                                              f"failure_ladder_curves_{k}.png"),
                {**palette, REFERENCE_LINE: "0.35"}, title="Validation loss per failure stage", log_y=True)
            parts += [(f"Failure stages as declared: each stage − {lad.reference_format} {lad.reference_arm} "
                       f"({lad.reference_seeds} seeds), paired by seed; a stage fails when Δ > {lad.margin:g} by the "
                       "one-sided paired t-test, Holm over every stage of every format; a failed run enters at its "
                       "initial loss. The step from the stage before is in the next-to-last column."), "",
                      tables.ladder_table(lad), "",
                      _figure(ladder_png, "Δ per failure stage and format", "No failure stage paired with its "
                              "reference yet."), "",
                      (f"The rungs' validation loss per format (line: mean over seeds, band: min–max over seeds, so "
                       f"one seed's stall shows as a band; dashed grey: the reference, {lad.reference_format} "
                       f"{lad.reference_arm}):"), "",
                      _figure(curves_png, "validation loss per ladder rung", "No rung logged val/loss."), ""]
        rec = recovery(result)
        if result.endpoint.recovery is not None and result.endpoint.label == "arm":
            parts += [(f"Recovery: each arm − {result.endpoint.recovery.reference} (the same forward grid, float32 "
                       "master weights) per format, paired by seed: what storing the weights on the grid costs; "
                       f"`recovers` when the Holm-corrected TOST ±{result.endpoint.tie_margin:g} rejects."), "",
                      tables.recovery_table(rec, result.endpoint.recovery.reference, result.endpoint.tie_margin)
                      if rec else "_No recovery arm has runs yet._", ""]
        parts += ["Ranking on the primary contrast (a format benefits most only when it has a `benefit` verdict "
                  "and every interval in the last column lies below zero):", "",
                  tables.ranking_table(result), "",
                  _figure(mantissa_png, "Δ and updates below half a ULP against mantissa bits",
                          "No format with a Δ and a known mantissa width."), ""]
        spread = outliers.spreads(result) if result.endpoint.label == "arm" else []
        if spread:
            confidence = 1 - result.endpoint.alpha
            parts += ["### Outlying runs", "",
                      ("An undeclared, descriptive look, outside the families and their correction: the declared "
                       "tables above are what to quote. A run is *outlying* when its final loss is more than the tie "
                       f"margin (±{result.endpoint.tie_margin:g}) above its cell's median and its modified z-score "
                       f"0.6745 · (x − median) / MAD exceeds {outliers.Z_LIMIT:g} (Iglewicz & Hoaglin). It is meant "
                       "for a seed left on a plateau while its cell's others learn, and flags any run far above its "
                       "cell, a diverged one too. A paired mean over a handful of seeds is "
                       "ruled by such a run, so each comparison that pairs one is shown again without those seeds."),
                      "", tables.outlier_table(spread), ""]
            cut = outliers.trimmed(result, spread)
            if cut:
                parts += [tables.trimmed_table(cut, confidence), ""]
        if near[k]:
            parts += ["### Sensitivity to the reference's lr", "",
                      ("Each declared contrast with its reference arm at the lrs next to the declared one, wherever "
                       "records of the same configuration exist: `evaluation` rows are runs of the declaration at an "
                       "lr set by hand, on the evaluation seeds; `tuning` rows the lr scan's runs on the tuning seeds "
                       "(the declared lr and its nearest scanned neighbours; one seed gives no CI). Δ = the treatment "
                       "at its declared lr − this reference, paired by seed; descriptive, outside the declared "
                       "family and its correction."), "",
                      tables.sensitivity_table(result, near[k]), ""]
    if bad_declarations:
        parts += ["Invalid endpoint declarations (ignored):", ""] + [f"- {b}" for b in bad_declarations] + [""]
    parts += [
        "## ULP-aware benefit (Δ final val loss vs AdamW, paired by seed)",
        "",
        ("Δ = optimizer − AdamW in the same format, storage and context, over the seeds both completed; negative "
         "means the ULP-aware update helps. Marks (uncorrected, per row): `**` p < 0.01, `*` p < 0.05 (the 95% "
         "CI excludes 0), `n.s.` not significant, `n<2` fewer than two seed pairs. Each optimizer's best lr is "
         "picked on these same seeds, and diverged runs are left out here: the Findings and the declared endpoint "
         "are what to quote."),
        "",
        tables.benefit_table(benefits) if benefits else "_No format has both AdamW and another optimizer._",
        "",
        _figure(benefit_png, "Δ final val loss vs AdamW", "No Δ to plot."),
        "",
        "## Validation loss",
        "",
        _figure(val_png, "validation loss per format",
                "No evaluation run of the declared study has finished yet." if results
                else "No job logged val/loss in metrics.csv."),
        "",
        ("One panel per format, one colour per arm (the same in every figure); "
         + ("the declared studies' evaluation runs, dashed: runs at an lr set by hand (lr sensitivity). "
            if results else "each arm at its lowest-loss lr when it ran several. ")
         + "The lr scans are in `lr_loss.png`:"),
        "",
        _figure(lr_png, "final validation loss against lr", "No arm ran several learning rates."),
        "",
        ("Final and best validation loss per configuration: mean ± std over seeds (completed runs only) and the "
         "95% Student-t confidence interval of the mean."),
        "",
        tables.cell_table(cells) if cells else "_No job has a summary._",
        "",
    ]
    if thresholds:
        parts += ["## Stability threshold (learning-rate scan)", "", tables.stability_table(thresholds), ""]
    parts += ["## Divergences", "",
              tables.divergence_table(diverged) if diverged else "_No job diverged._", ""]
    parts += ["## Failure-stage attribution", ""]
    if attributions:
        parts += [("A stage fails when any seed diverged, or when its final loss is above fp32's (same optimizer, "
                   "paired by seed) beyond seed noise: the paired t-test, Holm-corrected over every stage of every "
                   "format, at α = 0.05" + (f", and more than {100 * threshold:g}% above fp32" if threshold > 0 else "")
                   + ". The step from the stage before is shown with its paired 95% CI."), "",
                  tables.stage_summary_table(attributions), "", tables.stage_table(attributions), "",
                  _figure(stage_val_png, "validation loss per failure stage", "No failure_stage job logged val/loss."),
                  ""]
    elif any(r.endpoint.stages is not None and r.endpoint.label == "arm" for r in results):
        parts += ["_The declared failure-stage ladder is analysed in its declared endpoint's section above._", ""]
    else:
        parts += ["_No failure_stage jobs in these sweeps._", ""]
    parts += ["## Why: update stalls, flips, gradient fidelity, effective bits", ""]
    if diag_names:
        parts += [tables.diagnostics_table(cells), "",
                  _figure(diag_png, "diagnostics per format", "No diagnostics to plot."), ""]
    else:
        parts += ["_No diagnostics in the summaries._", ""]
    if has_updates(cells) or speed:
        target = next(iter(speed.values())).target if speed else None
        parts += ["### Update sizes in ULPs and speed", "",
                  ("Per run (UpdateCallback, on sampled steps): quantiles of |Δw|/ULP(w) on the weight's grid, the "
                   "share of updates below half a ULP (lost to round-to-nearest on a stored grid), and the ratio of "
                   "median |Δw|/|w| in the largest |w| decile to the smallest (1: a step ∝ |w|; ≪ 1: a step "
                   "that ignores |w|); means over runs. "
                   + (f"Steps to target: the first validation step with loss ≤ {target.factor:g} × the mean final "
                      f"loss of {target.reference} ({target.value:.4f}); median over the runs that reached it."
                      if target is not None else "No fp32 or wide-reference AdamW run, so no speed target.")), "",
                  tables.mechanism_table(main_cells or cells, speed), ""]
    parts += ["Format value grids (every positive representable value):", "",
              _figure(grid_png, "format value grids", grid_note or "No format grid to draw."), ""]
    if grid_png is not None and grid_note:
        parts += [f"_{grid_note}_", ""]
    parts += ["## Configuration vs final loss", "",
              _figure(parallel_png, "parallel coordinates", "No run with a final loss or divergence."), ""]
    if study_records:
        parts += ["## Study records: pilot, tuning, mechanism", ""]
        if pilot:
            parts += ["The pilot's horizon table: each pilot run's validation loss at H and at "
                      f"{records.HORIZON_FACTOR}H (H: the declared horizon; none declared: a quarter of the run).", "",
                      records.pilot_table(pilot), ""]
        if tuned:
            parts += ["Tuning: the mean final validation loss over the tuning seeds at each scanned lr per format × "
                      "arm (failed: every seed diverged or crashed); the pick (the lr the evaluation ran, else the "
                      "lowest mean without a failed seed) and whether a scanned lr lies on each side of it.", "",
                      records.tuning_table(tuned), ""]
        parts += [records.power_line(power), ""]
        for r in results:
            if r.endpoint.label == "arm" and records.mechanism_by_arm(r):
                parts += [f"Is the mechanism active? Per arm and format, medians over runs (descriptive; horizon "
                          f"{r.endpoint.horizon}):", "", records.mechanism_table(r), ""]
    if provenance.applies(sweep.jobs):
        parts += ["## Provenance", "", "\n".join(f"- {line}" if not line.startswith("  ") else line
                                                 for line in provenance.provenance_lines(sweep.jobs)), ""]
    parts += ["## Jobs", "",
              f"{len(sweep.jobs)} job dirs found; {len(not_completed)} did not complete.", ""]
    if not_completed:
        parts += [tables.jobs_table(not_completed), ""]

    report = out / REPORT_NAME
    report.write_text("\n".join(parts))
    return report

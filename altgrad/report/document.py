"""Assemble report.md and its PNG figures from one or more sweep folders."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from altgrad.report import plots, tables
from altgrad.report.benefit import stability_thresholds, ulp_benefits
from altgrad.report.caveats import caveat_lines
from altgrad.report.cells import group_cells
from altgrad.report.findings import findings
from altgrad.report.load import Job, load_sweeps
from altgrad.report.mechanism import has_updates, speeds
from altgrad.report.stages import attribute_failures
from altgrad.report.study import SameGrid, analyse, declared_endpoints, endpoint_problems

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
    bad_declarations = endpoint_problems(sweep.jobs)
    speed = speeds(main_cells or cells)

    val_png = plots.plot_val_loss(main_cells, out / "val_loss.png")
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
        findings(sweep, cells, benefits, attributions, threshold, studies, rule),
        "",
    ]
    caveats = caveat_lines(sweep.jobs, [j for _, result in studies for j in result.jobs])
    if caveats:
        parts += ["### Caveats", "", "\n".join(f"- {line}" for line in caveats), ""]
    for k, (experiment, result) in enumerate(studies):
        mantissa_png = plots.plot_study_by_mantissa(result, out / ("study_by_mantissa.png" if k == 0 else
                                                                  f"study_by_mantissa_{k}.png"))
        parts += [f"## Declared endpoint{f' ({experiment})' if experiment else ''}", "",
                  result.endpoint.describe() + ".", "",
                  ("Δ per seed = treatment − reference; a diverged or never-learning run enters with "
                   f"{result.endpoint.failure_value.replace('_', ' ')}; crashed or missing runs leave their seed "
                   "unpaired. Verdicts: `benefit`/`harm` when the adjusted p < α, `tie` when the adjusted "
                   "equivalence (TOST) p < α, `not established` otherwise."), "",
                  tables.study_table(result), "",
                  "Ranking on the primary contrast (a format benefits most only when it has a `benefit` verdict "
                  "and every interval in the last column lies below zero):", "",
                  tables.ranking_table(result), "",
                  _figure(mantissa_png, "Δ and updates below half a ULP against mantissa bits",
                          "No format with a Δ and a known mantissa width."), ""]
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
        _figure(val_png, "validation loss per format", "No job logged val/loss in metrics.csv."),
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
    parts += ["## Jobs", "",
              f"{len(sweep.jobs)} job dirs found; {len(not_completed)} did not complete.", ""]
    if not_completed:
        parts += [tables.jobs_table(not_completed), ""]

    report = out / REPORT_NAME
    report.write_text("\n".join(parts))
    return report

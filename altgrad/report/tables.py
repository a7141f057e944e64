"""Markdown tables of the report: loss cells, ULP-aware benefit, divergences, failure stages, diagnostics, jobs."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from altgrad.report.benefit import Benefit, StabilityThreshold
from altgrad.report.cells import CONTEXT_FIELDS, Cell, describe, varying_fields
from altgrad.report.endpoint import Contrast
from altgrad.report.ladder import Ladder, Recovered
from altgrad.report.load import Job
from altgrad.report.outliers import CellSpread, Trimmed, delta_text
from altgrad.report.sensitivity import Neighbour
from altgrad.report.stages import FormatAttribution
from altgrad.report.stats import Summary, TTest, summarize
from altgrad.report.study import Comparison, StudyResult, sign_check

FIELD_TITLES = {"optimizer_label": "optimizer", "layer_map": "layer map", "lr": "lr"}


def titles(cells: Sequence[Cell], fields: Sequence[str]) -> list[str]:
    """Column titles of the cell fields; the label column is ``arm`` where the runs recorded study arms."""
    arms = any(j.summary.get("arm") for c in cells for j in c.jobs)
    return [("arm" if arms and f == "optimizer_label" else FIELD_TITLES.get(f, f)) for f in fields]
DIAGNOSTICS = ("mean_stall_ratio", "final_flip_rate", "mean_oscillation_rate", "min_grad_cosine",
               "mean_effective_bits")
"""The diagnostics every report shows first (summary.json ``diagnostics``); any others found follow."""
MECHANISM_KEYS = ("ulp_update_q10", "ulp_update_q50", "ulp_update_q90", "sub_half_ulp_share", "update_steps_sampled")
"""Shown in the mechanism table instead (with rel_update_d1 … d10)."""


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table; ``|`` and newlines inside cells are escaped."""
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def num(x: float | None, digits: int = 4, signed: bool = False) -> str:
    if x is None:
        return "—"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def sig(x: float | None, digits: int = 3) -> str:
    """``digits`` significant figures (diagnostics span 1e-7 … 1e2, fixed decimals would hide the small ones)."""
    return "—" if x is None else f"{x:.{digits}g}"


def mean_std(s: Summary, digits: int = 4) -> str:
    """``mean ± std`` (just the mean for one value, ``—`` for none)."""
    if s.mean is None:
        return "—"
    return num(s.mean, digits) if s.std is None else f"{num(s.mean, digits)} ± {num(s.std, digits)}"


def ci_text(s: Summary, digits: int = 4, signed: bool = False) -> str:
    ci = s.ci
    return "—" if ci is None else f"[{num(ci[0], digits, signed)}, {num(ci[1], digits, signed)}]"


def field_text(name: str, value: Any) -> str:
    if value is None:
        return "—"
    return f"{value:g}" if name == "lr" else str(value)


def cell_table(cells: Sequence[Cell]) -> str:
    """Final and best validation loss per cell: mean ± std over seeds and the 95% CI of the mean."""
    fields = varying_fields(cells)
    headers = titles(cells, fields) + [
        "completed/jobs", "diverged", "failed", "final val loss", "final 95% CI", "best val loss", "best 95% CI"]
    rows = []
    for c in cells:
        final, best = c.loss_summary("final"), c.loss_summary("best")
        rows.append([field_text(f, c[f]) for f in fields] + [
            f"{c.count('completed')}/{len(c.jobs)}", c.count("diverged"), c.count("failed"),
            mean_std(final), ci_text(final), mean_std(best), ci_text(best)])
    return markdown_table(headers, rows)


def benefit_table(benefits: Sequence[Benefit]) -> str:
    """Δ final loss (optimizer − AdamW) per format, paired by seed, with 95% CI, p-value and mark."""
    contexts = [b.treatment for b in benefits]
    fields = varying_fields(contexts, CONTEXT_FIELDS) + ["optimizer_label"]
    headers = titles(contexts, fields) + [
        "lr", "baseline", "pairs", "Δ final loss", "95% CI", "p", "mark", "diverged (opt/adamw)"]
    rows = []
    for b in benefits:
        base = describe({"optimizer_label": b.baseline["optimizer_label"], "lr": b.baseline["lr"]},
                        ("optimizer_label", "lr")) + _best_of(b.baseline_lrs)
        if b.baseline_fallback:
            base += " (fp32 master)"
        d = b.diff
        rows.append([field_text(f, b.treatment[f]) for f in fields] + [
            field_text("lr", b.treatment["lr"]) + _best_of(b.treatment_lrs), base, d.diff.n,
            num(d.diff.mean, signed=True), ci_text(d.diff, signed=True),
            "—" if d.p_value is None else f"{d.p_value:.3g}", d.mark,
            f"{b.treatment.count('diverged')}/{b.baseline.count('diverged')}"])
    return markdown_table(headers, rows)


def _best_of(n_lrs: int) -> str:
    """Marks an lr picked from a scan (the lowest mean final loss among n_lrs learning rates)."""
    return f" (best of {n_lrs} lrs)" if n_lrs > 1 else ""


def divergence_table(jobs: Sequence[Job]) -> str:
    """Every diverged job: where (step) and why (cause recorded by the divergence callback)."""
    rows = [[j.name, j.format, j.optimizer_label, j.storage, field_text("lr", j.lr), field_text("seed", j.seed),
             field_text("step", j.summary.get("diverged_at_step")), j.summary.get("divergence_cause") or "—"]
            for j in jobs]
    return markdown_table(["job", "format", "optimizer", "storage", "lr", "seed", "step", "cause"], rows)


def stage_summary_table(attributions: Sequence[FormatAttribution]) -> str:
    """Per format: the first stage that failed, and how."""
    rows = []
    for a in attributions:
        first = a.first_failure
        if first is None:
            what = "none of the stages run failed"
        elif first.verdict == "diverged":
            what = f"diverged in {first.n_diverged}/{len(first.jobs)} seeds"
        else:
            what = (f"loss {num(100 * (first.relative_change or 0.0), 1, signed=True)}% vs fp32, Holm p = "
                    f"{first.p_adjusted:.3g}")
        rows.append([a.format, a.optimizer_label, first.stage if first else "—", what,
                     ", ".join(s.stage for s in a.stages)])
    return markdown_table(["format", "optimizer", "first failing stage", "evidence", "stages run"], rows)


def _paired_text(t: TTest) -> str:
    ci = t.ci()
    if t.mean is None:
        return "—"
    return num(t.mean, signed=True) + ("" if ci is None else f" [{num(ci[0], signed=True)}, {num(ci[1], signed=True)}]")


def stage_table(attributions: Sequence[FormatAttribution]) -> str:
    """Every stage of every format: loss, divergences, paired Δ vs fp32 (tested) and vs the stage before."""
    rows = []
    for a in attributions:
        for s in a.stages:
            rows.append([a.format, a.optimizer_label, s.stage, len(s.jobs), s.n_diverged, s.n_failed,
                         mean_std(s.loss), mean_std(summarize([a.fp32_reference])) if a.fp32_seed_std is None
                         else f"{num(a.fp32_reference)} ± {num(a.fp32_seed_std)}",
                         "—" if s.relative_change is None else f"{100 * s.relative_change:+.1f}%",
                         _paired_text(s.vs_fp32), "—" if s.p_adjusted is None else f"{s.p_adjusted:.3g}",
                         _paired_text(s.vs_previous), s.verdict])
    return markdown_table(["format", "optimizer", "stage", "jobs", "diverged", "failed", "final val loss",
                           "fp32 (mean ± seed std)", "vs fp32", "paired Δ vs fp32 [95% CI]", "Holm p",
                           "paired Δ vs previous stage [95% CI]", "verdict"], rows)


def diagnostic_names(cells: Sequence[Cell]) -> list[str]:
    """DIAGNOSTICS first, then any other diagnostic found in the summaries, alphabetically."""
    found = {k for c in cells for j in c.jobs for k in j.diagnostics
             if not k.startswith("rel_update_d") and k not in MECHANISM_KEYS}
    return [d for d in DIAGNOSTICS if d in found] + sorted(found - set(DIAGNOSTICS))


def diagnostics_table(cells: Sequence[Cell]) -> str:
    """Mean of each run-level diagnostic per cell (over its seeds, diverged runs included)."""
    names = diagnostic_names(cells)
    fields = varying_fields(cells)
    headers = titles(cells, fields) + ["runs"] + list(names)
    rows = []
    for c in cells:
        values = [c.diagnostic_summary(n) for n in names]
        if all(v.n == 0 for v in values):
            continue
        rows.append([field_text(f, c[f]) for f in fields] + [len(c.jobs)] + [sig(v.mean) for v in values])
    return markdown_table(headers, rows)


def stability_table(thresholds: Sequence[StabilityThreshold]) -> str:
    """The lr scan's stability threshold: the largest lr with no diverged seed per format × optimizer."""
    cells = [t.context_cell for t in thresholds]
    fields = [f for f in varying_fields(cells) if f != "lr"]
    rows = [[field_text(f, t.context_cell[f]) for f in fields] + [
        ", ".join(f"{lr:g}" for lr in t.lrs), field_text("lr", t.largest_stable),
        field_text("lr", t.smallest_diverged)] for t in thresholds]
    return markdown_table([FIELD_TITLES.get(f, f) for f in fields] + [
        "lrs run", "largest lr without divergence", "smallest lr that diverged"], rows)


def jobs_table(jobs: Sequence[Job]) -> str:
    """Jobs that did not complete: what they were (summary or Hydra overrides) and what went wrong."""
    rows = []
    for j in jobs:
        what = describe({"format": j.format, "optimizer_label": j.optimizer_label, "storage": j.storage,
                         "lr": j.lr}, ("format", "optimizer_label", "storage", "lr"))
        if not j.summary and j.overrides:
            what = " ".join(j.overrides)
        rows.append([j.name, j.state, what, field_text("seed", j.seed), j.problem or "—"])
    return markdown_table(["job", "state", "configuration", "seed", "detail"], rows)


def contrast_title(contrast: Contrast) -> str:
    """A contrast as the tables name it: ``P1: manifold_sr − relative_sr`` when it was declared with a name."""
    return f"{contrast.label}: {contrast.name}" if contrast.label else contrast.name


def study_table(result: StudyResult, comparisons: Sequence[Comparison] | None = None) -> str:
    """Every test of one family of a declared study (default: the primary): Δ per contrast and format with its CI,
    raw and adjusted p, TOST, and the verdict; the declared sign beside the observed one where one was declared."""
    ep = result.endpoint
    comps = result.comparisons if comparisons is None else comparisons
    signed = any(c.contrast.expect != "none" or c.contrast.label for c in comps)
    conf = f"{100 * (1 - ep.alpha):g}% CI"
    rows = []
    for c in comps:
        t, r = c.treatment, c.reference
        lrs = "/".join(", ".join(f"{x:g}" for x in a.lrs) or "—" if a is not None else "—" for a in (t, r))
        fails = " / ".join(f"{a.n_failures} of {len(a.jobs)}" if a is not None else "—" for a in (t, r))
        ci = c.ci
        seeds = "—" if c.equivalence_seeds is None else (
            f"underpowered: needs ≈ {c.equivalence_seeds}" if c.underpowered else f"≈ {c.equivalence_seeds}")
        row = [contrast_title(c.contrast) if signed else c.contrast.name, c.format, lrs, len(c.deltas), fails,
               num(c.test.mean, signed=True),
               "—" if ci is None else f"[{num(ci[0], signed=True)}, {num(ci[1], signed=True)}]",
               "—" if c.test.p_value is None else f"{c.test.p_value:.3g}", f"{c.p_adjusted:.3g}",
               sig(c.paired_sd), f"{c.tost_adjusted:.3g}", seeds,
               c.verdict + (f" ({c.why_missing})" if c.why_missing else "")]
        if signed:
            row += [c.contrast.expect, sign_check(c)]
        rows.append(row)
    headers = ["contrast", "format", "lr (treatment/reference)", "seed pairs", "failures (treatment/reference)", "Δ",
               conf, "p", f"{ep.correction} p", "paired SD", f"TOST ±{ep.tie_margin:g} {ep.correction} p",
               "seeds a TOST needs", "verdict"]
    return markdown_table(headers + (["declared sign", "observed vs declared"] if signed else []), rows)


def sensitivity_table(result: StudyResult, near: Sequence[Neighbour]) -> str:
    """Each declared contrast with its reference at the lrs next to the declared one: Δ against the treatment at
    its declared lr, paired by seed, per source of seeds (evaluation or tuning)."""
    conf = 1 - result.endpoint.alpha
    declared = {(c.contrast, c.format): c for c in result.comparisons}
    rows = []
    for n in near:
        ci = n.delta.ci(conf)
        ref = [n.reference[s] for s in n.seeds]
        decl = declared.get((n.contrast, n.format))
        rows.append([n.contrast.name, n.format, n.source, ", ".join(map(str, _seed_span(n.seeds))),
                     f"{n.lr:g}" + (" (declared)" if n.is_declared else ""),
                     num(sum(ref) / len(ref)) if ref else "—", n.failures, len(n.seeds),
                     num(n.delta.mean, signed=True),
                     "—" if ci is None else f"[{num(ci[0], signed=True)}, {num(ci[1], signed=True)}]",
                     "—" if decl is None else num(decl.test.mean, signed=True)])
    return markdown_table(["contrast", "format", "seeds from", "seeds", "reference lr", "reference loss (mean)",
                           "reference failures", "seed pairs", "Δ vs treatment at its declared lr",
                           f"{100 * conf:g}% CI", "declared Δ (evaluation)"], rows)


def _seed_span(seeds: Sequence[int]) -> list[str]:
    """1, 2, 3, 4, 5 → ["1–5"]; gaps keep their own entries."""
    out: list[str] = []
    run: list[int] = []
    for s in sorted(seeds):
        if run and s == run[-1] + 1:
            run.append(s)
            continue
        if run:
            out.append(f"{run[0]}–{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
        run = [s]
    if run:
        out.append(f"{run[0]}–{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
    return out


def ranking_table(result: StudyResult) -> str:
    """Primary contrast per format: Δ, the seed-bootstrap probability of being top, the leader's paired lead (the
    lowest Δ is the "leader" only below zero: a harm is no lead, so there it is the "lowest")."""
    rk = result.ranking
    label = "leader" if rk.leads else "lowest"
    rows = []
    for c in result.of(result.endpoint.primary_contrast):
        versus = rk.versus.get(c.format)
        ci = versus.ci(rk.confidence) if versus is not None else None
        lead = (label if c.format == rk.leader else "—" if versus is None or versus.mean is None else
                f"{num(versus.mean, signed=True)} [{num(ci[0], signed=True)}, {num(ci[1], signed=True)}]"
                if ci is not None else num(versus.mean, signed=True))
        p_top = rk.top_probability.get(c.format)
        rows.append([c.format, num(c.test.mean, signed=True), "—" if p_top is None else f"{p_top:.2f}", lead,
                     c.verdict])
    return markdown_table(["format", f"Δ ({result.endpoint.primary_contrast.name})", "bootstrap P(top)",
                           f"Δ({label}) − Δ(format), {100 * rk.confidence:g}% CI", "verdict"], rows)


def mechanism_table(cells: Sequence[Cell], speeds: dict) -> str:
    """Per configuration: update size in ULPs, share below ½ ULP, |w|-decile step ratio, steps to the target."""
    from altgrad.report.mechanism import decile_ratio, update_summary

    fields = varying_fields(cells)  # lr too where it varies: an lr scan's rows are otherwise indistinguishable
    rows = []
    for c in cells:
        sp = speeds.get(c.key)
        values = [update_summary(c, k) for k in ("ulp_update_q10", "ulp_update_q50", "ulp_update_q90",
                                                 "sub_half_ulp_share")]
        if all(v is None for v in values) and sp is None:
            continue
        steps = "—" if sp is None else (f"{sp.median_steps:g} ({sp.reached}/{sp.runs})"
                                        if sp.median_steps is not None else f"never (0/{sp.runs})")
        rows.append([field_text(f, c[f]) for f in fields] + [sig(v) for v in values]
                    + [sig(decile_ratio(c)), steps])
    return markdown_table(titles(cells, fields) + [
        "|Δw|/ULP q10", "q50", "q90", "share < ½ ULP", "|Δw|/|w| top ÷ bottom |w| decile",
        "steps to target (reached/runs)"], rows)


def ladder_table(lad: Ladder) -> str:
    """Every rung of the declared failure-stage ladder: what its runs quantized, Δ vs the reference cell with its CI,
    the one-sided test of Δ > margin (raw and Holm), the increment over the rung before, and whether it fails."""
    rows = []
    for r in lad.rungs:
        rows.append([r.format, r.arm, "; ".join(r.ran) or "—", r.runs, r.failures, len(r.deltas),
                     _paired_text(r.vs_reference),
                     "—" if r.p_exceeds is None else f"{r.p_exceeds:.3g}", f"{r.p_adjusted:.3g}",
                     _paired_text(r.vs_previous), "fails" if r.fails else "—"])
    return markdown_table(["format", "stage (arm)", "ran (its layer maps)", "runs", "failures", "seed pairs",
                           f"Δ vs {lad.reference_format} {lad.reference_arm} [95% CI]", f"p (Δ > {lad.margin:g})",
                           "Holm p", "Δ vs previous stage [95% CI]", "verdict"], rows)


def recovery_table(rows: Sequence[Recovered], reference: str, margin: float) -> str:
    """Each recovery arm − the recovery reference per format: Δ with its CI, the difference and equivalence tests
    (Holm over the arms × formats) and the verdict."""
    out = []
    for r in rows:
        out.append([r.format, r.arm, len(r.deltas), _paired_text(r.test),
                    "—" if r.test.p_value is None else f"{r.test.p_value:.3g}", f"{r.p_adjusted:.3g}",
                    f"{r.tost_adjusted:.3g}", r.verdict])
    return markdown_table(["format", "arm", "seed pairs", f"Δ vs {reference} [95% CI]", "p", "Holm p",
                           f"TOST ±{margin:g} Holm p", "verdict"], out)


def outlier_table(cells: Sequence[CellSpread]) -> str:
    """Every cell of a declaration: its seeds, medians (at the end and halfway) and outlying runs with both losses
    (altgrad/report/outliers.py)."""
    mid = next((c.midway_step for c in cells if c.midway_step is not None), None)

    def run(c: CellSpread, seed: int) -> str:
        halfway = c.midway.get(seed)
        return f"seed {seed}: {num(c.values[seed], 3)}" + ("" if halfway is None else f" ({num(halfway, 3)})")

    rows = []
    for c in cells:
        row = [c.format, c.arm, c.part, len(c.values), num(c.median)]
        if mid is not None:
            row.append(num(statistics.median(c.midway.values())) if c.midway else "—")
        rows.append(row + [", ".join(run(c, s) for s in c.outlying) or "none"])
    headers = ["format", "arm", "part", "seeds", "median final loss"]
    if mid is not None:
        headers.append(f"median at step {mid}")
    return markdown_table(headers + ["outlying runs: final loss" + (f" (at step {mid})" if mid is not None else "")],
                          rows)


def trimmed_table(rows: Sequence[Trimmed], confidence: float) -> str:
    """Each paired comparison with and without the seeds that hold an outlying run."""
    body = [[r.name, r.format, r.full.n, delta_text(r.full, confidence), ", ".join(str(s) for s in r.dropped),
             r.kept.n, delta_text(r.kept, confidence)] for r in rows]
    conf = f"{100 * confidence:g}% CI"
    return markdown_table(["comparison", "format", "seed pairs", f"Δ [{conf}], all pairs", "seeds left out",
                           "pairs kept", f"Δ [{conf}] without them"], body)

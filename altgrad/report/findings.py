"""The generated "Findings": the answer stated from the computed numbers only, and plainly when they do not suffice.

A format "benefits" from a ULP-aware optimizer when the paired-seed 95% CI of Δ final val loss (optimizer − AdamW)
lies entirely below zero. The format that benefits most is the one with the most negative significant Δ; the text
says whether its lead over the runner-up is itself outside both CIs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from altgrad.report.benefit import Benefit
from altgrad.report.cells import Cell, describe, varying_fields
from altgrad.report.load import STATES, Sweep
from altgrad.report.order import FORMAT_ORDER, REFERENCE_FORMATS, rank
from altgrad.report.stages import FormatAttribution
from altgrad.report.stats import spearman
from altgrad.report.tables import ci_text, num, sig

STALL = "mean_stall_ratio"


def _labeller(benefits: Sequence[Benefit]) -> Callable[[Benefit], str]:
    """Names a comparison by optimizer, storage and whatever else varies among them (format is said apart)."""
    fields = ["optimizer_label"] + [f for f in varying_fields([b.treatment for b in benefits])
                                    if f not in ("format", "lr", "optimizer_label")]
    return lambda b: describe(dict(b.treatment.key), fields) + (" (vs fp32-master AdamW)"
                                                                 if b.baseline_fallback else "")


def _delta_text(b: Benefit) -> str:
    d = b.diff
    p = "" if d.p_value is None else f", p = {d.p_value:.3g}"
    return f"Δ = {num(d.diff.mean, signed=True)}, 95% CI {ci_text(d.diff, signed=True)}, {d.diff.n} seed pairs{p}"


def evidence_base(sweep: Sweep, cells: Sequence[Cell]) -> list[str]:
    counts = {s: len(sweep.by_state(s)) for s in STATES}
    lines = [f"Evidence: {len(sweep.jobs)} jobs — " + ", ".join(f"{counts[s]} {s}" for s in STATES if counts[s])
             + "."]
    thin = [c for c in cells if c.loss_summary().n < 2]
    if thin:
        lines.append(f"{len(thin)} of {len(cells)} configurations have fewer than 2 completed seeds, so no "
                     "confidence interval for them.")
    return lines


def answer(benefits: Sequence[Benefit]) -> list[str]:
    """Which format benefits most, or why that cannot be said."""
    _label = _labeller(benefits)
    references = [b for b in benefits if b.treatment["format"] in REFERENCE_FORMATS]
    benefits = [b for b in benefits if b.treatment["format"] not in REFERENCE_FORMATS]
    if not benefits:
        return [("**Insufficient evidence:** no 8-bit format has both AdamW and a ULP-aware optimizer (manifold, "
                 "grid, madam) in the same storage, so no benefit can be computed.")] + _reference_line(references)
    improving = sorted((b for b in benefits if b.improves), key=lambda b: b.diff.diff.mean)
    lines = []
    if improving:
        best = improving[0]
        base_mean = best.baseline.loss_summary().mean
        rel = f" ({100 * best.diff.diff.mean / base_mean:+.1f}% of AdamW's loss)" if base_mean else ""
        lines.append(f"**Answer: {best.treatment['format']} benefits most** — {_label(best)} lowers final val "
                     f"loss vs AdamW{rel}: {_delta_text(best)}.")
        rival = next((b for b in improving[1:] if b.treatment["format"] != best.treatment["format"]), None)
        if rival is not None:
            a, r = best.diff.diff.ci, rival.diff.diff.ci
            separated = a is not None and r is not None and a[1] < r[0]
            lines.append(f"Runner-up: {rival.treatment['format']} ({_label(rival)}, {_delta_text(rival)}); the "
                         + ("CIs do not overlap, so the ranking holds." if separated else
                            "CIs overlap, so the ranking between these two is not established."))
        others = sorted({b.treatment["format"] for b in improving}, key=lambda f: rank(FORMAT_ORDER, f))
        lines.append("Formats with a significant benefit from at least one ULP-aware optimizer: "
                     + ", ".join(others) + ".")
    else:
        few = sum(b.diff.p_value is None for b in benefits)
        point = min((b for b in benefits if b.diff.diff.mean is not None), key=lambda b: b.diff.diff.mean,
                    default=None)
        text = (f"**Insufficient evidence:** no ULP-aware optimizer lowers final val loss significantly vs AdamW in "
                f"any format ({len(benefits)} comparisons: {few} with fewer than 2 seed pairs, the others with "
                "95% CIs that reach zero or above).")
        if point is not None:
            text += (f" Largest point estimate, not significant: {point.treatment['format']} {_label(point)}, "
                     f"{_delta_text(point)}.")
        lines.append(text)
    worse = [b for b in benefits if b.worsens]
    if worse:
        lines.append("Significantly worse than AdamW: " + "; ".join(
            f"{b.treatment['format']} {_label(b)} (Δ = {num(b.diff.diff.mean, signed=True)})" for b in worse) + ".")
    for b in benefits:
        nt, nb = b.treatment.count("diverged"), b.baseline.count("diverged")
        if nt != nb:
            lines.append(f"Divergence differs in {b.treatment['format']}: {_label(b)} diverged in {nt}/"
                         f"{len(b.treatment.jobs)} runs, AdamW in {nb}/{len(b.baseline.jobs)} (diverged runs are "
                         "left out of Δ).")
    return lines + _reference_line(references)


def _reference_line(references: Sequence[Benefit]) -> list[str]:
    """The same comparison in the wide formats: a gain there too is not specific to coarse 8-bit grids."""
    if not references:
        return []
    label = _labeller(references)
    return ["For comparison, in the reference formats: " + "; ".join(
        f"{b.treatment['format']} {label(b)} Δ = {num(b.diff.diff.mean, signed=True)} ({b.diff.mark})"
        for b in references) + " — a gain there is not specific to an 8-bit grid."]


def failure_lines(attributions: Sequence[FormatAttribution], threshold: float) -> list[str]:
    if not attributions:
        return ["No failure_stage jobs in this sweep, so failure stages are not attributed."]
    lines = []
    fine = []
    for a in attributions:
        first = a.first_failure
        if first is None:
            fine.append(f"{a.format} ({a.optimizer_label})")
            continue
        how = (f"diverged in {first.n_diverged}/{len(first.jobs)} seeds" if first.verdict == "diverged" else
               f"final loss {100 * (first.relative_change or 0.0):+.1f}% vs the previous stage")
        lines.append(f"{a.format} ({a.optimizer_label}) first fails at **{first.stage}**: {how}.")
    if fine:
        lines.append(f"No stage failed (no divergence, loss within {100 * threshold:g}% of the previous stage) "
                     "for: " + ", ".join(fine) + ".")
    return lines


def why_lines(benefits: Sequence[Benefit], cells: Sequence[Cell]) -> list[str]:
    """Stall/flip evidence: does AdamW's stall ratio in a format go with the benefit ULP-aware updates bring?"""
    if not any(j.diagnostics for c in cells for j in c.jobs):
        return ["No diagnostics were recorded in the summaries, so the sweep cannot show why."]
    lines = []
    _label = _labeller(benefits)
    best_per_format: dict[str, Benefit] = {}
    for b in benefits:
        if b.diff.diff.mean is None:
            continue
        f = b.treatment["format"]
        if f not in best_per_format or b.diff.diff.mean < best_per_format[f].diff.diff.mean:
            best_per_format[f] = b
    pairs = [(b.baseline.diagnostic_summary(STALL).mean, b.diff.diff.mean) for b in best_per_format.values()]
    pairs = [(s, d) for s, d in pairs if s is not None]
    corr = spearman([s for s, _ in pairs], [d for _, d in pairs])
    if corr is None:
        lines.append(f"Too few formats with both an AdamW stall ratio and a Δ ({len(pairs)}; 4 needed, with "
                     "varying values) to relate stalling to the benefit.")
    else:
        rho, p = corr
        lines.append(f"Across {len(pairs)} formats, Spearman ρ between AdamW's mean stall ratio and the best Δ is "
                     f"{rho:+.2f} (p = {p:.3g}); negative ρ means formats whose AdamW updates stall more gain more "
                     "from ULP-aware updates" + ("." if p < 0.05 else ", but here it is not significant."))
    for f in sorted(best_per_format, key=lambda f: rank(FORMAT_ORDER, f)):
        b = best_per_format[f]
        if not b.improves:
            continue
        parts = []
        for name in (STALL, "final_flip_rate", "mean_oscillation_rate", "mean_effective_bits"):
            base, treat = b.baseline.diagnostic_summary(name).mean, b.treatment.diagnostic_summary(name).mean
            if base is not None or treat is not None:
                parts.append(f"{name} {sig(base)} (AdamW) → {sig(treat)}")
        if parts:
            lines.append(f"{f}, {_label(b)}: " + "; ".join(parts) + ".")
    return lines


def findings(sweep: Sweep, cells: Sequence[Cell], benefits: Sequence[Benefit],
             attributions: Sequence[FormatAttribution], threshold: float) -> str:
    """The Findings section body (markdown bullets)."""
    lines = (evidence_base(sweep, cells) + answer(benefits) + failure_lines(attributions, threshold)
             + why_lines(benefits, cells))
    return "\n".join(f"- {line}" for line in lines)

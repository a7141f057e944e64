"""The generated "Findings": the answer stated from the computed numbers only, and plainly when they do not suffice.

A study that declares its endpoint (``endpoint:`` in the experiment file, see altgrad/report/endpoint.py) is answered
from that declaration only (altgrad/report/study.py): a benefit, harm or tie is stated only when it survives the
declared correction over the declared family, "format A benefits most" only when A's paired CI of Δ(A) − Δ(B) lies
below zero against every other format, and everything else is said to be "not established". Sweeps without a
declaration get an exploratory answer: every comparison Holm-corrected together, and no ranking.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from altgrad.report.benefit import Benefit
from altgrad.report.cells import Cell, describe, varying_fields
from altgrad.report.load import STATES, Sweep
from altgrad.report.order import FORMAT_ORDER, REFERENCE_FORMATS, mantissa_bits, rank
from altgrad.report.stages import FormatAttribution
from altgrad.report.stats import holm, spearman
from altgrad.report.study import Arm, SameGrid, StudyResult, grid_classes
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


def _holm_marks(benefits: Sequence[Benefit]) -> dict[int, float]:
    """Holm-adjusted p over every 8-bit comparison shown (an undeclared sweep's family is all of them)."""
    adjusted = holm([b.diff.p_value for b in benefits])
    return {id(b): p for b, p in zip(benefits, adjusted)}


def answer(benefits: Sequence[Benefit], alpha: float = 0.05, same_grid: SameGrid | None = None) -> list[str]:
    """An undeclared sweep's answer: exploratory, Holm-corrected over all its comparisons, and never a ranking.
    Formats that share a grid are one arm: only the first in report order enters the family."""
    _label = _labeller(benefits)
    references = [b for b in benefits if b.treatment["format"] in REFERENCE_FORMATS]
    benefits = [b for b in benefits if b.treatment["format"] not in REFERENCE_FORMATS]
    if not benefits:
        return [("**Not established:** no 8-bit format has both AdamW and a ULP-aware optimizer (manifold, "
                 "grid, madam) in the same storage, so no benefit can be computed.")] + _reference_line(references)
    classes = {r: m for r, m in grid_classes([b.treatment["format"] for b in benefits], same_grid).items()
               if len(m) > 1}
    merged_lines = [f"{', '.join(m)} give the same grid under the runs' scaling: one arm, counted once (as {r}); "
                    "the other rows repeat it and are not independent evidence." for r, m in classes.items()]
    duplicates = {f for m in classes.values() for f in m[1:]}
    benefits = [b for b in benefits if b.treatment["format"] not in duplicates]
    adjusted = _holm_marks(benefits)
    lines = [f"Exploratory: these sweeps declare no primary endpoint (an `endpoint:` in the experiment file), so "
             f"every one of the {len(benefits)} 8-bit comparisons below is one family, Holm-corrected at "
             f"α = {alpha:g}, and no ranking of formats is claimed."] + merged_lines
    improving = sorted((b for b in benefits if adjusted[id(b)] < alpha and (b.diff.diff.mean or 0.0) < 0),
                       key=lambda b: b.diff.diff.mean)
    if improving:
        lines.append("Lower final val loss than AdamW after Holm correction: " + "; ".join(
            f"{b.treatment['format']} {_label(b)} ({_delta_text(b)}, Holm p = {adjusted[id(b)]:.3g})"
            for b in improving) + ".")
        lines.append("Which format benefits most: **not established** (no declared endpoint and contrasts).")
    else:
        few = sum(b.diff.p_value is None for b in benefits)
        point = min((b for b in benefits if b.diff.diff.mean is not None), key=lambda b: b.diff.diff.mean,
                    default=None)
        text = (f"**Not established:** no ULP-aware optimizer lowers final val loss vs AdamW in any format after "
                f"Holm correction ({len(benefits)} comparisons: {few} with fewer than 2 seed pairs).")
        if point is not None:
            text += (f" Largest point estimate, not established: {point.treatment['format']} {_label(point)}, "
                     f"{_delta_text(point)}.")
        lines.append(text)
    worse = [b for b in benefits if adjusted[id(b)] < alpha and (b.diff.diff.mean or 0.0) > 0]
    if worse:
        lines.append("Worse than AdamW after Holm correction: " + "; ".join(
            f"{b.treatment['format']} {_label(b)} (Δ = {num(b.diff.diff.mean, signed=True)}, Holm p = "
            f"{adjusted[id(b)]:.3g})" for b in worse) + ".")
    for b in benefits:
        nt, nb = b.treatment.count("diverged"), b.baseline.count("diverged")
        if nt != nb:
            lines.append(f"Divergence differs in {b.treatment['format']}: {_label(b)} diverged in {nt}/"
                         f"{len(b.treatment.jobs)} runs, AdamW in {nb}/{len(b.baseline.jobs)} (without a declared "
                         "endpoint, diverged runs are left out of this Δ; declare one to count them as failures).")
    return lines + _reference_line(references)


def _reference_line(references: Sequence[Benefit]) -> list[str]:
    """The same comparison in the wide formats: a gain there too is not specific to coarse 8-bit grids."""
    if not references:
        return []
    label = _labeller(references)
    return ["For comparison, in the reference formats: " + "; ".join(
        f"{b.treatment['format']} {label(b)} Δ = {num(b.diff.diff.mean, signed=True)} ({b.diff.mark})"
        for b in references) + " — a gain there is not specific to an 8-bit grid."]


def failure_lines(attributions: Sequence[FormatAttribution], threshold: float = 0.0) -> list[str]:
    if not attributions:
        return ["No failure_stage jobs in this sweep, so failure stages are not attributed."]
    lines = []
    fine = []
    for a in attributions:
        first = a.first_failure
        if first is None:
            fine.append(f"{a.format} ({a.optimizer_label})")
            continue
        if first.verdict == "diverged":
            how = f"diverged in {first.n_diverged}/{len(first.jobs)} seeds"
        else:
            ci = first.vs_fp32.ci()
            how = (f"final loss {100 * (first.relative_change or 0.0):+.1f}% vs fp32 (paired Δ = "
                   f"{first.vs_fp32.mean:+.4f}, 95% CI {_ci(ci)}, Holm p = {first.p_adjusted:.3g})")
        lines.append(f"{a.format} ({a.optimizer_label}) first fails at **{first.stage}**: {how}.")
    if fine:
        extra = f" and more than {100 * threshold:g}% above it" if threshold > 0 else ""
        lines.append("No stage failed (no divergence, and no loss above fp32 beyond seed noise after Holm "
                     f"correction{extra}) for: " + ", ".join(fine) + ".")
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
                     f"{rho:+.2f} (exact permutation p = {p:.3g}); negative ρ means formats whose AdamW updates stall "
                     "more gain more from ULP-aware updates" + ("." if p < 0.05 else
                                                                ", but here no association is established."))
    for f in sorted(best_per_format, key=lambda f: rank(FORMAT_ORDER, f)):
        b = best_per_format[f]
        parts = []
        for name in (STALL, "final_flip_rate", "mean_oscillation_rate", "mean_effective_bits"):
            base, treat = b.baseline.diagnostic_summary(name).mean, b.treatment.diagnostic_summary(name).mean
            if base is not None or treat is not None:
                parts.append(f"{name} {sig(base)} (AdamW) → {sig(treat)}")
        if parts:
            lines.append(f"{f}, {_label(b)} (Δ = {num(b.diff.diff.mean, signed=True)}): " + "; ".join(parts) + ".")
    return lines


MECHANISM = (("sub_half_ulp_share", "share of updates < ½ ULP"), ("ulp_update_q50", "median |Δw|/ULP"),
             (STALL, "stall ratio"), ("final_flip_rate", "final flip rate"),
             ("min_grad_cosine", "min gradient cosine"))
"""The mechanism diagnostics a declared study's "why" reads per arm (median over its seeds), with their names."""


def _arm_median(arm: Arm | None, name: str) -> float | None:
    values = [v for j in (arm.jobs if arm is not None else ()) if isinstance(v := j.diagnostics.get(name), float)
              and math.isfinite(v)]
    return statistics.median(values) if values else None


def study_why_lines(result: StudyResult) -> list[str]:
    """A declared study's "why", from its own runs: does the primary contrast's Δ go with how much of the
    reference arm's update falls below half a ULP (or stalls), per format? Exploratory: one point per format, exact
    permutation p, outside the declared family and its correction."""
    primary = result.endpoint.primary_contrast
    comps = [c for c in (*result.of(primary), *(c for c in result.outside if c.contrast == primary))
             if c.test.mean is not None]
    if not comps:
        return []
    if not any(_arm_median(c.reference, name) is not None for c in comps for name, _ in MECHANISM):
        return ["No mechanism diagnostics were recorded in the study's summaries, so it cannot show why."]
    lines = []
    ref = primary.reference
    family = [c for c in comps if c.format in result.formats]
    for name, label in MECHANISM[:3]:
        pairs = [(m, c.test.mean) for c in family if (m := _arm_median(c.reference, name)) is not None]
        corr = spearman([m for m, _ in pairs], [d for _, d in pairs])
        if corr is not None:
            rho, p = corr
            lines.append(f"Why (exploratory, outside the declared family): across {len(pairs)} formats, Spearman ρ "
                         f"between {ref}'s {label} and Δ({primary.name}) = {rho:+.2f}, exact permutation p = "
                         f"{p:.3g} (negative ρ: the higher {ref}'s {label}, the more the treatment gains)"
                         + (" — an association at α." if p < result.endpoint.alpha else
                            " — no association established."))
    for c in sorted(comps, key=lambda c: rank(FORMAT_ORDER, c.format)):
        parts = []
        for name, label in MECHANISM:
            base, treat = _arm_median(c.reference, name), _arm_median(c.treatment, name)
            if base is not None or treat is not None:
                parts.append(f"{label} {sig(base)} → {sig(treat)}")
        if parts:
            lines.append(f"{c.format} (Δ = {c.test.mean:+.4f}), {ref} → {primary.treatment}, median over seeds: "
                         + "; ".join(parts) + ".")
    return lines


def findings(sweep: Sweep, cells: Sequence[Cell], benefits: Sequence[Benefit],
             attributions: Sequence[FormatAttribution], threshold: float = 0.0,
             studies: Sequence[tuple[str | None, StudyResult]] = (), same_grid: SameGrid | None = None) -> str:
    """The Findings section body (markdown bullets): the declared studies' answers when there are any, else the
    exploratory, Holm-corrected one."""
    lines = evidence_base(sweep, cells)
    if studies:  # the why from each declared study's own runs (tuning runs elsewhere in the sweeps stay out)
        for experiment, result in studies:
            lines += study_lines(result, experiment) + study_why_lines(result)
        lines += failure_lines(attributions, threshold)
    else:
        lines += answer(benefits, same_grid=same_grid) + failure_lines(attributions, threshold)
        lines += why_lines(benefits, cells)
    return "\n".join(f"- {line}" for line in lines)


def _ci(ci: tuple[float, float] | None) -> str:
    return "—" if ci is None else f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


def study_lines(result: StudyResult, experiment: str | None = None) -> list[str]:
    """The answer of a declared study: only what survives its declared correction; "not established" otherwise."""
    ep = result.endpoint
    conf = f"{100 * (1 - ep.alpha):g}%"
    n_tests = len(result.comparisons)
    lines = [f"Declared endpoint{f' ({experiment})' if experiment else ''}, read from the jobs' saved config: "
             f"{ep.describe()}. Family: {len(ep.contrasts)} contrast(s) × {len(result.formats)} format(s) = "
             f"{n_tests} tests; every claim below survives the {ep.correction} correction over all of them."]
    for rep, members in result.merged.items():
        lines.append(f"{', '.join(members)} give the same grid under the runs' scaling: analysed as one arm "
                     f"({rep}), not as separate formats.")
    if result.missing_formats:
        lines.append("Declared but not run (counted in the family with p = 1): "
                     + ", ".join(result.missing_formats) + ".")
    primary = ep.primary_contrast
    rk = result.ranking
    by_format = {c.format: c for c in result.of(primary)}
    if rk.winner is not None:
        c = by_format[rk.winner]
        against = "; ".join(f"vs {f} {_ci(v.ci(rk.confidence))}" for f, v in rk.versus.items())
        lines.append(f"**Answer: {rk.winner} benefits most** from {primary.name}: Δ = {c.test.mean:+.4f}, "
                     f"{conf} CI {_ci(c.ci)}, {len(c.deltas)} seed pairs, adjusted p = {c.p_adjusted:.3g}; its Δ "
                     f"is below every other format's (paired {conf} CI of the difference in Δ: {against}); seed "
                     f"bootstrap P(top) = {rk.top_probability.get(rk.winner, float('nan')):.2f}.")
    else:
        text = "Which format benefits most: **not established**."
        if rk.leader is not None:
            c = by_format[rk.leader]
            if c.verdict != "benefit":
                reason = f"its own Δ does not survive the correction (adjusted p = {c.p_adjusted:.3g})"
            else:
                close = [f"{f} {_ci(v.ci(rk.confidence))}" for f, v in rk.versus.items()
                         if (ci := v.ci(rk.confidence)) is None or ci[1] >= 0]
                reason = ("its lead is within the paired CI of the difference in Δ against " + ", ".join(close)
                          if close else "no other format to compare with")
            p_top = rk.top_probability.get(rk.leader)
            text += (f" Point-estimate leader on {primary.name}: {rk.leader} (Δ = {c.test.mean:+.4f}, {conf} CI "
                     f"{_ci(c.ci)}" + (f", bootstrap P(top) = {p_top:.2f}" if p_top is not None else "")
                     + f"), but {reason}.")
        lines.append(text)
    for contrast in ep.contrasts:
        comps = result.of(contrast)
        parts = []
        for verdict in ("benefit", "harm", "tie"):
            hit = [c for c in comps if c.verdict == verdict]
            if hit:
                what = {"benefit": "lower loss (treatment helps)", "harm": "higher loss (treatment hurts)",
                        "tie": f"equivalent within ±{ep.tie_margin:g} (TOST)"}[verdict]
                parts.append(f"{what} in " + ", ".join(
                    f"{c.format} (Δ = {c.test.mean:+.4f}, adjusted p = "
                    f"{c.tost_adjusted if verdict == 'tie' else c.p_adjusted:.3g})" for c in hit))
        rest = [c.format + (f" ({c.why_missing})" if c.why_missing else "") for c in comps
                if c.verdict == "not established"]
        if rest:
            parts.append("not established in " + ", ".join(rest))
        lines.append(f"{contrast.name}: " + "; ".join(parts) + ".")
    failing = [a for a in result.arms.values() if a.n_failures]
    if failing:
        entered = ("at their initial validation loss (counted as learning nothing)"
                   if ep.failure_value == "initial_val_loss" else "as missing (failure_value: exclude)")
        lines.append("Failures (diverged or never learned), entered in Δ " + entered + ": " + "; ".join(
            f"{a.format} {a.label} {a.n_failures}/{len(a.jobs)}" for a in failing) + ".")
    pairs = [(mantissa_bits(c.format), c.test.mean) for c in result.of(primary) if c.test.mean is not None]
    pairs = [(m, d) for m, d in pairs if m is not None]
    corr = spearman([m for m, _ in pairs], [d for _, d in pairs])
    if corr is not None:
        rho, p = corr
        lines.append(f"Benefit vs mantissa bits ({primary.name}, {len(pairs)} formats): Spearman ρ = {rho:+.2f}, "
                     f"exact permutation p = {p:.3g}" + (" — an association at α." if p < ep.alpha else
                                                         " — no association established."))
    shown = [c for c in result.outside if c.test.mean is not None]
    if shown:
        lines.append("Outside the declared family (descriptive, uncorrected; a gain there too is not specific to "
                     "the 8-bit grids): " + "; ".join(
                         f"{c.format} {c.contrast.name} Δ = {c.test.mean:+.4f}, {conf} CI {_ci(c.ci)}"
                         for c in shown) + ".")
    for note in result.notes:
        lines.append(f"Note: {note}.")
    return lines

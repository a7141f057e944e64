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
from altgrad.report.caveats import span
from altgrad.report.cells import Cell, describe, varying_fields
from altgrad.report.endpoint import Contrast
from altgrad.report.ladder import Ladder, Recovered, Rung, ladder, recovery
from altgrad.report.load import STATES, Sweep
from altgrad.report.order import FORMAT_ORDER, REFERENCE_FORMATS, exponent_bits, mantissa_bits, rank
from altgrad.report.stages import FormatAttribution
from altgrad.report.sensitivity import Neighbour
from altgrad.report.stats import TOST_POWER, holm, spearman
from altgrad.report.study import (Arm, Comparison, SameGrid, StudyResult, grid_classes, missing_parts,
                                  optimizer_of_arm, sign_check)
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


DELTA_UP = "less gain, or more harm, from the treatment"
DELTA_DOWN = "more gain from the treatment"
"""What a higher / lower Δ = treatment − reference means (negative Δ: the treatment helps)."""


def direction(rho: float, x: str, y: str = "Δ", up: str = DELTA_UP, down: str = DELTA_DOWN) -> str:
    """The direction of a rank correlation in words, from the sign of ρ: ρ > 0 says "the higher x, the higher y",
    ρ < 0 "the higher x, the lower y" (``up`` / ``down`` say what a higher / lower y means)."""
    if rho > 0:
        return f"the higher {x}, the higher {y} ({up})"
    if rho < 0:
        return f"the higher {x}, the lower {y} ({down})"
    return f"no monotone relation between {x} and {y}"


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
        lines.append(f"Across {len(pairs)} formats (exploratory, uncorrected), Spearman ρ between AdamW's mean "
                     f"stall ratio and the best Δ is {rho:+.2f} (exact permutation p = {p:.3g}): "
                     + direction(rho, "AdamW's stall ratio") + (" — an association at α = 0.05." if p < 0.05 else
                                                                 " as a point estimate; no association is "
                                                                 "established."))
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
    tests = []
    for name, label in MECHANISM[:3]:
        pairs = [(m, c.test.mean, c.format) for c in family if (m := _arm_median(c.reference, name)) is not None]
        corr = spearman([m for m, _, _ in pairs], [d for _, d, _ in pairs])
        if corr is not None:
            bits = [(b, m) for m, _, f in pairs if (b := mantissa_bits(f)) is not None]
            with_bits = spearman([b for b, _ in bits], [m for _, m in bits])
            tests.append((label, len(pairs), corr, with_bits))
    if tests:
        adjusted = holm([p for _, _, (_, p), _ in tests])
        alpha = result.endpoint.alpha
        n = sorted({k for _, k, _, _ in tests})
        lines.append(f"Why (exploratory, outside the declared family): {len(tests)} rank correlation(s) of a "
                     f"mechanism metric of {ref} with Δ({primary.name}) across n = {'/'.join(map(str, n))} formats, "
                     f"exact permutation p, Holm-corrected over these {len(tests)}.")
        for (label, k, (rho, p), _), pa in zip(tests, adjusted):
            lines.append(f"Why: {ref}'s {label} vs Δ({primary.name}), {k} formats: Spearman ρ = {rho:+.2f}, p = "
                         f"{p:.3g}, Holm p = {pa:.3g} — " + direction(rho, f"{ref}'s {label}")
                         + ("; an association at α." if pa < alpha else
                            " as a point estimate; no association established."))
        collinear = [f"{label} {wb[0]:+.2f}" for label, _, _, wb in tests if wb is not None]
        if collinear:
            lines.append("Why: these metrics are properties of the format (Spearman ρ with mantissa bits over the "
                         "same formats: " + ", ".join(collinear) + "); one point per format cannot tell a "
                         "mechanism apart from anything else that changes with the grid.")
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
             studies: Sequence[tuple[str | None, StudyResult]] = (), same_grid: SameGrid | None = None,
             sensitivity: Sequence[Sequence[Neighbour]] = ()) -> str:
    """The Findings section body (markdown bullets): the declared studies' answers when there are any, else the
    exploratory, Holm-corrected one. ``sensitivity``: per study, its reference arms at neighbouring lrs."""
    lines = evidence_base(sweep, cells)
    if studies:  # the why from each declared study's own runs (tuning runs elsewhere in the sweeps stay out)
        for k, (experiment, result) in enumerate(studies):
            near = sensitivity[k] if k < len(sensitivity) else ()
            lines += study_lines(result, experiment, near) + study_why_lines(result)
        ladders = any(r.endpoint.label == "arm" and r.endpoint.stages is not None for _, r in studies)
        if attributions or not ladders:  # a declared ladder has its own lines (ladder_lines)
            lines += failure_lines(attributions, threshold)
    else:
        if any(j.summary.get("arm") for j in sweep.jobs):
            lines.append("No run of these records declares an endpoint yet (a study whose evaluation has not run: "
                         "its pilot or tuning only): what follows is exploratory, and no declared question is "
                         "answered.")
        lines += answer(benefits, same_grid=same_grid) + failure_lines(attributions, threshold)
        lines += why_lines(benefits, cells)
    return "\n".join(f"- {line}" for line in lines)


def _ci(ci: tuple[float, float] | None) -> str:
    return "—" if ci is None else f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


def margin_line(result: StudyResult) -> str | None:
    """The tie margin as what it is: an absolute loss difference, and the share of the losses it applies to."""
    ep = result.endpoint
    means = [statistics.fmean(a.values.values()) for (f, _), a in result.arms.items()
             if f in result.formats and a.values]
    text = f"Tie margin: ±{ep.tie_margin:g} nats of validation loss, absolute (the same for every format)"
    if not means or min(means) <= 0:
        return text + "."
    lo, hi = min(means), max(means)
    return (text + f": {100 * ep.tie_margin / hi:.1f}–{100 * ep.tie_margin / lo:.1f} % of the family's arm mean "
            f"losses ({lo:.3f}–{hi:.3f}, the base of these percentages).")


def _underpowered_text(comps: Sequence[Comparison], result: StudyResult, level: float | None = None) -> str:
    """Why "not established" is no verdict: the equivalence test could not reach its level with the seeds run
    (``level``: the family's single-test level; default the primary family's)."""
    ep = result.endpoint
    weak = [c for c in comps if c.underpowered]
    if not weak:
        return ""
    n = sorted({len(c.deltas) for c in weak})
    sds = [c.paired_sd for c in weak if c.paired_sd is not None]
    level = result.single_test_level if level is None else level
    return (f" — neither a difference nor a tie is shown: the equivalence test (TOST ±{ep.tie_margin:g}) is "
            f"underpowered at {'/'.join(map(str, n))} seed pairs: needs ≈ "
            + ", ".join(f"{c.equivalence_seeds} ({c.format})" for c in weak)
            + f" seeds ({100 * TOST_POWER:g} % power at a true Δ of 0, one-sided level {level:.3g} under "
            f"{ep.correction}, from the observed paired SD {span(sds, '{:.3f}')}); absence of evidence, not "
            "evidence of no difference")


def _neighbour_text(n: Neighbour, conf: float) -> str:
    ci = n.delta.ci(conf)
    return (f"Δ = {n.delta.mean:+.4f}" + (f", {100 * conf:g}% CI {_ci(ci)}" if ci is not None else "")
            + f", {len(n.seeds)} seed pair{'s' if len(n.seeds) != 1 else ''}")


def sensitivity_lines(result: StudyResult, near: Sequence[Neighbour]) -> list[str]:
    """How much of each contrast's Δ depends on the reference's lr: the evaluation seeds at a neighbouring lr (with
    CIs), then the tuning seeds' view of the neighbours (n per lr said)."""
    conf = 1 - result.endpoint.alpha
    lines = []
    for contrast in result.endpoint.contrasts:
        rows = [n for n in near if n.contrast == contrast]
        if not rows:
            continue
        declared = {c.format: c for c in result.of(contrast)}
        for lr in sorted({n.lr for n in rows if n.source == "evaluation"}):
            at = [n for n in rows if n.source == "evaluation" and n.lr == lr]
            parts = []
            for n in at:
                d = declared[n.format].test.mean
                share = ""
                if d is not None and n.delta.mean is not None and d != 0:
                    pct = 100 * n.delta.mean / d
                    share = (f" — {pct:.0f} % of the declared Δ ({d:+.4f})"
                             + ("; the sign flips" if pct < 0 else ""))
                parts.append(f"{n.format}: {_neighbour_text(n, conf)}{share}")
            lines.append(f"Sensitivity to the lr grid ({contrast.name}; outside the declared family, uncorrected): "
                         f"with {contrast.reference} at lr {lr:g} instead of its declared {at[0].declared_lr:g} on "
                         "the evaluation seeds: " + "; ".join(parts) + ".")
        tuning = [n for n in rows if n.source == "tuning"]
        formats = sorted({n.format for n in tuning}, key=lambda f: rank(FORMAT_ORDER, f))
        if formats:
            seeds = sorted({s for n in tuning for s in n.seeds})
            scans = []  # (format, declared lr, its scanned neighbours, whether the declared lr was the lowest)
            for f in formats:
                here = [n for n in tuning if n.format == f]
                if any(n.is_declared for n in here) and len(here) > 1:
                    best = min(here, key=lambda n: statistics.fmean(n.reference[s] for s in n.seeds))
                    scans.append((f, next(n.declared_lr for n in here if n.is_declared),
                                  tuple(sorted(n.lr for n in here if not n.is_declared)), best.is_declared))
            if scans:
                lowest = sum(low for *_, low in scans)

                def lrs(values: Sequence[float]) -> str:
                    return ", ".join(f"{x:g}" for x in values)

                if len({(d, nb) for _, d, nb, _ in scans}) == 1:  # one declared lr and one scan: say it once
                    where = (f"at its declared lr {scans[0][1]:g} was the lowest of its scanned neighbours "
                             f"({lrs(scans[0][2])}) in {lowest} of {len(scans)} formats")
                else:  # the declared lr is per format: each with its own neighbours
                    where = (f"at its declared lr was the lowest of its scanned neighbours in {lowest} of "
                             f"{len(scans)} formats (" + "; ".join(
                                 f"{f}: {d:g} against {lrs(nb)}" + ("" if low else ", not the lowest")
                                 for f, d, nb, low in scans) + ")")
                lines.append(f"Sensitivity on the tuning seed{'s' if len(seeds) > 1 else ''} "
                             f"{', '.join(map(str, seeds))} ("
                             + ("one run per lr, no CI" if len(seeds) == 1 else f"{len(seeds)} seeds per lr")
                             + f"): {contrast.reference}'s loss {where}; the scan says nothing about lrs between its "
                             "points (table: Sensitivity to the reference's lr).")
    return lines


def _contrast_line(contrast: Contrast, comps: Sequence[Comparison], result: StudyResult,
                   beside: dict | None = None, level: float | None = None) -> str:
    """One contrast's verdicts over its formats, and where a sign was declared, the observed sign beside it."""
    ep = result.endpoint
    beside = beside or {}
    what_of = {"benefit": "lower loss (treatment helps)", "harm": "higher loss (treatment hurts)",
               "tie": f"equivalent within ±{ep.tie_margin:g} (TOST)"}
    if contrast.reference.startswith("Δ("):  # an interaction: a difference of two contrasts' Δ
        what_of.update(benefit=f"negative ({contrast.treatment} below {contrast.reference})",
                       harm=f"positive ({contrast.treatment} above {contrast.reference})")
    parts = []
    for verdict in ("benefit", "harm", "tie"):
        hit = [c for c in comps if c.verdict == verdict]
        if hit:
            parts.append(f"{what_of[verdict]} in " + ", ".join(
                f"{c.format} (Δ = {c.test.mean:+.4f}, adjusted p = "
                f"{c.tost_adjusted if verdict == 'tie' else c.p_adjusted:.3g}"
                + (f"; against {contrast.reference} at lr {n.lr:g} instead: "
                   f"{_neighbour_text(n, 1 - ep.alpha)}, uncorrected"
                   if (n := beside.get((contrast, c.format))) is not None else "") + ")" for c in hit))
    rest = [c for c in comps if c.verdict == "not established"]
    if rest:
        parts.append("not established in " + ", ".join(
            c.format + (f" ({c.why_missing})" if c.why_missing else
                        f" (Δ = {c.test.mean:+.4f})" if contrast.label and c.test.mean is not None else "")
            for c in rest) + _underpowered_text(rest, result, level))
    text = f"{contrast.label + ' (' + contrast.name + ')' if contrast.label else contrast.name}: " + "; ".join(parts)
    if contrast.expect != "none" and comps:
        checks: dict[str, list[str]] = {}
        for c in comps:
            checks.setdefault(sign_check(c), []).append(c.format)
        text += (f". Declared sign: {contrast.expect}; observed: "
                 + "; ".join(f"{k} in {', '.join(v)}" for k, v in checks.items()))
    return text + "."


ULP_STEPS = frozenset({"manifold", "grid"})
"""Optimizers whose step is measured in the weight's ULPs: uniform within a tensor on a grid without exponent bits."""
PLAIN_STEPS = frozenset({"adamw"})
"""Optimizers whose step is uniform within a tensor on any grid."""


def _control_role(c: Comparison) -> str | None:
    """What a format without exponent bits makes of a contrast: ``"control"`` (a ULP-aware step against a plain one:
    both uniform within each tensor there, so Δ ≈ 0 is expected), ``"shape"`` (the ULP-aware step against the
    relative step ∝ |w|: there a uniform step against a non-uniform one) or None (no expectation)."""
    names = {optimizer_of_arm(c.treatment).get("name"), optimizer_of_arm(c.reference).get("name")}
    if len(names) == 2 and names & ULP_STEPS and names & PLAIN_STEPS:
        return "control"
    if names == {"manifold", "relative"}:
        return "shape"
    return None


def format_control_lines(result: StudyResult) -> list[str]:
    """Formats without exponent bits (one ULP per tensor: a ULP-aware step is a plain one there) are the format
    control of each primary contrast of a ULP-aware arm against a plain one: their equivalence test beside their
    difference test. Against the relative step they are no control (Δ ≈ 0 is not expected), and say so."""
    ep = result.endpoint
    if ep.label != "arm":
        return []
    lines = []
    for c in result.comparisons:
        role = _control_role(c)
        if exponent_bits(c.format) != 0 or c.test.mean is None or role is None:
            continue
        ci = c.ci
        seeds = ("" if c.equivalence_seeds is None else
                 f"; underpowered: needs ≈ {c.equivalence_seeds} seeds" if c.underpowered else "")
        held = ("equivalent (a tie)" if c.verdict == "tie" else
                "a difference, not a tie" if c.verdict in ("benefit", "harm") else "equivalence not shown")
        name = f"{c.contrast.label} ({c.contrast.name})" if c.contrast.label else c.contrast.name
        stats = (f"Δ = {c.test.mean:+.4f}, {100 * c.confidence:g}% CI {_ci(ci)}, {ep.correction} p = "
                 f"{c.p_adjusted:.3g}; TOST ±{ep.tie_margin:g} {ep.correction} p = {c.tost_adjusted:.3g}: "
                 f"{held}{seeds}.")
        if role == "control":
            lines.append(f"Format control {c.format} (no exponent bits: one ULP per tensor, where a ULP-aware step is "
                         "a plain one at a per-tensor lr set by the tensor's largest |w|, so Δ ≈ 0 is expected "
                         f"unless that scaling matters): {name} {stats}")
        else:
            lines.append(f"Format {c.format} is no control for {name} (no exponent bits: one ULP per tensor, so the "
                         "ULP-aware step is uniform within each tensor while the relative step is ∝ |w|; the contrast "
                         f"sets a step of the grid's shape against one of the weights' shape, and Δ ≈ 0 is not "
                         f"expected): {stats}")
    return lines


def secondary_lines(result: StudyResult) -> list[str]:
    """The second family (the "why" by intervention within a format): its contrasts and interactions, corrected
    together, each with its declared sign."""
    ep = result.endpoint
    comps = result.secondary
    if not comps:
        return []
    level = result.family_level(comps)
    n_x = sum(1 for c in comps if c.contrast.reference.startswith("Δ("))
    lines = [f"Secondary family (the why, by intervention within a format): {len(comps) - n_x} contrast test(s) and "
             f"{n_x} interaction test(s) (Δ(first) − Δ(second), paired by seed), {ep.correction}-corrected together "
             "apart from the primary family."]
    for contrast in dict.fromkeys(c.contrast for c in comps):
        lines.append(_contrast_line(contrast, [c for c in comps if c.contrast == contrast], result, level=level))
    return lines


def intervention_lines(result: StudyResult) -> list[str]:
    """The mechanism by intervention in one line: each named contrast with a declared sign (and each interaction and
    control) and what the runs say of it, per format."""
    comps = [c for c in (*result.comparisons, *result.secondary) if c.contrast.label and c.contrast.expect != "none"]
    if not (result.secondary or result.controls) or not (comps or result.controls):
        return []
    parts = []
    for contrast in dict.fromkeys(c.contrast for c in comps):
        checks: dict[str, list[str]] = {}
        for c in (c for c in comps if c.contrast == contrast):
            checks.setdefault(sign_check(c), []).append(c.format)
        parts.append(f"{contrast.label} (expect {contrast.expect}): "
                     + ", ".join(f"{k} in {'/'.join(v)}" for k, v in checks.items()))
    for contrast in dict.fromkeys(c.contrast for c in result.controls):
        here = [c for c in result.controls if c.contrast == contrast]
        parts.append(f"{contrast.label or contrast.name} (expect ≈ 0): "
                     + ", ".join(f"{'tie' if c.verdict == 'tie' else 'equivalence not shown'} in {c.format}"
                                 for c in here))
    return ["The mechanism by intervention, declared sign against the runs: " + "; ".join(parts) + "."]


def control_lines(result: StudyResult) -> list[str]:
    """Controls (expected ≈ 0): judged by the equivalence test only, never as a difference."""
    ep = result.endpoint
    comps = result.controls
    if not comps:
        return []
    level = result.family_level(comps)
    lines = []
    for contrast in dict.fromkeys(c.contrast for c in comps):
        parts = []
        for c in (c for c in comps if c.contrast == contrast):
            if c.test.mean is None:
                parts.append(f"{c.format}: no test ({c.why_missing or 'no seed pairs'})")
                continue
            held = "a tie" if c.verdict == "tie" else "equivalence not shown"
            ci = c.ci
            if c.verdict != "tie" and ci is not None and (ci[0] > ep.tie_margin or ci[1] < -ep.tie_margin):
                held += f" (its CI lies beyond ±{ep.tie_margin:g}: the control does not hold at this margin)"
            parts.append(f"{c.format}: Δ = {c.test.mean:+.4f}, {100 * c.confidence:g}% CI {_ci(c.ci)}, TOST "
                         f"±{ep.tie_margin:g} {ep.correction} p = {c.tost_adjusted:.3g}: {held}"
                         + _underpowered_text([c], result, level))
        name = f"{contrast.label} ({contrast.name})" if contrast.label else contrast.name
        lines.append(f"Control {name}, expected ≈ 0 and judged by equivalence only ({ep.correction} over the "
                     f"{len(comps)} control test(s)): " + "; ".join(parts) + ".")
    return lines


def _untested(rungs: list[Rung], before: Rung | None = None) -> str:
    """The rungs (before ``before``, else all) with one seed pair: no test, so named with their Δ and not judged."""
    shown = [r for r in rungs[:rungs.index(before) if before is not None else len(rungs)] if len(r.deltas) < 2]
    if not shown:
        return ""
    lead = " — before it, one seed pair only" if before is not None else " — one seed pair only"
    return lead + ", not judged: " + ", ".join(f"{r.arm} (Δ {r.vs_reference.mean:+.4f})" for r in shown)


def ladder_lines(lad: Ladder | None) -> list[str]:
    """Where each format fails on the declared ladder: its first rung whose Δ exceeds the margin significantly."""
    if lad is None:
        return []
    if lad.reference_seeds == 0:
        return [f"Failure stages: the reference cell ({lad.reference_format} {lad.reference_arm}) has no runs yet, "
                "so no stage is judged."]
    lines = [f"Failure stages (each stage − {lad.reference_format} {lad.reference_arm}, paired by seed; a stage fails "
             f"when Δ > {lad.margin:g} by the one-sided paired t-test, Holm over the {len(lad.rungs)} stages × "
             f"formats at α = {lad.alpha:g}):"]
    parts = []
    for fmt in lad.formats:
        rungs = [r for r in lad.rungs if r.format == fmt and r.deltas]
        testable = [r for r in rungs if len(r.deltas) >= 2]  # one seed pair has no test: its Δ is not judged
        first = lad.failing(fmt)
        if not rungs:
            parts.append(f"{fmt}: no stage has runs paired with the reference yet")
        elif first is None and not testable:
            parts.append(f"{fmt}: no stage has two seed pairs yet" + _untested(rungs))
        elif first is None:
            top = max(testable, key=lambda r: r.vs_reference.mean or 0.0)
            parts.append(f"{fmt}: no stage fails ({len(testable)} stage(s) with two or more seed pairs; largest Δ "
                         f"{top.vs_reference.mean:+.4f} at {top.arm}, Holm p = {top.p_adjusted:.3g})"
                         + _untested(rungs))
        else:
            ci = first.vs_reference.ci()
            step = first.vs_previous
            parts.append(f"{fmt} first fails at **{first.arm}** (Δ = {first.vs_reference.mean:+.4f}, 95% CI "
                         f"{_ci(ci)}, Holm p = {first.p_adjusted:.3g}"
                         + (f", {first.failures} of {first.runs} runs failed" if first.failures else "")
                         + (f"; its step over the stage before: {step.mean:+.4f}, 95% CI {_ci(step.ci())}"
                            if step.mean is not None else "") + ")" + _untested(rungs, first))
    out = [lines[0] + " " + "; ".join(parts) + "."]
    if lad.problems:
        out.append("**The ladder's runs do not separate its stages, so no stage above can be attributed:** "
                   + "; ".join(lad.problems) + " (read from each run's layer_map.json and weight storage).")
    return out


def recovery_lines(result: StudyResult, rows: Sequence[Recovered]) -> list[str]:
    """What weight storage on the grid costs each arm against float32-master AdamW, and which arms recover it."""
    ep = result.endpoint
    if ep.recovery is None or ep.label != "arm":
        return []
    if not rows:
        return [f"Recovery: no arm has runs beside {ep.recovery.reference} yet."]
    parts = []
    for fmt in dict.fromkeys(r.format for r in rows):
        here = [r for r in rows if r.format == fmt and r.test.mean is not None]
        if not here:
            parts.append(f"{fmt}: no seed pairs")
            continue
        by: dict[str, list[str]] = {}
        for r in here:
            by.setdefault(r.verdict, []).append(f"{r.arm} {r.test.mean:+.4f}")
        parts.append(f"{fmt}: " + "; ".join(f"{v} — {', '.join(a)}" for v, a in by.items()))
    return [f"Recovery (arm − {ep.recovery.reference}, the same forward grid on float32 master weights; `recovers`: "
            f"TOST ±{ep.tie_margin:g} Holm p < α; `costs`/`gains`: the difference test, Holm over arms × formats): "
            + " | ".join(parts) + "."]


def study_lines(result: StudyResult, experiment: str | None = None,
                near: Sequence[Neighbour] = ()) -> list[str]:
    """The answer of a declared study: only what survives its declared correction; "not established" otherwise.
    ``near``: the reference arms at neighbouring lrs (altgrad/report/sensitivity.py), put beside the claims."""
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
    if ep.label == "arm":
        absent = missing_parts(result)
        if absent:
            lines.append("Declared parts with no records yet (a study still running, or stages not run; their tests "
                         "count in their family with p = 1 and say so below): " + "; ".join(
                             f"{arm} in {', '.join(fmts)} (for {', '.join(needs)})" for arm, fmts, needs in absent)
                         + ".")
    margin = margin_line(result)
    if margin:
        lines.append(margin)
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
        if rk.leader is not None and not rk.leads:
            # the lowest Δ is no benefit even as a point estimate: there is no leader to speak of
            c = by_format[rk.leader]
            p_top = rk.top_probability.get(rk.leader)
            text += (f" No format's point estimate on {primary.name} lies below zero: the lowest is {rk.leader}'s "
                     f"(Δ = {c.test.mean:+.4f}, {conf} CI {_ci(c.ci)}"
                     + (f", bootstrap P(top) = {p_top:.2f}" if p_top is not None else "") + ").")
        elif rk.leader is not None:
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
    beside = {(n.contrast, n.format): n for n in near if n.source == "evaluation"}
    for contrast in ep.contrasts:
        lines.append(_contrast_line(contrast, result.of(contrast), result, beside))
    lines += format_control_lines(result)
    lines += secondary_lines(result) + control_lines(result) + intervention_lines(result)
    lines += ladder_lines(ladder(result)) + recovery_lines(result, recovery(result))
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
                     f"exact permutation p = {p:.3g} — " + direction(rho, "a format's mantissa width")
                     + ("; an association at α." if p < ep.alpha else
                        " as a point estimate; no association established."))
    shown = [c for c in result.outside if c.test.mean is not None]
    if shown:
        lines.append("Outside the declared family (descriptive, uncorrected; a gain there too is not specific to "
                     "the 8-bit grids): " + "; ".join(
                         f"{c.format} {c.contrast.name} Δ = {c.test.mean:+.4f}, {conf} CI {_ci(c.ci)}"
                         for c in shown) + ".")
    lines += sensitivity_lines(result, near)
    for note in result.notes:
        lines.append(f"Note: {note}.")
    return lines

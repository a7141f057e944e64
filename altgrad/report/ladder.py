"""Where each format fails, and whether an arm on the grid recovers it: an arm-labelled declaration's failure-stage
ladder (``stages``) and recovery (``recovery``), both paired by seed (altgrad/report/endpoint.py).

Ladder: per family format, each ladder arm − the reference cell (its format and arm: fp32 ``stage_w``), and each
rung's increment over the rung before it (the first over the reference), in the declared order. A rung *fails*
when its Δ exceeds the tie margin significantly: the one-sided paired t-test of H0 Δ ≤ margin against Δ > margin,
Holm-corrected over every rung of every format; the failing stage of a format is its first failing rung. A
diverged or never-learning run enters at its initial loss (the declaration's ``failure_value``), so a stage that
breaks runs fails with them, never by dropping them.

What each rung ran is read from its runs' own records (layer_map.json and the weight storage), not from the arm's
name: rungs whose runs quantized the same roles cannot tell stages apart, and the report says so (``problems``).

Recovery: per family format, each listed arm − ``recovery.reference`` (AdamW on float32 master weights with the same
forward grid): what storing the weights on the grid costs each arm. An arm *recovers* when the equivalence test
(TOST at the tie margin) rejects; it *costs* (or *gains*) when the two-sided test rejects with that sign; both are
Holm-corrected over the arms × formats; otherwise not established.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from altgrad.report.caveats import role_format
from altgrad.report.load import Job
from altgrad.report.stats import CORRECTIONS, TTest, student_t_cdf, t_test
from altgrad.report.study import StudyResult, build_arm, split_off_lr


@dataclass(frozen=True)
class Rung:
    """One ladder arm in one format, against the reference cell and the rung before it."""

    format: str
    arm: str
    runs: int
    failures: int
    deltas: dict[int, float]
    vs_reference: TTest
    vs_previous: TTest
    p_exceeds: float | None         # one-sided p of H0 Δ ≤ margin
    p_adjusted: float = 1.0         # Holm over every rung of every format
    fails: bool = False
    ran: tuple[str, ...] = ()       # what its runs quantized (what_ran), one entry per distinct configuration


@dataclass(frozen=True)
class Ladder:
    """The declared ladder's rungs (format by format, in ladder order) and its reference cell."""

    reference_format: str
    reference_arm: str
    reference_seeds: int
    margin: float
    alpha: float
    formats: tuple[str, ...]
    rungs: tuple[Rung, ...]
    problems: tuple[str, ...] = ()  # rungs that did not run what a ladder needs (mixed, or the same as another)

    def failing(self, fmt: str) -> Rung | None:
        """The first rung of ``fmt`` that fails, in ladder order; None when none does (or none ran)."""
        return next((r for r in self.rungs if r.format == fmt and r.fails), None)


@dataclass(frozen=True)
class Recovered:
    """One recovery arm in one format: arm − the recovery reference, paired by seed."""

    format: str
    arm: str
    deltas: dict[int, float]
    test: TTest
    p_adjusted: float
    tost_adjusted: float
    verdict: str                    # recovers | costs | gains | not established


def p_exceeds(test: TTest, margin: float) -> float | None:
    """One-sided p of H0 mean ≤ margin against mean > margin (a t-test of mean − margin)."""
    if test.mean is None or test.se is None or test.df is None:
        return None
    if test.se == 0.0:
        return 0.0 if test.mean > margin else 1.0
    return 1.0 - student_t_cdf((test.mean - margin) / test.se, test.df)


def cell_values(result: StudyResult, jobs: Sequence[Job], fmt: str, arm: str) -> tuple[dict[int, float], int, int]:
    """Per-seed values of one (format, arm) cell (failures at their initial loss), its runs and failures. Runs of the
    arm at an lr set by hand (a sensitivity stage's) stay out, as in the declared contrasts (`split_off_lr`)."""
    ep = result.endpoint
    fjobs = [j for j in jobs if j.format == fmt]
    initials = [v for v in (j.summary.get("initial_val_loss") for j in fjobs)
                if isinstance(v, (int, float)) and math.isfinite(v)]
    mine, _ = split_off_lr([j for j in fjobs if j.arm == arm])
    built = build_arm(fmt, arm, mine, ep, max(initials) if initials else None)
    return built.values, len(mine), built.n_failures


ROLES = (("weight", "W"), ("input", "A"), ("grad", "G"))


def what_ran(job: Job) -> str | None:
    """What a run quantized, from its own records: ``W``, ``W+A``, ``W+A+G`` (a role counts where any Linear has it)
    and, without a float32 master copy, ``stored, <rounding>``; None where it wrote no layer map."""
    layers = job.layer_map
    if not isinstance(layers, dict) or not layers:
        return None
    tags = [tag for role, tag in ROLES
            if any(isinstance(v, dict) and role_format(v.get(role)) != "unquantized" for v in layers.values())]
    text = "+".join(tags) or "nothing"
    summary = job.summary or {}
    if summary.get("master") == "none":
        text += f", stored, {summary.get('storage_rounding')}"
    return text


def _ran(jobs: Sequence[Job], fmt: str, arm: str) -> tuple[str, ...]:
    return tuple(sorted({r for j in jobs if j.format == fmt and j.arm == arm if (r := what_ran(j)) is not None}))


def _problems(rungs: Sequence[Rung]) -> tuple[str, ...]:
    """Rungs whose runs ran more than one configuration, and rungs of one format that ran the same as an earlier."""
    out = []
    for r in rungs:
        if len(r.ran) > 1:
            out.append(f"{r.format} {r.arm}: its runs quantized different things ({'; '.join(r.ran)})")
    for i, r in enumerate(rungs):
        same = [q.arm for q in rungs[:i] if q.format == r.format and len(q.ran) == 1 and q.ran == r.ran]
        if len(r.ran) == 1 and same:
            out.append(f"{r.format} {r.arm} ran the same as {', '.join(same)} ({r.ran[0]}): the ladder cannot tell "
                       "those stages apart")
    return tuple(out)


def _paired(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
    return {s: a[s] - b[s] for s in sorted(a) if s in b}


def ladder(result: StudyResult) -> Ladder | None:
    """The declared ladder of an arm-labelled study; None when it declares none."""
    ep = result.endpoint
    if ep.stages is None or ep.label != "arm":
        return None
    jobs = (*result.jobs, *result.ladder_jobs)
    ref, _, _ = cell_values(result, jobs, ep.stages.reference_format, ep.stages.reference_arm)
    raw = []
    for fmt in result.formats:
        previous = ref
        for arm in ep.stages.arms:
            values, runs, failures = cell_values(result, jobs, fmt, arm)
            deltas = _paired(values, ref)
            test = t_test(list(deltas.values()))
            step = t_test(list(_paired(values, previous).values()))
            raw.append(Rung(fmt, arm, runs, failures, deltas, test, step, p_exceeds(test, ep.tie_margin),
                            ran=_ran(jobs, fmt, arm)))
            if values:
                previous = values
    adjusted = CORRECTIONS["holm"]([r.p_exceeds for r in raw])
    rungs = tuple(Rung(r.format, r.arm, r.runs, r.failures, r.deltas, r.vs_reference, r.vs_previous, r.p_exceeds,
                       pa, pa < ep.alpha, r.ran) for r, pa in zip(raw, adjusted))
    return Ladder(ep.stages.reference_format, ep.stages.reference_arm, len(ref), ep.tie_margin, ep.alpha,
                  result.formats, rungs, _problems(rungs))


def recovery(result: StudyResult) -> list[Recovered]:
    """Each declared recovery arm against the recovery reference, per family format; [] when none is declared."""
    ep = result.endpoint
    if ep.recovery is None or ep.label != "arm":
        return []
    raw = []
    for fmt in result.formats:
        ref, _, _ = cell_values(result, result.jobs, fmt, ep.recovery.reference)
        for arm in ep.recovery.arms:
            values, runs, _ = cell_values(result, result.jobs, fmt, arm)
            if runs == 0:
                continue  # an arm the plan runs in other formats only (Madam: e7m0)
            deltas = _paired(values, ref)
            raw.append((fmt, arm, deltas, t_test(list(deltas.values()))))
    adjust = CORRECTIONS["holm"]
    p_adj = adjust([t.p_value for *_, t in raw])
    tost_adj = adjust([t.tost_p(ep.tie_margin) for *_, t in raw])
    out = []
    for (fmt, arm, deltas, test), pa, ta in zip(raw, p_adj, tost_adj):
        if ta < ep.alpha:
            verdict = "recovers"
        elif test.mean is not None and pa < ep.alpha:
            verdict = "costs" if test.mean > 0 else "gains"
        else:
            verdict = "not established"
        out.append(Recovered(fmt, arm, deltas, test, pa, ta, verdict))
    return out

"""A speed target judged on paired per-round ratios: the geometric mean, its 95 % Student-t interval, and a verdict
that is 'met' or 'missed' only when the whole interval lies on one side of the bound.

On a shared machine the job bench's rounds differ by more than a target's margin (5–10 %), so a median of two rounds
cannot carry a verdict; the interval says when the rounds measured so far do, and roughly how many would.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from altgrad.report.stats import seeds_needed, t_test

MET, MISSED, UNSETTLED = "met", "missed", "unsettled"
MAX_ROUNDS = 1000  # beyond this many rounds the estimate is, for a user, at the bound
ALPHA = 0.05  # the interval is 95 %, two-sided
TIE = 1e-12  # log-scale distance below which an interval end counts as on the bound
POWER = 0.8  # the chance, at today's mean and spread, that the rounds-to-settle estimate does settle it


@dataclass(frozen=True)
class Judgement:
    """One ratio's evidence against one bound: n rounds, geometric mean, 95 % interval, verdict, rounds to settle."""

    n: int
    estimate: float | None
    ci: tuple[float, float] | None
    verdict: str
    rounds_needed: int | None = None  # unsettled: rounds that settle it with 80 % power at today's mean and spread

    def text(self) -> str:
        """'1.183 [1.021, 1.371]' (or the estimate alone from one round)."""
        if self.estimate is None:
            return "–"
        if self.ci is None:
            return f"{self.estimate:.3f}"
        return f"{self.estimate:.3f} [{self.ci[0]:.3f}, {self.ci[1]:.3f}]"


def judge(ratios: Sequence[float | None], bound: float, at_least: bool = False) -> Judgement:
    """Judge per-round ratios against ``bound`` (ratio ≤ bound; ≥ with ``at_least``) on the log scale, where a
    ratio and its inverse are symmetric: met when the interval clears the bound, missed when it lies beyond it."""
    logs = [math.log(r) for r in ratios if r is not None and r > 0 and math.isfinite(r)]
    if not logs:
        return Judgement(0, None, None, "unmeasured")
    test = t_test(logs)
    estimate = math.exp(test.mean)
    interval = test.ci(1 - ALPHA)
    if interval is None:  # one round: no spread to judge with
        return Judgement(test.n, estimate, None, UNSETTLED)
    lo, hi = interval
    edge = math.log(bound)  # an end within TIE of it touches it (log 1/x and −log x may differ in the last bit)
    good, bad = (lo >= edge - TIE, hi < edge - TIE) if at_least else (hi <= edge + TIE, lo > edge + TIE)
    verdict = MET if good else MISSED if bad else UNSETTLED
    sd = test.se * math.sqrt(test.n)
    needed = _rounds_needed(sd, test.mean, edge) if verdict == UNSETTLED else None
    return Judgement(test.n, estimate, (math.exp(lo), math.exp(hi)), verdict, needed)


def _rounds_needed(sd: float, mean: float, bound: float) -> int:
    """Rounds that settle the target with 80 % power if today's mean and sd are the truth: the paired t-test's n
    (``altgrad.report.stats.seeds_needed``: the 95 % interval then clears the bound in ≈ 4 of 5 benches);
    MAX_ROUNDS + 1 when more than MAX_ROUNDS would be needed, or the mean sits on the bound (no margin)."""
    n = seeds_needed(sd, abs(mean - bound), ALPHA, POWER, max_n=MAX_ROUNDS)
    return MAX_ROUNDS + 1 if n is None else n


def combine(*judgements: Judgement) -> str:
    """A target that must hold for several ratios: missed if any is, met if all are, else unsettled."""
    verdicts = [j.verdict for j in judgements]
    if "unmeasured" in verdicts:
        return "unmeasured"
    if MISSED in verdicts:
        return MISSED
    return MET if all(v == MET for v in verdicts) else UNSETTLED


def settle_text(*judgements: Judgement) -> str:
    """For an unsettled target: how many rounds in all would settle it (80 % power at today's means and spreads)."""
    needed = [j.rounds_needed for j in judgements if j.verdict == UNSETTLED]
    if any(n is None for n in needed) or not needed:
        return "a second round gives the first interval"
    n = max(needed)
    return f"≈ {n} rounds would settle it" if n <= MAX_ROUNDS else f"> {MAX_ROUNDS} rounds: at the bound"

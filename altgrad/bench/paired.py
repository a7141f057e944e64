"""A speed target judged on paired per-round ratios: the geometric mean, its 95 % Student-t interval, and a verdict
that is 'met' or 'missed' only when the whole interval lies on one side of the bound.

On a shared machine the job bench's rounds differ by more than a target's margin (5–10 %), so a median of two rounds
cannot carry a verdict; the interval says when the rounds measured so far do, and roughly how many would.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from altgrad.report.stats import t_critical, t_test

MET, MISSED, UNSETTLED = "met", "missed", "unsettled"
MAX_ROUNDS = 1000  # beyond this many rounds the estimate is, for a user, at the bound
EXACT_T = 60  # rounds up to which the rounds-to-settle search uses the exact t quantile


@dataclass(frozen=True)
class Judgement:
    """One ratio's evidence against one bound: n rounds, geometric mean, 95 % interval, verdict, rounds to settle."""

    n: int
    estimate: float | None
    ci: tuple[float, float] | None
    verdict: str
    rounds_needed: int | None = None  # unsettled: about how many rounds would settle it at today's mean and spread

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
    interval = test.ci()
    if interval is None:  # one round: no spread to judge with
        return Judgement(test.n, estimate, None, UNSETTLED, _rounds_needed(None, test.mean, math.log(bound)))
    lo, hi = interval
    good, bad = (lo >= math.log(bound), hi < math.log(bound)) if at_least else \
        (hi <= math.log(bound), lo > math.log(bound))
    verdict = MET if good else MISSED if bad else UNSETTLED
    sd = test.se * math.sqrt(test.n)
    needed = _rounds_needed(sd, test.mean, math.log(bound)) if verdict == UNSETTLED else None
    return Judgement(test.n, estimate, (math.exp(lo), math.exp(hi)), verdict, needed)


def _rounds_needed(sd: float | None, mean: float, bound: float) -> int | None:
    """The smallest n whose 95 % half-width t(n−1)·sd/√n is below |mean − bound| (today's mean and sd taken as
    true); None without an sd; MAX_ROUNDS + 1 when the mean sits (practically) on the bound."""
    if sd is None:
        return None
    gap = abs(mean - bound)
    for n in range(2, EXACT_T + 1):
        if t_critical(n - 1) * sd / math.sqrt(n) < gap:
            return n
    if gap == 0:
        return MAX_ROUNDS + 1
    # past EXACT_T rounds t(n−1) is within 2 % of its limit: solve with t(EXACT_T − 1), a slight over-estimate
    n = math.ceil((t_critical(EXACT_T - 1) * sd / gap) ** 2)
    return n if n <= MAX_ROUNDS else MAX_ROUNDS + 1


def combine(*judgements: Judgement) -> str:
    """A target that must hold for several ratios: missed if any is, met if all are, else unsettled."""
    verdicts = [j.verdict for j in judgements]
    if "unmeasured" in verdicts:
        return "unmeasured"
    if MISSED in verdicts:
        return MISSED
    return MET if all(v == MET for v in verdicts) else UNSETTLED


def settle_text(*judgements: Judgement) -> str:
    """For an unsettled target: how many rounds in all would settle it at today's means and spreads."""
    needed = [j.rounds_needed for j in judgements if j.verdict == UNSETTLED]
    if any(n is None for n in needed) or not needed:
        return "a second round gives the first interval"
    n = max(needed)
    return f"≈ {n} rounds would settle it" if n <= MAX_ROUNDS else f"> {MAX_ROUNDS} rounds: at the bound"

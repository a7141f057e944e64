"""The study's horizon from its pilot: the first H (≥ a floor) at which the fp32 baseline's validation loss is within
a tolerance of its loss at ``factor`` × H, read off the pilot's validation curves.

The pilot runs fp32 AdamW for factor × H steps with its cosine schedule spread over the whole pilot, so its loss at
step H is an upper bound on what a run of H steps (whose schedule decays by H) reaches: a horizon that passes here
passes with a margin. The rule is judged on the pilot run with the lowest loss at its end (its best lr).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from altgrad.report.load import Job


@dataclass(frozen=True)
class HorizonCheck:
    """One candidate horizon on one pilot run: loss at H, loss at factor × H, and their relative gap."""

    horizon: int
    loss_at_h: float
    loss_at_end: float

    @property
    def gap(self) -> float:
        return self.loss_at_h / self.loss_at_end - 1.0


def loss_at(curve: Sequence[tuple[int, float]], step: int) -> float | None:
    """The last validation loss logged at or before ``step`` (None: nothing logged by then).

    Lightning logs a validation that follows optimizer step s at step s or s - 1; either counts as step s."""
    value = None
    for at, loss in sorted(curve):
        if at <= step:
            value = loss
    return value


def horizon_checks(curve: Sequence[tuple[int, float]], *, factor: int, min_horizon: int, every: int
                   ) -> list[HorizonCheck]:
    """Every candidate H = min_horizon, min_horizon + every, … with factor × H within the curve."""
    if not curve:
        return []
    last = max(step for step, _ in curve) + 1  # a step logged as s - 1 is the end of step s
    checks = []
    h = min_horizon
    while factor * h <= last:
        at_h, at_end = loss_at(curve, h), loss_at(curve, factor * h)
        if at_h is not None and at_end is not None and at_end > 0:
            checks.append(HorizonCheck(h, at_h, at_end))
        h += every
    return checks


@dataclass(frozen=True)
class HorizonPick:
    """The pilot run the rule was judged on, its checks, and the smallest H that passes (None: none does)."""

    job: Job
    checks: tuple[HorizonCheck, ...]
    horizon: int | None
    tolerance: float

    def check(self, horizon: int) -> HorizonCheck | None:
        return next((c for c in self.checks if c.horizon == horizon), None)

    def passes(self, horizon: int) -> bool:
        c = self.check(horizon)
        return c is not None and c.gap <= self.tolerance

    def table(self) -> str:
        lines = [f"pilot run {self.job.name} (lr {self.job.lr:g}, final val loss {self.job.final_loss:.4f}):",
                 "  H      loss(H)  loss(4H)  gap"]
        for c in self.checks:
            mark = "ok" if c.gap <= self.tolerance else ""
            lines.append(f"  {c.horizon:<6d} {c.loss_at_h:.4f}   {c.loss_at_end:.4f}    {100 * c.gap:+.1f} % {mark}")
        return "\n".join(lines)


def pick_horizon(jobs: Sequence[Job], *, factor: int = 4, min_horizon: int = 400, every: int = 100,
                 tolerance: float = 0.03) -> HorizonPick:
    """The smallest H passing the rule on the completed pilot run with the lowest final validation loss.

    Raises ValueError when no pilot run completed."""
    done = [j for j in jobs if j.state == "completed" and j.final_loss is not None and j.curve]
    if not done:
        states = ", ".join(f"{j.name}: {j.state}" for j in jobs) or "no jobs"
        raise ValueError(f"no completed pilot run with a validation curve ({states}); run the pilot first")
    best = min(done, key=lambda j: (float(j.final_loss), j.name))
    checks = tuple(horizon_checks(best.curve, factor=factor, min_horizon=min_horizon, every=every))
    horizon = next((c.horizon for c in checks if c.gap <= tolerance), None)
    return HorizonPick(best, checks, horizon, tolerance)

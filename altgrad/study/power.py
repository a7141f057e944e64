"""How many evaluation seeds a study needs: a power calculation on the paired seed-to-seed SD its tuning runs show.

For each declared contrast (treatment arm − reference arm) in each format, the tuning runs at the two arms' picked
lrs give one paired difference per tuning seed; their variances pool over formats and contrasts
(s² = Σ (dᵢ − d̄_g)² / Σ (n_g − 1)). A two-sided paired t-test at α/m (Holm's first step over a family of m
tests, the strictest it asks) detects a true difference of ``margin`` with probability ``power`` once

    n ≥ ((t_{1−α/(2m), n−1} + t_{power, n−1}) · s / margin)²,

the smallest such n (iterated, since the t quantiles depend on n). The result is clamped to [min_seeds,
max_seeds]; a clamp from above is reported as underpowered, never hidden. Failed or diverged tuning runs at a
picked lr give no difference (lr_pick never picks an lr where one failed).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from altgrad.report.load import Job
from altgrad.report import stats

N_MAX_SEARCH = 1000


def arm_of(job: Job) -> str:
    """A job's arm: its ``arm`` (conf/arm/), else its optimizer label."""
    return str(job.get("arm") or job.optimizer_label)


def seeds_needed(sd: float, margin: float, *, power: float, alpha: float, family: int) -> int:
    """The smallest n (≥ 2) whose paired t-test at α/family, two-sided, has the power to detect ``margin``
    (``N_MAX_SEARCH`` when even that many would not)."""
    if sd <= 0:
        return 2
    n = stats.seeds_needed(sd, margin, alpha / family, power, max_n=N_MAX_SEARCH)
    return N_MAX_SEARCH if n is None else n


@dataclass(frozen=True)
class PowerResult:
    """The pooled paired SD, its degrees of freedom, the seeds it asks for and the seeds the study uses."""

    sd: float | None
    df: int
    needed: int | None
    n: int
    margin: float
    power: float
    alpha: float
    family: int
    min_seeds: int
    max_seeds: int
    groups: tuple[tuple[str, str, tuple[float, ...]], ...] = field(default=())  # (format, contrast, differences)

    @property
    def underpowered(self) -> bool:
        return self.needed is not None and self.needed > self.max_seeds

    def as_record(self) -> dict:
        return {"seeds": self.n, "needed": self.needed, "paired_sd": self.sd, "df": self.df, "margin": self.margin,
                "power": self.power, "alpha": self.alpha, "family": self.family, "min_seeds": self.min_seeds,
                "max_seeds": self.max_seeds, "underpowered": self.underpowered,
                "groups": [{"format": f, "contrast": c, "differences": list(d)} for f, c, d in self.groups]}

    def describe(self) -> str:
        if self.sd is None:
            return (f"power: no paired tuning differences to estimate the seed SD from; {self.n} seeds "
                    f"(min_seeds)")
        clamp = ""
        if self.needed is not None and self.needed > self.max_seeds:
            clamp = f"; capped at max_seeds = {self.max_seeds}: UNDERPOWERED for ±{self.margin:g}"
        elif self.needed is not None and self.needed < self.min_seeds:
            clamp = f"; raised to min_seeds = {self.min_seeds}"
        return (f"power: pooled paired SD {self.sd:.4f} ({self.df} df, {len(self.groups)} format × contrast "
                f"groups); to detect ±{self.margin:g} at α = {self.alpha:g}/{self.family} two-sided with power "
                f"{self.power:g}: n = {self.needed}{clamp} → {self.n} evaluation seeds")


def paired_groups(jobs: Iterable[Job], picks: Mapping[str, Mapping[str, float]],
                  contrasts: Sequence[tuple[str, str]]) -> list[tuple[str, str, tuple[float, ...]]]:
    """Per format and contrast, the paired differences (treatment − reference) over the seeds both arms ran at
    their picked lrs (``picks``: format → arm → lr); groups with fewer than two seeds are left out."""
    loss: dict[tuple[str, str, float, int], float] = {}
    for job in jobs:
        if job.final_loss is not None and job.lr is not None and job.seed is not None:
            loss[(job.format, arm_of(job), round(job.lr, 12), job.seed)] = job.final_loss
    by_cell: dict[tuple[str, str, float], dict[int, float]] = defaultdict(dict)
    for (fmt, arm, lr, seed), value in loss.items():
        by_cell[(fmt, arm, lr)][seed] = value
    groups = []
    for fmt in sorted(picks):
        for treatment, reference in contrasts:
            if treatment not in picks[fmt] or reference not in picks[fmt]:
                continue
            t = by_cell.get((fmt, treatment, round(picks[fmt][treatment], 12)), {})
            r = by_cell.get((fmt, reference, round(picks[fmt][reference], 12)), {})
            seeds = sorted(set(t) & set(r))
            if len(seeds) >= 2:
                groups.append((fmt, f"{treatment} − {reference}", tuple(t[s] - r[s] for s in seeds)))
    return groups


def power_for(groups: Sequence[tuple[str, str, tuple[float, ...]]], *, margin: float, power: float, alpha: float,
              family: int, min_seeds: int, max_seeds: int) -> PowerResult:
    """The seeds the pooled paired SD of ``groups`` asks for (see the module docstring)."""
    ss = sum(sum((d - sum(ds) / len(ds)) ** 2 for d in ds) for _, _, ds in groups)
    df = sum(len(ds) - 1 for _, _, ds in groups)
    sd = math.sqrt(ss / df) if df > 0 else None
    needed = seeds_needed(sd, margin, power=power, alpha=alpha, family=family) if sd is not None else None
    n = min_seeds if needed is None else min(max(needed, min_seeds), max_seeds)
    return PowerResult(sd, df, needed, n, margin, power, alpha, family, min_seeds, max_seeds, tuple(groups))

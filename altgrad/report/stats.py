"""Small-sample statistics for seed-replicated runs: mean ± std, Student-t CIs, paired-seed differences, Holm's
step-down correction, equivalence tests (TOST), exact rank-correlation p-values and a seed bootstrap.

scipy is not a dependency, so the Student-t distribution is computed here from the regularized incomplete beta
function (continued fraction, as in Numerical Recipes §6.4) and inverted by bisection; Spearman's p-value comes
from the permutation distribution of the ranks (exact up to 8 points), not from an approximation.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

_EPS = 1e-15
_TINY = 1e-300


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """Lentz's evaluation of the continued fraction for I_x(a, b); converges fast for x < (a+1)/(a+b+2)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + aa / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) = B(x; a, b) / B(a, b) for a, b > 0 and 0 ≤ x ≤ 1."""
    if not (a > 0 and b > 0):
        raise ValueError(f"incomplete beta needs a > 0 and b > 0, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"incomplete beta needs 0 <= x <= 1, got x={x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    # the continued fraction converges for x below the mean; use the symmetry I_x(a,b) = 1 − I_{1−x}(b,a) above it
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with df degrees of freedom: the tail is ½·I_{df/(df+t²)}(df/2, ½)."""
    if df <= 0:
        raise ValueError(f"Student-t needs df > 0, got df={df}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_critical(df: float, confidence: float = 0.95) -> float:
    """Two-sided critical value t such that P(|T| ≤ t) = confidence (df=2, 0.95 → 4.3027)."""
    if df <= 0:
        raise ValueError(f"Student-t needs df > 0, got df={df}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    target = 0.5 + confidence / 2.0
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < target:
        lo, hi = hi, hi * 2.0
    for _ in range(200):  # bisection to float precision; the cdf is monotone
        mid = 0.5 * (lo + hi)
        if student_t_cdf(mid, df) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def two_sided_p(t: float, df: float) -> float:
    """Two-sided p-value of a t statistic."""
    return 2.0 * (1.0 - student_t_cdf(abs(t), df))


@dataclass(frozen=True)
class Summary:
    """Mean, sample std (ddof=1) and 95% Student-t half-width of a handful of values; std/CI need n ≥ 2."""

    n: int
    mean: float | None
    std: float | None
    half_width: float | None

    @property
    def ci(self) -> tuple[float, float] | None:
        if self.mean is None or self.half_width is None:
            return None
        return self.mean - self.half_width, self.mean + self.half_width


def summarize(values: Sequence[float], confidence: float = 0.95) -> Summary:
    """Summary of the finite values in ``values`` (non-finite ones are dropped)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(xs)
    if n == 0:
        return Summary(0, None, None, None)
    mean = math.fsum(xs) / n
    if n == 1:
        return Summary(1, mean, None, None)
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    return Summary(n, mean, std, t_critical(n - 1, confidence) * std / math.sqrt(n))


@dataclass(frozen=True)
class PairedDifference:
    """treatment − baseline, paired by seed: a Summary of the differences plus a two-sided p-value."""

    diff: Summary
    p_value: float | None
    seeds: tuple[int, ...]

    @property
    def significant(self) -> bool:
        """True when the 95% CI of the mean difference excludes zero."""
        ci = self.diff.ci
        return ci is not None and (ci[0] > 0 or ci[1] < 0)

    @property
    def mark(self) -> str:
        """``**`` p < 0.01, ``*`` p < 0.05, ``n.s.`` otherwise, ``n<2`` when there are too few pairs to tell."""
        if self.p_value is None:
            return "n<2"
        if self.p_value < 0.01:
            return "**"
        return "*" if self.p_value < 0.05 else "n.s."


def paired_difference(treatment: Mapping[int, float], baseline: Mapping[int, float],
                      confidence: float = 0.95) -> PairedDifference:
    """Differences over the seeds both sides have a finite value for (a paired t-test on those differences)."""
    seeds = tuple(sorted(s for s in treatment if s in baseline
                         and _finite(treatment[s]) and _finite(baseline[s])))
    diff = summarize([treatment[s] - baseline[s] for s in seeds], confidence)
    p_value = None
    if diff.n >= 2 and diff.std is not None and diff.mean is not None:
        if diff.std == 0.0:
            p_value = 1.0 if diff.mean == 0.0 else 0.0
        else:
            p_value = two_sided_p(diff.mean / (diff.std / math.sqrt(diff.n)), diff.n - 1)
    return PairedDifference(diff, p_value, seeds)


EXACT_SPEARMAN_MAX_N = 8
"""Up to this many points Spearman's p enumerates all n! orderings (8! = 40320); above it, 20 000 random ones."""


def spearman(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """Spearman's rank correlation and its two-sided permutation p-value; None below 4 points or for constant data.

    p = P(|ρ| ≥ |ρ_observed|) when the ranks of ys are assigned to xs at random (ties keep their average ranks):
    exact for n ≤ EXACT_SPEARMAN_MAX_N, so a perfect order of 4 points gives p = 2/4! = 1/12, never 0; above that a
    fixed-seed Monte Carlo estimate (1 + hits) / (1 + draws), which is never 0 either.
    """
    n = len(xs)
    if n != len(ys) or n < 4:
        return None
    rx, ry = np.array(_ranks(xs)), np.array(_ranks(ys))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    norm = math.sqrt(float(rx @ rx) * float(ry @ ry))
    if norm == 0:
        return None
    rho = float(rx @ ry) / norm
    tol = 1e-9 * norm  # permutations that reproduce the observed |Σ rx·ry| up to rounding count as "as extreme"
    if n <= EXACT_SPEARMAN_MAX_N:
        perms = np.array(list(itertools.permutations(range(n))))
        stats = np.abs(ry[perms] @ rx)
        return rho, float(np.mean(stats >= abs(float(rx @ ry)) - tol))
    draws = 20_000
    rng = np.random.default_rng(0)
    perms = rng.permuted(np.tile(np.arange(n), (draws, 1)), axis=1)
    hits = int(np.sum(np.abs(ry[perms] @ rx) >= abs(float(rx @ ry)) - tol))
    return rho, (1 + hits) / (1 + draws)


def holm(p_values: Sequence[float | None]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error ≤ α under any dependence); a missing test (None) counts
    as p = 1, so the family keeps the size that was declared."""
    ps = [1.0 if p is None or not math.isfinite(p) else min(max(float(p), 0.0), 1.0) for p in p_values]
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank_, i in enumerate(order):
        running = max(running, min(1.0, (m - rank_) * ps[i]))
        adjusted[i] = running
    return adjusted


def benjamini_hochberg(p_values: Sequence[float | None]) -> list[float]:
    """Benjamini–Hochberg adjusted p-values (false-discovery rate ≤ α for independent or positively dependent tests);
    a missing test counts as p = 1."""
    ps = [1.0 if p is None or not math.isfinite(p) else min(max(float(p), 0.0), 1.0) for p in p_values]
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i], reverse=True)
    adjusted = [1.0] * m
    running = 1.0
    for k, i in enumerate(order):
        running = min(running, ps[i] * m / (m - k))
        adjusted[i] = running
    return adjusted


CORRECTIONS = {"holm": holm, "bh": benjamini_hochberg, "none": lambda ps: [1.0 if p is None else p for p in ps]}
"""Multiplicity corrections by the name an experiment declares."""


@dataclass(frozen=True)
class TTest:
    """A mean of n values (or of paired differences) with its standard error on df degrees of freedom.

    ``df`` exceeds n − 1 only when the variance was pooled with other comparisons (see ``pooled_sd``)."""

    n: int
    mean: float | None
    se: float | None
    df: float | None

    @property
    def p_value(self) -> float | None:
        """Two-sided p of mean = 0."""
        if self.mean is None or self.se is None or self.df is None:
            return None
        if self.se == 0.0:
            return 1.0 if self.mean == 0.0 else 0.0
        return two_sided_p(self.mean / self.se, self.df)

    def ci(self, confidence: float = 0.95) -> tuple[float, float] | None:
        if self.mean is None or self.se is None or self.df is None:
            return None
        half = t_critical(self.df, confidence) * self.se
        return self.mean - half, self.mean + half

    def tost_p(self, margin: float) -> float | None:
        """Two one-sided tests of |mean| < margin (equivalence): the larger of the two one-sided p-values. Small p
        means the mean lies inside (−margin, +margin); it is rejected at α exactly when the (1 − 2α) CI lies there."""
        if not margin > 0:
            raise ValueError(f"equivalence margin must be > 0, got {margin}")
        if self.mean is None or self.se is None or self.df is None:
            return None
        if self.se == 0.0:
            return 0.0 if abs(self.mean) < margin else 1.0
        p_low = 1.0 - student_t_cdf((self.mean + margin) / self.se, self.df)   # H0: mean <= -margin
        p_high = student_t_cdf((self.mean - margin) / self.se, self.df)        # H0: mean >= +margin
        return max(p_low, p_high)


def t_test(values: Sequence[float], pooled: tuple[float, float] | None = None) -> TTest:
    """One-sample t of the finite values; ``pooled`` = (sd, df) replaces their own sd and n − 1 degrees of freedom."""
    xs = [float(v) for v in values if _finite(v)]
    n = len(xs)
    if n == 0:
        return TTest(0, None, None, None)
    mean = math.fsum(xs) / n
    if pooled is not None:
        sd, df = pooled
        return TTest(n, mean, sd / math.sqrt(n), df) if df > 0 else TTest(n, mean, None, None)
    if n < 2:
        return TTest(n, mean, None, None)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    return TTest(n, mean, sd / math.sqrt(n), n - 1)


def pooled_sd(groups: Sequence[Sequence[float]]) -> tuple[float, float] | None:
    """(sd, df) of the within-group variance pooled over groups: Σ(n_i − 1)·s_i² / Σ(n_i − 1); None without df."""
    ss, df = 0.0, 0
    for g in groups:
        xs = [float(v) for v in g if _finite(v)]
        if len(xs) >= 2:
            m = math.fsum(xs) / len(xs)
            ss += math.fsum((x - m) ** 2 for x in xs)
            df += len(xs) - 1
    return (math.sqrt(ss / df), float(df)) if df else None


def bootstrap_top_rank(per_seed: Mapping[str, Mapping[int, float]], draws: int = 2000,
                       seed: int = 0) -> dict[str, float]:
    """P(each key has the lowest mean) when the seeds shared by every key are resampled with replacement.

    ``per_seed`` maps a key (a format) to its per-seed values (its Δ); seeds are resampled jointly, so the pairing
    across keys is kept. Keys without every shared seed are left out; {} when fewer than 2 keys or 2 seeds remain.
    """
    keys = [k for k in per_seed if per_seed[k]]
    shared = sorted(set.intersection(*(set(per_seed[k]) for k in keys))) if keys else []
    if len(keys) < 2 or len(shared) < 2:
        return {}
    table = np.array([[per_seed[k][s] for s in shared] for k in keys], dtype=np.float64)  # keys × seeds
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(shared), size=(draws, len(shared)))
    means = table[:, picks].mean(axis=2)  # keys × draws
    winners = np.argmin(means, axis=0)
    counts = np.bincount(winners, minlength=len(keys))
    return {k: float(c) / draws for k, c in zip(keys, counts)}


def _ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n with ties given their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def single_test_level(correction: str, alpha: float, m: int) -> float:
    """The level one test of a family of ``m`` is sure to be held to, whatever the other tests give: α/m under
    Holm (its first step) and Benjamini–Hochberg (a lone rejection needs p ≤ α/m), α uncorrected."""
    return alpha if correction == "none" or m <= 1 else alpha / m


TOST_POWER = 0.8
"""The power the seeds an equivalence test needs are computed for."""


def tost_seeds_needed(sd: float, margin: float, level: float, power: float = TOST_POWER,
                      max_n: int = 100_000) -> int | None:
    """Seed pairs a paired equivalence test (TOST, margin ±δ) needs for ``power`` when the true mean Δ is 0.

    With paired SD σ, one-sided level α' (each of the two tests; under a correction, ``single_test_level``) and
    power 1 − β, the smallest n ≥ 2 with

        n ≥ (t(1 − α', n − 1) + t(1 − β/2, n − 1))² · σ² / δ²

    (Chow, Shao & Wang, *Sample Size Calculations in Clinical Research*, 2nd ed. 2008, §3.2: the one-sample /
    paired equivalence test at a true difference of 0; t quantiles on n − 1 df, solved by stepping n up). It is the
    usual approximation of the noncentral-t power (within a seed or two; a Monte Carlo check is in the tests), and
    the most favourable case for a tie: a true Δ ≠ 0 needs more. None when σ is not a positive number, or when more
    than ``max_n`` would be needed."""
    if not (math.isfinite(sd) and sd > 0) or not margin > 0 or not 0 < level < 0.5 or not 0 < power < 1:
        return None
    ratio = (sd / margin) ** 2
    beta = 1.0 - power

    def enough(n: int) -> bool:
        quantiles = t_critical(n - 1, 1.0 - 2.0 * level) + t_critical(n - 1, 1.0 - beta)
        return n >= quantiles ** 2 * ratio

    return _smallest_n(enough, max_n)


def _smallest_n(enough: Callable[[int], bool], max_n: int) -> int | None:
    """The smallest n in [2, max_n] with ``enough(n)``, None if not even max_n. ``enough`` must hold from some n on
    (n − (quantiles)²·σ²/δ² grows with n, since the t quantiles shrink), so n is bisected."""
    if enough(2):
        return 2
    if not enough(max_n):
        return None
    low, high = 2, max_n
    while high - low > 1:
        mid = (low + high) // 2
        if enough(mid):
            high = mid
        else:
            low = mid
    return high


def seeds_needed(sd: float, margin: float, alpha: float, power: float, max_n: int = 100_000) -> int | None:
    """Pairs a two-sided paired t-test at level ``alpha`` needs to detect a true mean difference of ``margin`` with
    probability ``power``: the smallest n ≥ 2 with

        n ≥ (t(1 − α/2, n − 1) + t(power, n − 1))² · σ² / margin²

    (the same normal-to-t approximation as ``tost_seeds_needed``; the quantiles depend on n, so n is bisected).
    2 when σ is 0; None when σ or the margin is not a finite number (σ ≥ 0, margin > 0), the power is outside
    [0.5, 1), or more than ``max_n`` are needed."""
    if not (math.isfinite(sd) and sd >= 0) or not (math.isfinite(margin) and margin > 0) \
            or not 0 < alpha < 1 or not 0.5 <= power < 1:
        return None
    ratio = (sd / margin) ** 2

    def enough(n: int) -> bool:
        beyond = t_critical(n - 1, 2.0 * power - 1.0) if power > 0.5 else 0.0  # t(power); t(0.5) = 0
        quantiles = t_critical(n - 1, 1.0 - alpha) + beyond
        return n >= quantiles ** 2 * ratio

    return _smallest_n(enough, max_n)

"""Small-sample statistics for seed-replicated runs: mean ± std, Student-t 95% CIs and paired-seed differences.

scipy is not a dependency, so the Student-t distribution is computed here from the regularized incomplete beta
function (continued fraction, as in Numerical Recipes §6.4) and inverted by bisection.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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


def spearman(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """Spearman's rank correlation and its t-approximation p-value; None below 4 points or for constant data."""
    n = len(xs)
    if n != len(ys) or n < 4:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = math.fsum(rx) / n, math.fsum(ry) / n
    sxy = math.fsum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = math.fsum((a - mx) ** 2 for a in rx)
    syy = math.fsum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    rho = sxy / math.sqrt(sxx * syy)
    if abs(rho) >= 1.0:
        return rho, 0.0
    return rho, two_sided_p(rho * math.sqrt((n - 2) / (1.0 - rho * rho)), n - 2)


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

"""Student-t quantiles, CIs and paired-seed differences against known numbers."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from altgrad.report.stats import (
    benjamini_hochberg,
    bootstrap_top_rank,
    holm,
    paired_difference,
    pooled_sd,
    regularized_incomplete_beta,
    single_test_level,
    spearman,
    student_t_cdf,
    summarize,
    t_critical,
    t_test,
    seeds_needed,
    tost_seeds_needed,
)


@pytest.mark.parametrize("df, expected", [(1, 12.7062), (2, 4.3027), (3, 3.1824), (5, 2.5706), (10, 2.2281),
                                          (30, 2.0423), (120, 1.9799)])
def test_t_critical_matches_table(df: int, expected: float) -> None:
    assert t_critical(df) == pytest.approx(expected, abs=5e-5)


def test_t_critical_other_confidence_and_normal_limit() -> None:
    assert t_critical(4, 0.99) == pytest.approx(4.6041, abs=5e-5)
    assert t_critical(10, 0.90) == pytest.approx(1.8125, abs=5e-5)
    assert t_critical(1e7) == pytest.approx(1.959964, abs=1e-5)


def test_cdf_closed_forms() -> None:
    # df = 1 is the Cauchy distribution: F(t) = 1/2 + atan(t)/π; df = 2: F(t) = 1/2 + t / (2√(2 + t²))
    for t in (-7.0, -1.0, 0.0, 0.3, 2.5, 40.0):
        assert student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
        assert student_t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)


def test_incomplete_beta_closed_forms() -> None:
    for x in (0.0, 0.1, 0.5, 0.93, 1.0):
        assert regularized_incomplete_beta(1, 1, x) == pytest.approx(x, abs=1e-12)
        assert regularized_incomplete_beta(3, 1, x) == pytest.approx(x ** 3, abs=1e-12)
        assert regularized_incomplete_beta(1, 4, x) == pytest.approx(1 - (1 - x) ** 4, abs=1e-12)


@pytest.mark.parametrize("call", [lambda: t_critical(0), lambda: t_critical(3, 1.5),
                                  lambda: regularized_incomplete_beta(1, 1, 1.5),
                                  lambda: regularized_incomplete_beta(0, 1, 0.5)])
def test_bad_input_is_a_value_error(call) -> None:
    with pytest.raises(ValueError):
        call()


def test_summarize_known_numbers() -> None:
    s = summarize([1.0, 2.0, 3.0])
    assert (s.n, s.mean, s.std) == (3, 2.0, 1.0)
    assert s.half_width == pytest.approx(4.302653 / math.sqrt(3), abs=1e-5)
    assert s.half_width == pytest.approx(2.4841, abs=5e-5)
    assert s.ci == pytest.approx((2.0 - 2.4841, 2.0 + 2.4841), abs=5e-5)


def test_summarize_drops_non_finite_and_handles_small_n() -> None:
    assert summarize([float("nan"), None, 5.0, float("inf")]) == summarize([5.0])
    one = summarize([5.0])
    assert (one.n, one.mean, one.std, one.half_width, one.ci) == (1, 5.0, None, None, None)
    assert summarize([]).mean is None


def test_paired_difference_not_significant_when_ci_reaches_zero() -> None:
    d = paired_difference({0: 2.0, 1: 3.0, 2: 4.0}, {0: 1.0, 1: 1.0, 2: 1.0})
    assert d.diff.mean == 2.0
    assert d.diff.half_width == pytest.approx(2.4841, abs=5e-5)
    assert d.p_value == pytest.approx(0.07418, abs=5e-5)  # t = 2√3 with 2 df
    assert not d.significant
    assert d.mark == "n.s."


def test_paired_difference_marks_significance() -> None:
    one_star = paired_difference({0: 0.9, 1: 0.88, 2: 0.92}, {0: 1.0, 1: 1.0, 2: 1.0})
    assert one_star.significant and one_star.mark == "*"
    assert one_star.p_value == pytest.approx(0.01307, abs=5e-5)  # t = 0.1 / (0.02/√3), 2 df
    two_star = paired_difference({0: 0.5, 1: 0.48, 2: 0.52}, {0: 1.0, 1: 1.0, 2: 1.0})
    assert two_star.mark == "**" and two_star.diff.ci[1] < 0


def test_paired_difference_pairs_by_seed_only() -> None:
    d = paired_difference({0: 2.0, 1: 3.0, 5: 9.0, 2: float("nan")}, {0: 1.0, 1: 1.0, 2: 1.0, 7: 0.0})
    assert d.seeds == (0, 1)
    assert d.diff.mean == 1.5
    single = paired_difference({0: 2.0}, {0: 1.0, 1: 1.0})
    assert single.mark == "n<2" and not single.significant


def test_spearman_exact_permutation_p() -> None:
    # a perfect order of 4 points: 2 of the 4! orderings have |ρ| = 1, so p = 1/12 exactly (never 0)
    rho, p = spearman([1, 2, 3, 4], [10, 20, 30, 40])
    assert rho == 1.0 and p == pytest.approx(1 / 12, abs=1e-15)
    rho, p = spearman([1, 2, 3, 4], [4, 3, 2, 1])
    assert rho == -1.0 and p == pytest.approx(1 / 12, abs=1e-15)
    rho, p = spearman([0.2, 0.4, 0.5, 0.9], [2.0, -0.1, 0.0, -0.5])
    assert rho == pytest.approx(-0.8) and p == pytest.approx(8 / 24, abs=1e-15)  # |ρ| >= 0.8: 8 of 24
    rho, p = spearman(list(range(5)), list(range(5)))
    assert p == pytest.approx(2 / 120, abs=1e-15)
    assert spearman([1, 2, 3], [1, 2, 3]) is None
    assert spearman([1, 1, 1, 1], [1, 2, 3, 4]) is None


def test_spearman_with_ties_enumerates_the_tied_ranks() -> None:
    # ranks x = (1, 2, 3.5, 3.5), y = (1, 2, 3, 4): among the 24 orderings of y, count |Σ rx·ry| >= observed
    xs, ys = [1, 2, 3, 3], [1, 2, 3, 4]
    rho, p = spearman(xs, ys)
    rx = [1, 2, 3.5, 3.5]
    mean = 2.5
    obs = abs(sum((a - mean) * (b - mean) for a, b in zip(rx, ys)))
    hits = sum(abs(sum((a - mean) * (b - mean) for a, b in zip(rx, perm))) >= obs - 1e-12
               for perm in itertools.permutations(ys))
    assert p == pytest.approx(hits / 24, abs=1e-15)
    assert rho == pytest.approx(obs / math.sqrt(4.5 * 5.0))


def test_spearman_large_n_monte_carlo_never_zero() -> None:
    rho, p = spearman(list(range(12)), list(range(12)))
    assert rho == 1.0 and p == pytest.approx(1 / 20_001)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=4, max_size=7),
       st.randoms(use_true_random=False))
def test_spearman_p_is_a_probability_and_symmetric(xs: list[float], rnd) -> None:
    ys = xs[:]
    rnd.shuffle(ys)
    out = spearman(xs, ys)
    if out is None:
        assume(False)
    rho, p = out
    assert -1.0 - 1e-12 <= rho <= 1.0 + 1e-12 and 0.0 < p <= 1.0
    assert spearman(ys, xs) == pytest.approx((rho, p))
    neg = spearman(xs, [-y for y in ys])
    assert neg == pytest.approx((-rho, p))


def test_holm_known_numbers() -> None:
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # a missing test keeps its place in the family as p = 1
    assert holm([0.01, None]) == pytest.approx([0.02, 1.0])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_benjamini_hochberg_known_numbers() -> None:
    assert benjamini_hochberg([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.5])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=12))
def test_holm_properties(ps: list[float]) -> None:
    adj = holm(ps)
    assert all(p <= a <= 1.0 for p, a in zip(ps, adj))
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    assert all(adj[order[k]] <= adj[order[k + 1]] for k in range(len(ps) - 1))  # monotone in p
    assert all(a <= min(1.0, len(ps) * p) for p, a in zip(ps, adj))  # never above Bonferroni
    assert all(b <= a + 1e-15 for a, b in zip(adj, benjamini_hochberg(ps)))  # BH is never stricter


def test_t_test_ci_and_p_known_numbers() -> None:
    t = t_test([1.0, 2.0, 3.0])
    assert (t.n, t.mean, t.df) == (3, 2.0, 2) and t.se == pytest.approx(1 / math.sqrt(3))
    assert t.p_value == pytest.approx(0.07418, abs=5e-5)
    assert t.ci(0.95) == pytest.approx((2.0 - 2.4841, 2.0 + 2.4841), abs=5e-5)
    # pooled: sd 0.5 on 10 df replaces the sample's own
    pooled = t_test([1.0, 2.0, 3.0], pooled=(0.5, 10.0))
    assert pooled.se == pytest.approx(0.5 / math.sqrt(3)) and pooled.df == 10.0
    assert t_test([1.0]).p_value is None and t_test([]).mean is None


def test_pooled_sd_known_numbers() -> None:
    sd, df = pooled_sd([[1.0, 2.0, 3.0], [10.0, 14.0], [7.0]])  # SS = 2 + 8 = 10 on 2 + 1 df
    assert df == 3.0 and sd == pytest.approx(math.sqrt(10 / 3))
    assert pooled_sd([[1.0], []]) is None


def test_tost_equivalence() -> None:
    tight = t_test([0.001, -0.002, 0.0005, 0.001, -0.0005])
    assert tight.tost_p(0.01) < 0.001  # well inside ±0.01
    # TOST rejects at α exactly when the (1 − 2α) CI lies inside the margin
    lo, hi = tight.ci(0.90)
    margin = max(abs(lo), abs(hi))
    assert tight.tost_p(margin * 1.0001) < 0.05 < tight.tost_p(margin * 0.9999)
    wide = t_test([0.05, -0.04, 0.02])
    assert wide.tost_p(0.005) > 0.5  # the mean itself lies outside ±0.005
    with pytest.raises(ValueError, match="margin"):
        tight.tost_p(0.0)


def test_bootstrap_top_rank() -> None:
    clear = bootstrap_top_rank({"a": {0: -1.0, 1: -1.1, 2: -0.9}, "b": {0: 0.0, 1: 0.1, 2: -0.1}})
    assert clear == {"a": 1.0, "b": 0.0}
    close = bootstrap_top_rank({"a": {0: -1.0, 1: 0.0, 2: -0.5}, "b": {0: -0.5, 1: -0.4, 2: -0.6}})
    assert sum(close.values()) == pytest.approx(1.0) and 0.1 < close["a"] < 0.9
    assert bootstrap_top_rank({"a": {0: 1.0}}) == {}


def test_seeds_an_equivalence_test_needs_worked_example() -> None:
    """Paired SD 0.03, margin ±0.02, Holm over 12 tests at α = 0.05 (one-sided level 0.05/12), 80 % power:
    n ≥ (t(1 − 0.05/12, n − 1) + t(0.9, n − 1))² · (0.03/0.02)². At n = 37: (2.7920 + 1.3055)² · 2.25 = 37.78 > 37;
    at n = 38: (2.7876 + 1.3049)² · 2.25 = 37.68 ≤ 38, so 38 seed pairs (the normal approximation gives 35)."""
    level = single_test_level("holm", 0.05, 12)
    assert level == pytest.approx(0.05 / 12)
    assert t_critical(37, 1 - 2 * level) == pytest.approx(2.7876, abs=1e-4)
    assert t_critical(37, 0.8) == pytest.approx(1.3049, abs=1e-4)
    assert tost_seeds_needed(0.03, 0.02, level) == 38
    assert tost_seeds_needed(0.03, 0.02, 0.05) == 21  # uncorrected: fewer
    assert tost_seeds_needed(0.0, 0.02, level) is None and tost_seeds_needed(float("nan"), 0.02, level) is None
    assert single_test_level("none", 0.05, 12) == 0.05 and single_test_level("bh", 0.05, 4) == 0.0125


def test_the_seeds_needed_give_the_stated_power() -> None:
    """Monte Carlo: at the computed n a TOST with a true Δ of 0 rejects ≈ 80 % of the time, with fewer seeds less."""
    rng = np.random.default_rng(0)
    sd, margin, level = 0.03, 0.02, 0.05 / 12

    def power(n: int) -> float:
        x = rng.normal(0.0, sd, (20000, n))
        half = t_critical(n - 1, 1 - 2 * level) * x.std(axis=1, ddof=1) / np.sqrt(n)
        return float(np.mean(np.abs(x.mean(axis=1)) + half < margin))  # the (1 − 2α') CI inside ±margin

    n = tost_seeds_needed(sd, margin, level)
    assert 0.77 <= power(n) <= 0.85
    assert power(n - 8) < 0.7
    assert t_test(list(rng.normal(0.0, sd, 5))).tost_p(margin) > level  # 5 seeds: hopeless, as it says


def test_a_paired_t_tests_seeds_needed() -> None:
    """σ = margin, α = 0.05, power 0.8: n ≥ (t(0.975, n−1) + t(0.8, n−1))²; n = 10 gives (2.262 + 0.883)² = 9.89,
    n = 9 gives (2.306 + 0.889)² = 10.21 (Student-t tables), so 10 pairs."""
    assert seeds_needed(0.03, 0.03, 0.05, 0.8) == 10
    assert seeds_needed(0.0, 0.03, 0.05, 0.8) == 2
    # power ½ drops t(power): n ≥ t(0.975, n−1)² / 4; n = 4: (3.182/2)² = 2.53; n = 3: (4.303/2)² = 4.63 > 3
    assert seeds_needed(0.03, 0.06, 0.05, 0.5) == 4
    assert seeds_needed(float("nan"), 0.03, 0.05, 0.8) is None and seeds_needed(0.03, 0.0, 0.05, 0.8) is None
    assert seeds_needed(1.0, 0.001, 0.05, 0.8, max_n=1000) is None

"""Student-t quantiles, CIs and paired-seed differences against known numbers."""

from __future__ import annotations

import math

import pytest

from altgrad.report.stats import (
    paired_difference,
    regularized_incomplete_beta,
    spearman,
    student_t_cdf,
    summarize,
    t_critical,
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


def test_spearman() -> None:
    rho, p = spearman([1, 2, 3, 4], [10, 20, 30, 40])
    assert (rho, p) == (1.0, 0.0)
    rho, _ = spearman([0.2, 0.4, 0.5, 0.9], [2.0, -0.1, 0.0, -0.5])
    assert rho == pytest.approx(-0.8)
    assert spearman([1, 2, 3], [1, 2, 3]) is None
    assert spearman([1, 1, 1, 1], [1, 2, 3, 4]) is None

"""The evaluation's seeds from the tuning runs' paired SD (altgrad/study/power.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from altgrad.report.load import Job
from altgrad.report.stats import t_critical
from altgrad.study.power import paired_groups, power_for, seeds_needed


def test_a_worked_example_from_the_t_table() -> None:
    # sd = margin, α = 0.05 two-sided, power 0.8, one test: n must satisfy n ≥ (t_.975,n−1 + t_.80,n−1)².
    # n = 10: (2.262 + 0.883)² = 9.89 ≤ 10; n = 9: (2.306 + 0.889)² = 10.21 > 9 (Student-t table values)
    assert seeds_needed(0.03, 0.03, power=0.8, alpha=0.05, family=1) == 10


@settings(deadline=None, max_examples=25)  # each answer searches n with t quantiles by bisection
@given(st.floats(0.005, 0.1), st.integers(1, 12))
def test_the_answer_is_the_smallest_n_that_meets_the_rule(sd: float, family: int) -> None:
    n = seeds_needed(sd, 0.03, power=0.8, alpha=0.05, family=family)

    def meets(k: int) -> bool:
        return k >= ((t_critical(k - 1, 1 - 0.05 / family) + t_critical(k - 1, 2 * 0.8 - 1)) * sd / 0.03) ** 2

    assert meets(n) and (n == 2 or not meets(n - 1))


def job(fmt: str, arm: str, lr: float, seed: int, loss: float | None, status: str = "completed") -> Job:
    return Job(path=None, name=f"{fmt}-{arm}-{lr}-{seed}", state=status,  # type: ignore[arg-type]
               summary={"format": fmt, "arm": arm, "lr": lr, "seed": seed, "final_val_loss": loss, "status": status})


def test_paired_differences_at_the_picked_lrs_pool_over_formats() -> None:
    jobs = [job("e4m3", "m", 1.0, 201, 2.10), job("e4m3", "m", 1.0, 202, 2.20),
            job("e4m3", "a", 0.004, 201, 2.00), job("e4m3", "a", 0.004, 202, 2.06),
            job("e4m3", "a", 0.0063, 201, 1.00),  # another lr: not the pick
            job("e7m0", "m", 0.1, 201, 3.00), job("e7m0", "m", 0.1, 202, 3.02),
            job("e7m0", "a", 0.004, 201, 3.02), job("e7m0", "a", 0.004, 202, 3.00)]
    picks = {"e4m3": {"m": 1.0, "a": 0.004}, "e7m0": {"m": 0.1, "a": 0.004}}
    groups = paired_groups(jobs, picks, [("m", "a")])
    assert [(f, c) for f, c, _ in groups] == [("e4m3", "m − a"), ("e7m0", "m − a")]
    assert groups[0][2] == pytest.approx((0.10, 0.14)) and groups[1][2] == pytest.approx((-0.02, 0.02))
    result = power_for(groups, margin=0.03, power=0.8, alpha=0.05, family=1, min_seeds=6, max_seeds=10)
    # each group: Σ(d − d̄)² = 2 · 0.02² with 1 df → pooled s² = 0.0016 / 2
    assert result.df == 2 and result.sd == pytest.approx(math.sqrt(0.0008))
    assert result.n == max(6, min(10, seeds_needed(result.sd, 0.03, power=0.8, alpha=0.05, family=1)))


def test_a_cap_is_reported_as_underpowered_and_no_data_falls_back_to_the_minimum() -> None:
    groups = [("e4m3", "m − a", (0.0, 0.2))]
    result = power_for(groups, margin=0.03, power=0.8, alpha=0.05, family=6, min_seeds=6, max_seeds=10)
    assert result.n == 10 and result.needed > 10 and result.underpowered
    assert "UNDERPOWERED for ±0.03" in result.describe()
    empty = power_for([], margin=0.03, power=0.8, alpha=0.05, family=6, min_seeds=6, max_seeds=10)
    assert empty.n == 6 and empty.sd is None and not empty.underpowered

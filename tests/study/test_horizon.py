"""The horizon rule on validation curves of known shape: the smallest H whose loss is within the tolerance of the loss
at 4H, judged on the pilot run with the lowest final loss."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from altgrad.report.load import Job
from altgrad.sweep.horizon import HorizonCheck, horizon_checks, loss_at, pick_horizon


def curve(f, last: int = 2400, every: int = 25) -> tuple[tuple[int, float], ...]:
    """A validation curve logged as Lightning logs it: step s - 1 after optimizer step s, and step 0 first."""
    return ((0, f(0)), *((s - 1, f(s)) for s in range(every, last + 1, every)))


def job(name: str, lr: float, points, status: str = "completed") -> Job:
    final = points[-1][1]
    return Job(Path(name), name, status, {"status": status, "final_val_loss": final, "lr": lr}, curve=points)


def test_loss_at_takes_the_last_value_logged_by_then() -> None:
    points = ((0, 5.0), (24, 4.0), (49, 3.0))
    assert loss_at(points, 24) == 4.0 and loss_at(points, 25) == 4.0 and loss_at(points, 49) == 3.0
    assert loss_at(points, 100) == 3.0 and loss_at(((10, 1.0),), 5) is None


def test_checks_cover_every_candidate_whose_4h_is_on_the_curve() -> None:
    points = curve(lambda s: 1.0 + 1000.0 / (s + 10))
    checks = horizon_checks(points, factor=4, min_horizon=400, every=100)
    assert [c.horizon for c in checks] == [400, 500, 600]  # 4 × 700 = 2800 > 2400
    first = checks[0]
    assert first.loss_at_h == 1.0 + 1000.0 / 410 and first.loss_at_end == 1.0 + 1000.0 / 1610
    assert first.gap == pytest.approx((1.0 + 1000.0 / 410) / (1.0 + 1000.0 / 1610) - 1.0)


def test_the_smallest_passing_horizon_on_the_best_run() -> None:
    # loss = 1 + 10/s: gap(H) = (1 + 10/H) / (1 + 10/(4H)) - 1 = 7.5 / (H + 2.5), within 3 % from H = 247.5
    fast = job("fast", 1e-2, curve(lambda s: 1.0 + 10.0 / max(s, 1)))
    slow = job("slow", 3e-3, curve(lambda s: 2.0 + 1000.0 / max(s, 1)))  # worse final loss: not judged
    pick = pick_horizon([slow, fast], min_horizon=100, every=50, tolerance=0.03)
    assert pick.job is fast and pick.horizon == 250
    assert not pick.passes(200) and pick.passes(250) and pick.passes(600) and not pick.passes(650)  # 4×650 > 2400
    assert "fast (lr 0.01" in pick.table() and "250" in pick.table()


def test_no_horizon_when_the_loss_keeps_falling() -> None:
    pick = pick_horizon([job("a", 3e-3, curve(lambda s: 5.0 / (1 + s / 100)))], min_horizon=400, every=100)
    assert pick.horizon is None and [c.horizon for c in pick.checks] == [400, 500, 600]
    assert all(c.gap > 0.03 for c in pick.checks)


def test_no_completed_pilot_run_is_an_error() -> None:
    with pytest.raises(ValueError, match="no completed pilot run.*a: diverged"):
        pick_horizon([job("a", 1e-2, curve(lambda s: 1.0), status="diverged")])


@given(st.floats(0.5, 3.0), st.floats(1.0, 500.0), st.floats(0.005, 0.2))
def test_the_pick_is_the_first_horizon_within_tolerance(floor: float, scale: float, tolerance: float) -> None:
    points = curve(lambda s: floor + scale / (s + 1))
    pick = pick_horizon([job("a", 1e-3, points)], min_horizon=400, every=100, tolerance=tolerance)
    gaps = {c.horizon: c.gap for c in pick.checks}
    passing = [h for h, g in gaps.items() if g <= tolerance]
    assert pick.horizon == (min(passing) if passing else None)
    assert all(isinstance(c, HorizonCheck) and c.gap >= 0 for c in pick.checks)  # a falling curve

"""Hypothesis properties of quantize over random formats (every policy, E 0..8, M 0..10) and random inputs."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from altgrad.quant import POLICIES, FloatFormat, quantize

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def formats(draw: st.DrawFn) -> FloatFormat:
    policy = draw(st.sampled_from(POLICIES))
    if policy == "p3109":
        e = draw(st.integers(1, 7))
        m = 7 - e
    else:
        e = draw(st.integers(2 if policy == "ieee" else 0, 8))
        m = draw(st.integers(0, 10))
    standard = (1 << max(e - 1, 0)) - 1
    bias = draw(st.one_of(st.integers(standard - 3, standard + 3), st.integers(-20, 127)))
    try:
        return FloatFormat(e, m, bias, policy)
    except ValueError:
        reject()


@st.composite
def format_and_inputs(draw: st.DrawFn) -> tuple[FloatFormat, torch.Tensor]:
    fmt = draw(formats())
    f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
    in_range = st.floats(-1.25, 1.25, width=32).map(lambda u: u * fmt.max)
    near_bottom = st.floats(-8, 8, width=32).map(lambda u: u * fmt.min_subnormal)
    xs = draw(st.lists(st.one_of(f32, in_range, near_bottom), min_size=1, max_size=64))
    return fmt, torch.tensor(xs, dtype=torch.float32)


@SETTINGS
@given(format_and_inputs(), st.sampled_from(["nearest", "toward_zero"]), st.sampled_from(["saturate", "overflow"]))
def test_idempotent_monotone_odd_symmetric(case, rounding: str, overflow: str) -> None:
    fmt, x = case
    q = quantize(x, fmt, rounding=rounding, overflow=overflow)
    qq = quantize(q, fmt, rounding=rounding, overflow=overflow)
    assert torch.equal(q.view(torch.int32), qq.view(torch.int32)) or torch.equal(q.isnan(), qq.isnan())
    if overflow == "saturate":
        xs, _ = torch.sort(x)
        qs = quantize(xs, fmt, rounding=rounding)
        assert (qs[1:] >= qs[:-1]).all()
        assert (qs.abs() <= fmt.max).all()
    neg = quantize(-x, fmt, rounding=rounding, overflow=overflow)
    both_nan = neg.isnan() & q.isnan()
    assert ((neg == -q) | both_nan).all()


@SETTINGS
@given(format_and_inputs(), st.sampled_from(["nearest", "toward_zero", "stochastic"]))
def test_error_is_within_the_ulp_and_result_on_the_grid(case, rounding: str) -> None:
    fmt, x = case
    x = x[x.abs() <= fmt.max]
    q = quantize(x, fmt, rounding=rounding, seed=11).double()
    err = (q - x.double()).abs()
    ulp = fmt.ulp(x).double()
    bound = ulp / 2 if rounding == "nearest" else ulp
    assert (err <= bound).all()
    if rounding == "toward_zero":
        assert (q.abs() <= x.double().abs()).all()
    if fmt.bits <= 14:
        grid = fmt.values().double()
        assert torch.isin(q, grid).all()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(formats(), st.floats(-1.0, 1.0), st.integers(0, 2**31 - 1))
def test_stochastic_rounding_is_unbiased(fmt: FloatFormat, u: float, seed: int) -> None:
    # x anywhere from deep in the subnormal range to max, in float32
    lo_e, hi_e = math.log2(fmt.min_subnormal) - 1, math.log2(fmt.max)
    xv = float(np.float32(math.copysign(2.0 ** (lo_e + (hi_e - lo_e) * abs(u)), u)))
    if abs(xv) > fmt.max:
        reject()
    n = 100_000
    y = quantize(torch.full((n,), xv), fmt, rounding="stochastic", seed=seed).double()
    grid = fmt.values().double() if fmt.bits <= 14 else None
    vals = torch.unique(y)
    assert len(vals) <= 2
    lo, hi = float(vals.min()), float(vals.max())
    assert lo <= xv <= hi
    if grid is not None:  # the two values are adjacent grid points
        i = int(torch.searchsorted(grid, torch.tensor(xv, dtype=torch.float64), right=True)) - 1
        assert lo in (float(grid[i]),) and hi in (float(grid[i]), float(grid[min(i + 1, len(grid) - 1)]))
    if hi > lo:
        p = (xv - lo) / (hi - lo)
        se = (hi - lo) * math.sqrt(p * (1 - p) / n)
        assert abs(float(y.mean()) - xv) <= 4 * se
    else:
        assert lo == xv  # x on the grid comes back unchanged

"""quantize on every preset: midpoints, nudged midpoints, range ends and special values; modes; dtypes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from code_oracle import code_is_even, magnitude_codes

from altgrad.quant import FloatFormat, get_format, list_formats, quantize
from altgrad.quant.rounding import kernel_variant

PRESETS = list_formats()


def grid_pairs(fmt: FloatFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """Adjacent values (lo, hi) over the whole grid, both signs, in float64."""
    v = fmt.values().double()
    return v[:-1], v[1:]


@pytest.mark.parametrize("name", PRESETS)
def test_midpoints_go_to_the_even_code_and_nudges_to_the_nearer(name: str) -> None:
    fmt = get_format(name)
    lo, hi = grid_pairs(fmt)
    mid = ((lo + hi) / 2).float()
    assert torch.equal(mid.double(), (lo + hi) / 2)  # midpoints are exact in float32
    even_lo = code_is_even(fmt, lo)
    # the even one of two adjacent codes: lo's code is even, or else hi's (0 sits between ±q: its code is 0)
    expected = torch.where(even_lo, lo, hi).float()
    got = quantize(mid, fmt)
    assert torch.equal(got, expected), name
    up = torch.nextafter(mid, torch.tensor(math.inf))
    down = torch.nextafter(mid, torch.tensor(-math.inf))
    assert torch.equal(quantize(up, fmt), hi.float())
    assert torch.equal(quantize(down, fmt), lo.float())
    # grid values are fixed points
    v = fmt.values()
    assert torch.equal(quantize(v, fmt), v)


@pytest.mark.parametrize("name", PRESETS)
def test_range_ends_and_overflow_threshold(name: str) -> None:
    fmt = get_format(name)
    mx, sub = fmt.max, fmt.min_subnormal
    t = lambda *v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    # the next value of the unbounded grid above max is max + ulp(max): its midpoint is the overflow threshold
    ulp_max = float(fmt.ulp(t(mx)))
    thr = mx + ulp_max / 2
    max_code_even = magnitude_codes(fmt)[mx] % 2 == 0
    above = float(torch.nextafter(t(thr), t(math.inf)))
    over = math.inf if fmt.has_inf else (math.nan if fmt.policy == "fn" else mx)
    for ovf in ("saturate", "overflow"):
        big = over if ovf == "overflow" else mx
        got = quantize(t(mx, -mx, thr, above, math.inf, -math.inf, 3e38), fmt, overflow=ovf).tolist()
        assert got[:2] == [mx, -mx]
        assert got[2] == mx if max_code_even or ovf == "saturate" else (got[2] == big or math.isnan(big))
        assert got[3] == big or (math.isnan(big) and math.isnan(got[3]))
        assert got[4] == big or (math.isnan(big) and math.isnan(got[4]))
        assert got[5] == -big or (math.isnan(big) and math.isnan(got[5]))
    # small end: min subnormal, half of it (tie → code 0), a little more than half, min normal
    got = quantize(t(sub, sub / 2, float(np.nextafter(np.float32(sub / 2), 1)), -sub / 2), fmt).tolist()
    assert got[:3] == [sub, 0.0, sub]
    assert got[3] == 0.0
    if fmt.min_normal is not None:
        assert float(quantize(t(fmt.min_normal), fmt)) == fmt.min_normal


@pytest.mark.parametrize("name", PRESETS)
def test_special_values_follow_the_policy(name: str) -> None:
    fmt = get_format(name)
    for rounding in ("nearest", "toward_zero", "stochastic"):
        y = quantize(torch.tensor([math.nan, -math.nan, -0.0, 0.0]), fmt, rounding=rounding, seed=1)
        assert torch.isnan(y[:2]).all()
        assert y[2] == 0 and y[3] == 0
        assert bool(torch.signbit(y[2])) == fmt.has_negative_zero  # −0 only where the policy has it
        assert not bool(torch.signbit(y[3]))
    for rounding in ("nearest", "toward_zero"):  # a tiny negative value flushes to (−)0
        y = quantize(torch.tensor([-fmt.min_subnormal / 4]), fmt, rounding=rounding)
        assert y == 0 and bool(torch.signbit(y)) == fmt.has_negative_zero


def test_negative_zero_rules() -> None:
    x = torch.tensor([-0.0, -1e-30])
    assert torch.signbit(quantize(x, get_format("e4m3"))).all()
    assert not torch.signbit(quantize(x, get_format("p3109_p4"))).any()


def test_m0_ties_use_the_exponent_code_parity() -> None:
    """With M = 0 the grid is powers of two; 1.5·2^k ties to the even *code*, not the even significand."""
    for name in ("e7m0", "p3109_p1"):
        fmt = get_format(name)
        k = torch.arange(-10, 10, dtype=torch.float32)
        mid = 1.5 * torch.exp2(k)
        even = code_is_even(fmt, torch.exp2(k))
        expected = torch.where(even, torch.exp2(k), torch.exp2(k + 1))
        assert torch.equal(quantize(mid, fmt), expected)
    # e7m0 (bias 63) and p3109_p1 (bias 64) disagree about which power of two is even
    assert float(quantize(torch.tensor(1.5), get_format("e7m0"))) != float(
        quantize(torch.tensor(1.5), get_format("p3109_p1")))


@pytest.mark.parametrize("name", ["e4m3", "e7m0", "p3109_p3", "e0m7", "bf16"])
def test_toward_zero_is_truncation(name: str) -> None:
    fmt = get_format(name)
    v = fmt.values().double()
    x = torch.cat([v, (v[:-1] + v[1:]) / 2, v[:-1] + (v[1:] - v[:-1]) * 0.999]).float()
    x = x[x.abs() <= fmt.max]
    y = quantize(x, fmt, rounding="toward_zero").double()
    assert (y.abs() <= x.double().abs()).all()
    idx = torch.searchsorted(v, x.double().abs(), right=True) - 1  # largest grid value <= |x|
    assert torch.equal(y.abs(), v[idx])


def test_toward_zero_overflow_only_for_infinities() -> None:
    fmt = get_format("e5m2")
    y = quantize(torch.tensor([1e6, math.inf]), fmt, rounding="toward_zero", overflow="overflow")
    assert y.tolist() == [fmt.max, math.inf]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_dtypes_are_quantized_in_float32_and_keep_their_dtype(dtype: torch.dtype) -> None:
    fmt = get_format("e4m3")
    x = (torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 30).to(dtype)
    y = quantize(x, fmt)
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y.float(), quantize(x.float(), fmt))


def test_shape_and_noncontiguous_input() -> None:
    fmt = get_format("e5m2")
    x = torch.randn(6, 5, 4).transpose(0, 2)
    y = quantize(x, fmt)
    assert y.shape == x.shape
    assert torch.equal(y, quantize(x.contiguous(), fmt))
    assert quantize(torch.tensor(3.3), fmt).shape == ()
    assert quantize(torch.empty(0, 3), fmt).shape == (0, 3)


def test_bad_arguments_name_the_valid_choices() -> None:
    fmt = get_format("e4m3")
    with pytest.raises(ValueError, match="rounding='up' is not valid; valid: nearest, stochastic, toward_zero"):
        quantize(torch.ones(2), fmt, rounding="up")
    with pytest.raises(ValueError, match="overflow='wrap'.*saturate, overflow"):
        quantize(torch.ones(2), fmt, overflow="wrap")
    with pytest.raises(ValueError, match="floating-point"):
        quantize(torch.ones(2, dtype=torch.int32), fmt)
    with pytest.raises(ValueError, match="FloatFormat"):
        quantize(torch.ones(2), "e4m3")  # type: ignore[arg-type]


# ---- stochastic rounding ----------------------------------------------------------------------------------

def neighbours(fmt: FloatFormat, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    v = fmt.values().double()
    i = torch.searchsorted(v, x.double(), right=True) - 1
    lo = v[i.clamp(0, len(v) - 1)]
    hi = v[(i + 1).clamp(0, len(v) - 1)]
    return lo, torch.where(lo == x.double(), lo, hi)


@pytest.mark.parametrize("name, xs", [
    ("e4m3", [1.1, -3.7, 0.3, 300.0, 0.0013, -0.0001, 1e-4]),  # normal and subnormal (< 2^-6) region
    ("e7m0", [1.1, 3.0, -5e-19, 2.5e-19, 1e-25]),            # M = 0, subnormal region is only zero
    ("e0m7", [0.5001, -0.3, 0.001]),
    ("p3109_p3", [1e-6, 7.7, -40000.0]),
    ("e5m2", [1e-7, 2.0**-16 * 0.25]),
    ("bf16", [3e-40, -1e-44, 1.1]),  # quantum 2^-133: the subnormal scaling takes two multiplies
])
def test_stochastic_is_unbiased_and_returns_only_neighbours(name: str, xs: list[float]) -> None:
    fmt = get_format(name)
    n = 100_000
    for xv in xs:
        x = torch.full((n,), xv, dtype=torch.float32)
        y = quantize(x, fmt, rounding="stochastic", seed=1234).double()
        lo, hi = neighbours(fmt, x[:1])
        lo, hi = float(lo), float(hi)
        assert set(torch.unique(y).tolist()) <= {lo, hi}, (name, xv)
        xd = float(x[0])
        p = 0.0 if hi == lo else (xd - lo) / (hi - lo)
        se = (hi - lo) * math.sqrt(p * (1 - p) / n)
        assert abs(float(y.mean()) - xd) <= 4 * se + 1e-12 * abs(xd), (name, xv, float(y.mean()), se)
        if 0.01 < p < 0.99:
            assert 0 < int((y == hi).sum()) < n  # both neighbours really occur


def test_stochastic_is_reproducible_from_seed_and_generator() -> None:
    fmt = get_format("e4m3")
    x = torch.randn(10_000)
    a = quantize(x, fmt, rounding="stochastic", seed=7)
    assert torch.equal(a, quantize(x, fmt, rounding="stochastic", seed=7))
    assert not torch.equal(a, quantize(x, fmt, rounding="stochastic", seed=8))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(quantize(x, fmt, rounding="stochastic", generator=g1),
                       quantize(x, fmt, rounding="stochastic", generator=g2))
    torch.manual_seed(5)
    b = quantize(x, fmt, rounding="stochastic")
    torch.manual_seed(5)
    assert torch.equal(b, quantize(x, fmt, rounding="stochastic"))


def test_stochastic_draws_are_independent_across_elements_and_seeds() -> None:
    """Round-up indicators at p = 1/2: no correlation between neighbours, nor between two seeds."""
    fmt = get_format("e4m3")
    x = torch.full((200_000,), 1.0625)  # midway between 1 and 1.125
    u1 = (quantize(x, fmt, rounding="stochastic", seed=1) > 1.06).double()
    u2 = (quantize(x, fmt, rounding="stochastic", seed=2) > 1.06).double()
    for a, b in ((u1[1:], u1[:-1]), (u1, u2)):
        corr = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
        assert abs(corr) < 4 / math.sqrt(len(a)) * 1.5
    assert abs(float(u1.mean()) - 0.5) < 4 * 0.5 / math.sqrt(len(u1))


def test_kernel_variants_leave_out_only_steps_a_format_cannot_need() -> None:
    v = kernel_variant(get_format("p3109_p1"), "nearest", "saturate")  # E7M0 with bias 64: odd 127 - bias
    assert v.tie_flip and v.zero_sign and v.saturates and not v.wide_quantum
    assert not kernel_variant(get_format("e7m0"), "nearest", "saturate").tie_flip  # bias 63: parities agree
    assert not kernel_variant(get_format("e4m3"), "nearest", "saturate").zero_sign  # fn keeps -0
    assert not kernel_variant(get_format("e5m2"), "nearest", "overflow").saturates  # overflow -> Inf
    assert kernel_variant(get_format("e5m2"), "toward_zero", "overflow").saturates is False  # Inf input -> Inf
    assert kernel_variant(get_format("bf16"), "toward_zero", "saturate").wide_quantum
    assert not kernel_variant(get_format("bf16"), "nearest", "saturate").wide_quantum  # nearest adds C instead
    # nearest rounds with one add at |x|'s binade unless M = 0 (code parity is the exponent's), or 2^(emax+23−M)
    # overflows float32 (bf16's range): those keep the bit-pattern rounding
    assert not kernel_variant(get_format("e4m3"), "nearest", "saturate").bit_round
    assert not kernel_variant(get_format("fp16"), "nearest", "saturate").bit_round
    assert kernel_variant(get_format("e7m0"), "nearest", "saturate").bit_round
    assert kernel_variant(get_format("bf16"), "nearest", "saturate").bit_round
    assert not kernel_variant(get_format("bf16"), "toward_zero", "saturate").bit_round  # a nearest-only step
    variants = {kernel_variant(get_format(n), "nearest", "saturate") for n in list_formats()}
    assert len(variants) == 4  # what the presets share: compiled kernels per rounding mode with saturate
    assert (kernel_variant(get_format("p3109_p1"), "nearest", "saturate").label
            == "nearest_tie_flip_zero_sign_saturates_bit_round")

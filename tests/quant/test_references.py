"""Bit-exact agreement with independent implementations: torch casts, ml_dtypes, gfloat, and enumeration (e0m7).

Inputs: every bfloat16 bit pattern as float32, plus random values spread over (and past) each format's range.
Where a reference has a different overflow rule we compare after clamping to ±max (NaN stays NaN).
"""

from __future__ import annotations

import gfloat
import ml_dtypes
import numpy as np
import pytest
import torch
from gfloat import Domain, FormatInfo
from gfloat.formats import format_info_p3109
from quant_testlib import assert_same_bits, inputs_for

from altgrad.quant import FloatFormat, get_format, quantize

N_RANDOM = 1_000_000
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")


def ours(x: np.ndarray, fmt: FloatFormat, overflow: str) -> np.ndarray:
    return quantize(torch.from_numpy(x), fmt, overflow=overflow).numpy()


def clamp(x: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    return np.clip(x, -fmt.max, fmt.max)  # keeps NaN


@pytest.mark.parametrize(
    "fmt, dtype",
    [(get_format("e4m3"), torch.float8_e4m3fn), (get_format("e5m2"), torch.float8_e5m2),
     (get_format("bf16"), torch.bfloat16), (get_format("fp16"), torch.float16)],
    ids=["e4m3", "e5m2", "bf16", "fp16"],
)
def test_torch_casts(fmt: FloatFormat, dtype: torch.dtype) -> None:
    x = inputs_for(fmt, N_RANDOM)
    ref_sat = torch.from_numpy(clamp(x, fmt)).to(dtype).float().numpy()
    assert_same_bits(ours(x, fmt, "saturate"), ref_sat, x, f"{fmt.name} saturate vs torch {dtype}")
    if dtype != torch.float8_e4m3fn:  # torch's e4m3fn cast saturates; the others overflow to ±Inf like ours
        ref = torch.from_numpy(x).to(dtype).float().numpy()
        assert_same_bits(ours(x, fmt, "overflow"), ref, x, f"{fmt.name} overflow vs torch {dtype}")


@pytest.mark.parametrize(
    "fmt, dtype",
    [(get_format("e4m3"), ml_dtypes.float8_e4m3fn), (get_format("e5m2"), ml_dtypes.float8_e5m2),
     (FloatFormat(3, 4, 3, "ieee"), ml_dtypes.float8_e3m4), (FloatFormat(4, 3, 7, "ieee"), ml_dtypes.float8_e4m3)],
    ids=["e4m3fn", "e5m2", "e3m4_bias3_ieee", "e4m3_ieee"],
)
def test_ml_dtypes(fmt: FloatFormat, dtype: type) -> None:
    x = inputs_for(fmt, N_RANDOM, seed=1)
    ref = x.astype(dtype).astype(np.float32)  # ml_dtypes overflows to Inf (or NaN without Inf)
    assert_same_bits(ours(x, fmt, "overflow"), ref, x, f"{fmt} overflow vs ml_dtypes")
    ref_sat = clamp(x, fmt).astype(dtype).astype(np.float32)
    assert_same_bits(ours(x, fmt, "saturate"), ref_sat, x, f"{fmt} saturate vs ml_dtypes")


def finite_info(fmt: FloatFormat) -> FormatInfo:
    """gfloat description of a seed format with the `finite` policy (every code a number, −0 present)."""
    return FormatInfo(fmt.name, k=fmt.bits, precision=fmt.mbits + 1, bias=fmt.bias, is_signed=True,
                      domain=Domain.Finite, has_nz=True, num_high_nans=0, has_subnormals=True,
                      is_twos_complement=False)


GFLOAT_CASES = [(get_format(f"p3109_p{p}"), format_info_p3109(8, p)) for p in range(1, 8)] + [
    (get_format(n), finite_info(get_format(n))) for n in ("e1m6", "e3m4", "e7m0")]


def gfloat_round(fi: FormatInfo, x: np.ndarray, sat: bool) -> np.ndarray:
    return gfloat.round_ndarray(fi, x.astype(np.float64), sat=sat).astype(np.float32)


def check_gfloat(fmt: FloatFormat, fi: FormatInfo, x: np.ndarray) -> None:
    assert (fmt.max, fmt.min_subnormal) == (fi.max, fi.smallest_subnormal)
    assert_same_bits(ours(x, fmt, "saturate"), gfloat_round(fi, x, sat=True), x, f"{fmt.name} saturate vs gfloat")
    if fi.domain == Domain.Extended:
        assert_same_bits(ours(x, fmt, "overflow"), gfloat_round(fi, x, sat=False), x,
                         f"{fmt.name} overflow vs gfloat")
    else:  # a finite format cannot overflow: `overflow` saturates too
        assert_same_bits(ours(x, fmt, "overflow"), ours(x, fmt, "saturate"), x, f"{fmt.name} finite overflow")


@pytest.mark.parametrize("fmt, fi", GFLOAT_CASES, ids=[f.name for f, _ in GFLOAT_CASES])
def test_gfloat(fmt: FloatFormat, fi: FormatInfo) -> None:
    # gfloat is slow (about 1 s per 10^6 values here): bf16 patterns + 2·10^5 random values by default
    check_gfloat(fmt, fi, inputs_for(fmt, 200_000, seed=2))


@pytest.mark.slow
@pytest.mark.parametrize("fmt, fi", GFLOAT_CASES, ids=[f.name for f, _ in GFLOAT_CASES])
def test_gfloat_full(fmt: FloatFormat, fi: FormatInfo) -> None:
    check_gfloat(fmt, fi, inputs_for(fmt, N_RANDOM, seed=3))


def test_e0m7_by_enumeration() -> None:
    """E = 0 is a signed fixed-point grid k/128, |k| <= 127: nearest is rint (half to even k), then clamp."""
    fmt = get_format("e0m7")
    np.testing.assert_array_equal(fmt.values().numpy(), np.arange(-127, 128, dtype=np.float32) / 128)
    x = inputs_for(fmt, N_RANDOM, seed=4)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = (np.clip(np.rint(x.astype(np.float64) * 128), -127, 127) / 128).astype(np.float32)
    assert_same_bits(ours(x, fmt, "saturate"), ref, x, "e0m7 vs enumeration")
    # and against a brute-force nearest-of-the-grid search on a sample (ties: the even code k)
    grid = fmt.values().numpy().astype(np.float64)
    xs = x[np.isfinite(x)][:20000].astype(np.float64)
    d = np.abs(xs[:, None] - grid[None, :])
    best = d.min(axis=1, keepdims=True)
    cand = np.where(d == best, grid[None, :], np.nan)
    k = np.rint(cand * 128)
    pick = np.nanmin(np.where(k % 2 == 0, cand, np.inf), axis=1)
    pick = np.where(np.isinf(pick), np.nanmin(cand, axis=1), pick)
    got = ours(xs.astype(np.float32), fmt, "saturate").astype(np.float64)
    np.testing.assert_array_equal(got, pick)

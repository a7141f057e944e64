"""encode: the integer code of each value of a tensor on a FloatFormat, rounded to nearest (ties to the even code).

The inverse of ``FloatFormat.decode``. It rounds with the eager quantize kernel, so it lives above ``rounding``:
the format module stays data that imports nothing from altgrad.
"""

from __future__ import annotations

import math

import torch

from altgrad.quant.format import FloatFormat
from altgrad.quant.rounding import quantize_eager


def code_dtype(fmt: FloatFormat) -> torch.dtype:
    """The integer dtype that holds every code of ``fmt``: uint8 up to 8 bits, else int32 (int64 past 31 bits)."""
    return torch.uint8 if fmt.bits <= 8 else (torch.int32 if fmt.bits <= 31 else torch.int64)


def nan_code(fmt: FloatFormat) -> int:
    """The canonical (positive) NaN code of a format that has one."""
    em_bits = fmt.ebits + fmt.mbits
    if fmt.policy == "p3109":
        return 1 << em_bits
    if fmt.policy == "fn":
        return (1 << em_bits) - 1
    return (((1 << fmt.ebits) - 1) << fmt.mbits) | (1 << (fmt.mbits - 1))  # ieee quiet NaN


def encode(x: torch.Tensor, fmt: FloatFormat, overflow: str = "saturate") -> torch.Tensor:
    """Integer codes of x rounded to nearest (ties to even) on ``fmt``, in ``code_dtype(fmt)``.

    NaN encodes to the policy's NaN code (the canonical positive one); a NaN for a format without NaN codes is a
    ValueError. ``overflow`` is applied as in :func:`altgrad.quant.quantize`.
    """
    q = quantize_eager(x.to(torch.float32), fmt, "nearest", overflow).to(torch.float64)
    em_bits = fmt.ebits + fmt.mbits
    nan = torch.isnan(q)
    if not fmt.has_nan and bool(nan.any()):
        raise ValueError(f"format {fmt} has no NaN code; cannot encode NaN")
    neg = torch.signbit(q) & ~nan
    a = q.abs()
    finite = torch.isfinite(a)
    af = torch.where(finite, a, 0.0)
    _, exp = torch.frexp(torch.where(af > 0, af, 1.0))
    e_unb = exp.to(torch.int64) - 1  # a = 2^e_unb · [1, 2)
    is_sub = af < math.ldexp(1.0, fmt.emin)
    sub_code = torch.round(af / fmt.quantum).to(torch.int64)
    frac = torch.ldexp(af, (fmt.mbits - e_unb)).to(torch.int64) - (1 << fmt.mbits)
    nrm_code = ((e_unb + fmt.bias) << fmt.mbits) + frac
    code = torch.where(is_sub, sub_code, nrm_code)
    inf_code = fmt.max_code + 1 if fmt.policy == "p3109" else ((1 << fmt.ebits) - 1) << fmt.mbits
    code = torch.where(torch.isinf(a), inf_code, code)
    code = torch.where(neg, code | (1 << em_bits), code)
    if fmt.has_nan:
        code = torch.where(nan, nan_code(fmt), code)
    return code.to(code_dtype(fmt))

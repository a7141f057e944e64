"""Dynamic-range use: how many of a format's octaves a tensor's magnitudes span."""

from __future__ import annotations

import math

import torch


def format_octaves(fmt) -> float:
    """log2(max / min_subnormal) of a FloatFormat: the octaves between its smallest and largest magnitude."""
    return math.log2(fmt.max / fmt.min_subnormal)


def range_use(x: torch.Tensor, fmt) -> torch.Tensor:
    """log2(amax / smallest nonzero |x|) / log2(fmt.max / fmt.min_subnormal) (0-d float32).

    Scale-free (a per-tensor scale shifts both ends alike); 0 when x has at most one distinct nonzero magnitude;
    above 1 when the tensor spans more octaves than the format can hold. Non-finite elements are ignored.
    """
    a = x.detach().float().abs().reshape(-1)
    a = torch.where(torch.isfinite(a), a, torch.zeros_like(a))
    amax = a.max()
    amin = torch.where(a > 0, a, torch.full_like(a, float("inf"))).min()
    octaves = torch.where(amax > 0, torch.log2(amax / amin), torch.zeros_like(amax))
    return octaves / format_octaves(fmt)

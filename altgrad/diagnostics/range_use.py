"""Dynamic-range use: how many of a format's octaves a tensor's magnitudes span."""

from __future__ import annotations

import math

import torch

from altgrad.quant import native


def format_octaves(fmt) -> float:
    """log2(max / min_subnormal) of a FloatFormat: the octaves between its smallest and largest magnitude."""
    return math.log2(fmt.max / fmt.min_subnormal)


def range_use(x: torch.Tensor, fmt, kernel: str = "auto") -> torch.Tensor:
    """log2(amax / smallest nonzero |x|) / log2(fmt.max / fmt.min_subnormal) (0-d float32).

    Scale-free (a per-tensor scale shifts both ends alike); 0 when x has at most one distinct nonzero magnitude;
    above 1 when the tensor spans more octaves than the format can hold. Non-finite elements are ignored.
    ``kernel`` (``quant.kernel``): ``auto`` and ``native`` read both ends in one native pass over a float32 CPU
    tensor (the same values), ``compiled`` and ``eager`` with torch's ops.
    """
    ends = _native_ends(x, kernel)
    if ends is not None:
        amax, amin = ends[0], ends[1]
    else:
        # few kernels: it runs per weight tensor on every logging step (a launch each on a GPU)
        a = torch.nan_to_num(x.detach().float().abs().reshape(-1), nan=0.0, posinf=0.0)  # non-finite → 0: ignored
        amax = a.max()
        amin = a.masked_fill(a == 0, float("inf")).min()
    octaves = torch.where(amax > 0, torch.log2(amax / amin), 0.0)
    return octaves / format_octaves(fmt)


def _native_ends(x: torch.Tensor, road: str) -> torch.Tensor | None:
    """[amax, smallest nonzero] from the native kernel, or None where it does not serve (another road, not float32
    on the CPU, an empty tensor, no kernel built)."""
    k = native.serving(road) if x.numel() and native.takes(x) else None
    return None if k is None else native.magnitude_range(k, x)

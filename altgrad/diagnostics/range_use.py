"""Dynamic-range use: how many of a format's octaves a tensor's magnitudes span."""

from __future__ import annotations

import math
from collections.abc import Sequence

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


def range_uses(xs: Sequence[torch.Tensor], fmts: Sequence, kernels: Sequence[str]) -> torch.Tensor:
    """``range_use`` of each tensor as one float32 vector, in order. Where the native pass reads every tensor's two
    ends, the arithmetic after it runs on all of them at once, format by format: it is elementwise (and the division
    by a format's octaves the same scalar op), so each value is the one ``range_use`` gives (tested bit for bit)."""
    if not xs:
        return torch.empty(0)
    ends = [_native_ends(x, k) for x, k in zip(xs, kernels)]
    if any(e is None for e in ends):
        return torch.stack([range_use(x, f, k) for x, f, k in zip(xs, fmts, kernels)])
    both = torch.stack(ends)
    amax, amin = both[:, 0], both[:, 1]
    octaves = torch.where(amax > 0, torch.log2(amax / amin), 0.0)
    by_format: dict = {}
    for i, fmt in enumerate(fmts):
        by_format.setdefault(fmt, []).append(i)
    if len(by_format) == 1:
        return octaves / format_octaves(fmts[0])
    out = torch.empty_like(octaves)
    for fmt, members in by_format.items():
        index = torch.tensor(members)
        out[index] = octaves[index] / format_octaves(fmt)
    return out

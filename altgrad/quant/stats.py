"""Cheap per-call statistics of one quantization, kept as a float32 tensor (never a Python float: no host sync).

STAT_NAMES (in order): fraction of elements saturated (|x·s| > max), fraction flushed to zero (nonzero input,
zero output), fraction landing subnormal (nonzero output below the smallest normal; every nonzero output when
ebits = 0), count of non-finite inputs, amax of the finite inputs (before scaling) and the mean scale.
"""

from __future__ import annotations

import math

import torch

from altgrad.quant import kernel_abi
from altgrad.quant.compiled import fused
from altgrad.quant.device_constants import device_constant
from altgrad.quant.format import FloatFormat

STAT_NAMES = kernel_abi.STAT_NAMES

def _stats(x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor, consts: torch.Tensor) -> torch.Tensor:
    return stats_of(x, y, scale, consts[0], consts[1])


def stats_of(x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor, max_value: torch.Tensor,
             min_normal: torch.Tensor) -> torch.Tensor:
    """STAT_NAMES values (pure tensor maths, traceable into a larger fused graph); thresholds as 0-dim tensors."""
    xf = x.to(torch.float32)
    yf = y.to(torch.float32)
    finite = torch.isfinite(xf)
    ax = torch.where(finite, xf.abs(), 0.0)
    s = scale.to(torch.float32)
    n = max(xf.numel(), 1)

    def frac(mask: torch.Tensor) -> torch.Tensor:  # count / n in float64: Triton's float32 division is approximate
        return (mask.sum().to(torch.float64) / n).to(torch.float32)

    saturated = frac(ax * s > max_value)
    zero = frac((ax > 0) & (yf == 0))
    subnormal = frac((yf != 0) & torch.isfinite(yf) & (yf.abs() * s < min_normal))
    nonfinite = (~finite).sum().to(torch.float32)
    amax = ax.amax() if xf.numel() else xf.new_zeros(())
    return torch.stack([saturated, zero, subnormal, nonfinite, amax, s.mean()]).to(torch.float32)


_fused_stats = fused(_stats)


def quant_stats(x: torch.Tensor, y: torch.Tensor, fmt: FloatFormat, scale: torch.Tensor | None = None,
                compiled: bool | None = None) -> torch.Tensor:
    """STAT_NAMES values for input x, its fake-quantized y (= q(x·s)/s) and the scale s (None = 1); ``compiled``
    None: the process default (compiled.compiles)."""
    consts = device_constant(("stats thresholds", fmt), lambda: [fmt.max, math.ldexp(1.0, fmt.emin)], torch.float32,
                             x.device)
    if scale is None:
        scale = torch.ones((), dtype=torch.float32, device=x.device)
    with torch.no_grad():
        return _fused_stats(x.detach(), y.detach(), scale.detach(), consts, compiled=compiled)

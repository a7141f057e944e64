"""Walk n grid points: a format's values indexed by a signed ordinal, so steps cross binades exactly.

For a sign-magnitude format the magnitude code is the rank of |v| among the non-negative grid values
(0 → 0, 1 → min_subnormal, …, max_code → max), so "n grid points further" is integer addition on the signed
ordinal ±code, saturating at ±max_code.  Both directions are computed from float32 bits and the quant core's
``ulp`` (no table lookup, no host sync), which keeps GridOptim's step cheap; tests check them against
``altgrad.quant.codes.encode`` / ``values()`` for every preset.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from altgrad.quant.rounding import random_bits

_MAX_MBITS = 16  # ordinals stay far inside int32: (emax − emin + 2)·2^M < 2^31


def check_walkable(fmt: Any) -> None:
    """Raise ValueError for formats whose ordinals would not fit int32 arithmetic."""
    if fmt.mbits > _MAX_MBITS:
        raise ValueError(f"grid walking supports formats with at most {_MAX_MBITS} mantissa bits; "
                         f"{fmt} has {fmt.mbits}")


def grid_ordinal(x: Tensor, fmt: Any, ulp: Tensor | None = None) -> Tensor:
    """Signed ordinal (int32) of the grid value nearest to x (ties to even; beyond ±max saturates).

    With e = ⌊log2|x|⌋ and r = round(|x| / ulp(x)), the magnitude code is 2^M·max(e − emin, 0) + r: r counts grid
    points within the binade (2^M … 2^(M+1), or 0 … 2^M in the subnormal range); r = 2^(M+1) is the next binade's
    first point, which the same formula numbers correctly.  Finite x only (callers mask non-finite values).
    """
    x = x.float()
    ulp = fmt.ulp(x) if ulp is None else ulp
    a = x.abs()
    r = torch.round(a / ulp).to(torch.int32)
    e = ((a.view(torch.int32) >> 23) & 0xFF) - 127  # float32 exponent; zero/subnormal → −127 < emin
    code = ((e - fmt.emin).clamp_(min=0) << fmt.mbits).add_(r).clamp_(max=fmt.max_code)
    return torch.where(x < 0, -code, code)


def ordinal_value(ordinal: Tensor, fmt: Any) -> Tensor:
    """float32 value of each signed ordinal in [−max_code, max_code]."""
    m = fmt.mbits
    a = ordinal.abs()
    quantum = fmt.ulp(a.new_zeros((), dtype=torch.float32))  # 2^(emin − M), the subnormal spacing
    sub = a.float() * quantum  # codes below 2^M: multiples of the quantum (exact)
    e = (a >> m) + (fmt.emin - 1)  # normal codes: exponent field (a >> M) → unbiased emin + field − 1
    bits = ((e + 127) << 23) | ((a & ((1 << m) - 1)) << (23 - m))  # (1 + mant/2^M)·2^e as float32 bits
    v = torch.where(a < (1 << m), sub, bits.view(torch.float32))
    return torch.where(ordinal < 0, -v, v)


def walk(x: Tensor, steps: Tensor, fmt: Any, ulp: Tensor | None = None) -> Tensor:
    """The grid value ``steps`` (integer-valued) points from the grid value nearest to x, saturating at ±max."""
    limit = fmt.max_code
    n = steps.clamp(-2 * limit, 2 * limit).to(torch.int32)
    return ordinal_value((grid_ordinal(x, fmt, ulp) + n).clamp_(-limit, limit), fmt)


def uniform_from_bits(bits: Tensor) -> Tensor:
    """U[0, 1) float32 from the top 24 of 32 random bits (exactly representable, never 1)."""
    return ((bits >> 8) & 0xFFFFFF).float() * 2.0**-24


def stochastic_round_move(x: Tensor, delta: Tensor, fmt: Any, uniform: Tensor) -> Tensor:
    """x + δ stochastically rounded onto the grid: the neighbour below or above the target with probabilities
    that make E[result] = x + δ exactly (saturating at ±max), whichever binades the move crosses.

    A move's length is measured in the spacing at the target, not at x: below a binade edge 2^e the grid is twice
    as fine as above it, so a step of δ downward from 2^e is δ / (ulp/2) grid points, not δ / ulp.  The target
    t = x + δ is rounded in float32; TwoSum recovers that rounding error, so the probability is exact to float32
    relative to the grid spacing however small δ is.
    """
    limit = fmt.max
    delta = delta.clamp(-2 * limit, 2 * limit)  # past saturation a longer move changes nothing; keeps t finite
    t = x + delta
    shift = t - x  # TwoSum: err = (x + δ) − t exactly
    err = (x - (t - shift)) + (delta - shift)
    ulp = fmt.ulp(t)
    low = torch.floor(t / ulp) * ulp  # grid point at or below t (exact: ulp is a power of two)
    frac = ((t - low) + err) / ulp  # t − low is exact (Sterbenz); frac ∈ [0, 1) up to err's last bit
    return (low + ulp * torch.floor(frac + uniform)).clamp(-limit, limit)


def grid_move(
    w: Tensor, direction: Tensor, grid: Any, seed: Tensor, lr: float, weight_decay: float, real_units: bool,
    second_moment: Tensor | None = None, bc1: float = 1.0, bc2_sqrt: float = 1.0, eps: float = 0.0,
) -> Tensor:
    """GridOptim's per-tensor step from the grid value nearest to w, unbiased in the unit of its learning rate.

    The inner rule's direction is d = direction/bc1, divided by √(second_moment)/bc2_sqrt + ε for Adam (so with
    Adam's moments d = m̂/(√v̂+ε)); the proposed step is δ = −lr·(d + wd·w).  ``real_units=False``: δ is a number
    of grid points k; w moves ⌊k⌋ points plus one with probability frac(k) (E[points moved] = k, on either side
    of a binade edge).  ``real_units=True``: δ is in w's units; w + δ is stochastically rounded onto the grid
    (E[new w] = w + δ, across binade edges too; ``stochastic_round_move``).  ``grid`` gives the format
    (``grid.spec.format``) and the scale s (``grid.scale_for(w)``).  Uniforms come from the quant core's
    counter-based hash of (seed, element index): the function is pure, compiles into one loop and materialises
    nothing random.  Non-finite w or δ give NaN (divergence stays visible).  Returns the new w (w's dtype),
    exactly on the grid {v / s}.
    """
    fmt = grid.spec.format
    scale = grid.scale_for(w).float()
    w32 = w.float()
    d = direction.float() / bc1
    if second_moment is not None:
        d = d / (second_moment.float().sqrt() / bc2_sqrt + eps)
    k = (d + weight_decay * w32) * -lr
    x = w32 * scale
    ulp = fmt.ulp(x)
    uniform = uniform_from_bits(random_bits(w.shape, seed))
    if real_units:
        start = walk(x, torch.zeros_like(x), fmt, ulp)  # the grid value nearest to x
        new = stochastic_round_move(start, k * scale, fmt, uniform) / scale
    else:
        new = walk(x, torch.floor(k + uniform), fmt, ulp) / scale
    return torch.where(torch.isfinite(x) & torch.isfinite(k), new, torch.nan).to(w.dtype)



def grid_move_(w: Tensor, direction: Tensor, grid: Any, seed: Tensor, hyper: Tensor, real_units: bool,
               second_moment: Tensor | None = None) -> None:
    """``grid_move`` with its scalars from ``hyper`` (``adam.hyper_tensor``), written back into ``w``."""
    lr, wd, bc1, bc2_sqrt, eps = hyper.unbind(0)
    w.copy_(grid_move(w, direction, grid, seed, lr, wd, real_units, second_moment, bc1, bc2_sqrt, eps))


def grid_adam_step_(w: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, grid: Any, seed: Tensor,
                    hyper: Tensor, real_units: bool, beta1: float, beta2: float) -> None:
    """GridOptim[adam]'s whole per-tensor step in place: Adam's moments (torch AdamW's lerp / mul / addcmul), then
    ``grid_move`` with them, written back into ``w``. One in-place function, so ``fused`` compiles moments, scale,
    ULP conversion and walk into one pass over the tensor instead of four (betas are per-run constants)."""
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    grid_move_(w, exp_avg, grid, seed, hyper, real_units, exp_avg_sq)

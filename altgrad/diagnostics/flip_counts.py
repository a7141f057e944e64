"""Flips, stalls and oscillations of quantized weights across an optimizer step; grid indices of values.

A flip is a change of a weight's quantized value, both sides quantized on the same grid (the scale in force before
the step), so a change of the tensor's scale is not a flip, and ±0 are one value. A weight's *grid index* is the
position of its quantized value in the format's sorted value list (monotone in the value, unlike sign-magnitude
codes): the latent integer state, used for code histograms and trajectories.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from altgrad.diagnostics.similarity import cosine


def index_dtype(grid_size: int) -> torch.dtype:
    """Smallest integer dtype that holds every grid index (uint8 for the 8-bit formats)."""
    if grid_size <= 256:
        return torch.uint8
    if grid_size <= 32768:
        return torch.int16
    return torch.int32


def code_index(q: torch.Tensor, fmt) -> torch.Tensor:
    """Position of each grid value q (exactly on ``fmt``'s grid, unscaled) in ``fmt.values()``, by arithmetic.

    The positive values are regular: subnormal k·2^(emin−M) has rank k, normal 2^e·(1 + f/2^M) has rank
    (e − emin + 1)·2^M + f; the index is rank(max) + sign(q)·rank(|q|). Elementwise (no search), so it fuses and
    costs a few passes; equals ``searchsorted(fmt.values(), q)`` for every format (tested against it).
    Non-finite q gives an undefined index.
    """
    a = q.detach().float().abs()
    bits = a.view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127
    f = (bits >> (23 - fmt.mbits)) & ((1 << fmt.mbits) - 1)
    normal_rank = (e - fmt.emin + 1) * (1 << fmt.mbits) + f
    subnormal_rank = torch.round(a / fmt.min_subnormal).to(torch.int32)
    min_normal = 2.0**fmt.emin if fmt.ebits > 0 else float("inf")
    rank = torch.where(a >= min_normal, normal_rank, subnormal_rank)
    top = top_rank(fmt)
    return top + torch.where(q < 0, -rank, rank)


def top_rank(fmt) -> int:
    """rank(max): the number of positive finite values of ``fmt`` (plain Python: a constant under compile)."""
    if fmt.ebits == 0 or fmt.max < 2.0**fmt.emin:
        return round(fmt.max / fmt.min_subnormal)
    m, e = math.frexp(fmt.max)  # max = m·2^e, m in [0.5, 1): exponent e − 1, fraction field (2m − 1)·2^M
    return (e - 1 - fmt.emin + 1) * (1 << fmt.mbits) + round((2 * m - 1) * (1 << fmt.mbits))


def grid_midpoints(grid: torch.Tensor) -> torch.Tensor:
    """Decision points of round-to-nearest between consecutive grid values (len(grid) − 1 of them)."""
    grid = grid.float()
    return (grid[1:] + grid[:-1]) / 2


def grid_index(x_scaled: torch.Tensor, midpoints: torch.Tensor, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """Index of the nearest grid value for each element of x_scaled (already multiplied by its scale).

    Values beyond the grid saturate to the end indices; exact midpoints round down (a measure-zero tie that
    differs from ties-to-even only in which neighbour is reported).
    """
    flat = x_scaled.detach().float().reshape(-1).contiguous()
    return torch.searchsorted(midpoints, flat).to(dtype).reshape(x_scaled.shape)


class FlipStep(NamedTuple):
    """Counts for one optimizer step of one tensor (0-d tensors on the input's device; no host sync)."""

    flips: torch.Tensor        # weights whose quantized value changed
    updated: torch.Tensor      # weights whose intended update was nonzero
    reversals: torch.Tensor    # flips opposite in direction to that weight's previous flip
    descent_cos: torch.Tensor  # cosine(intended update, applied change of the quantized weight)


def flip_counts(
    q_before: torch.Tensor,
    q_after: torch.Tensor,
    intended: torch.Tensor,
    last_direction: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[flips, updated, reversals, descent_cos] as one float32 tensor, and the new last-flip direction (int8).

    The tensor form of :func:`flip_step` (a pure elementwise + reduction function, so it fuses under compile).
    """
    applied = q_after - q_before
    direction = torch.sign(applied).to(torch.int8)
    flipped = direction != 0
    reversed_ = flipped & (direction * last_direction < 0)
    new_last = torch.where(flipped, direction, last_direction)
    counts = torch.stack([flipped.sum().float(), (intended != 0).sum().float(), reversed_.sum().float(),
                          cosine(intended, applied)])
    return counts, new_last


def segment_sums(
    q_before: torch.Tensor,
    q_after: torch.Tensor,
    intended: torch.Tensor,
    last_direction: torch.Tensor,
    segments: torch.Tensor,
    n_segments: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per segment (``segments[i]`` = the tensor of element i) the float32 sums [flipped, updated, reversed, a·b, a·a,
    b·b] (a: intended change, b: applied change q_after − q_before), and the new last-flip direction (int8)."""
    applied = q_after - q_before
    direction = torch.sign(applied).to(torch.int8)
    flipped = direction != 0
    reversed_ = flipped & (direction * last_direction < 0)
    new_last = torch.where(flipped, direction, last_direction)
    a = intended.float()
    b = applied.float()
    columns = torch.stack([flipped.float(), (a != 0).float(), reversed_.float(), a * b, a * a, b * b], dim=1)
    sums = torch.zeros(n_segments, 6, dtype=torch.float32, device=columns.device).index_add_(0, segments, columns)
    return sums, new_last


def counts_from_sums(sums: torch.Tensor) -> torch.Tensor:
    """(n_segments, 4) [flips, updated, reversals, descent_cos] from ``segment_sums``'s sums."""
    dot, na, nb = sums[:, 3], sums[:, 4], sums[:, 5]
    denom = torch.sqrt(na * nb)
    cos = torch.where(denom > 0, dot / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.zeros_like(dot))
    cos = torch.where((na == 0) & (nb == 0), torch.ones_like(cos), cos.clamp(-1.0, 1.0))
    return torch.cat([sums[:, :3], cos.unsqueeze(1)], dim=1)


def segment_flip_counts(
    q_before: torch.Tensor,
    q_after: torch.Tensor,
    intended: torch.Tensor,
    last_direction: torch.Tensor,
    segments: torch.Tensor,
    n_segments: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`flip_counts` for several tensors at once: flat inputs, ``segments[i]`` = the tensor of element i.

    Returns (n_segments, 4) [flips, updated, reversals, descent_cos] and the new last-flip direction (int8).
    One pass over all tracked weights (a few kernels in all instead of a few per tensor); dot products are
    accumulated in float32.
    """
    sums, new_last = segment_sums(q_before, q_after, intended, last_direction, segments, n_segments)
    return counts_from_sums(sums), new_last


def flip_step(
    q_before: torch.Tensor,
    q_after: torch.Tensor,
    intended: torch.Tensor,
    last_direction: torch.Tensor,
) -> tuple[FlipStep, torch.Tensor]:
    """Compare a tensor's quantized values across one optimizer step (both on the same grid: the scale in force
    before the step); returns the counts and the updated last-flip direction (int8).

    ``intended`` is the optimizer's change of the stored weight; the applied change is q_after − q_before;
    ``last_direction`` holds −1/0/+1 per weight: the direction of its most recent flip (0 = never flipped).
    Stall ratio over a window is 1 − Σflips / Σupdated; oscillation (Nagel et al. 2022) is a flip whose direction
    reverses the previous flip of the same weight.
    """
    counts, new_last = flip_counts(q_before, q_after, intended, last_direction)
    flips, updated, reversals, descent_cos = counts.unbind()
    return FlipStep(flips, updated, reversals, descent_cos), new_last


def stall_ratio(flips: float, updated: float) -> float:
    """1 − flips / updated: the share of weights the optimizer moved whose quantized value did not change.

    NaN when nothing was updated (no update, nothing to stall).
    """
    if updated <= 0:
        return float("nan")
    return max(0.0, 1.0 - flips / updated)


def ema_update(ema: torch.Tensor, value: torch.Tensor, momentum: float) -> torch.Tensor:
    """One step of an exponential moving average with weight ``momentum`` on the new value (no host sync)."""
    return ema * (1.0 - momentum) + value * momentum


def ema_updates(ema: torch.Tensor, values: torch.Tensor, momentum: float) -> torch.Tensor:
    """``ema_update`` applied for each row of ``values`` in order: the same bits as that many calls (the products of
    the new values with ``momentum`` are elementwise, so they are taken for every row at once)."""
    weighted = values * momentum
    for row in weighted.unbind(0):
        ema = ema * (1.0 - momentum) + row
    return ema


def ema_debiased(ema: float, momentum: float, steps: int) -> float:
    """Bias-corrected EMA after ``steps`` updates from 0, as Adam corrects its moments; NaN before any step.

    The mean over weights of Nagel et al.'s per-weight oscillation frequency equals the EMA of the per-step
    oscillation fraction (the EMA is linear), so no per-weight float state is needed.
    """
    if not 0.0 < momentum <= 1.0:
        raise ValueError(f"momentum={momentum} is not valid; valid: 0 < momentum <= 1")
    if steps <= 0:
        return float("nan")
    return ema / (1.0 - (1.0 - momentum) ** steps)

"""Stiffness S(w): the real-valued size of one grid step (ULP) at w, on the grid the forward pass uses for w.

With scale s the forward quantizes w·s onto format F, so the grid for w is {v / s : v ∈ F} and its spacing at w is
ulp_F(w·s) / s (``altgrad.quant.ulp.scaled_ulp``, which the diagnostics use too).  ULP-aware optimizers multiply
their step (or gradient) by S to measure learning rates in ULPs.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

from altgrad.quant.ulp import scaled_ulp

STIFFNESS_KINDS = ("pow2", "smooth")


class Grid(Protocol):
    """What an optimizer needs to know about a parameter's grid: a TensorQuantizer satisfies it."""

    spec: Any  # QuantSpec: ``spec.format`` is the FloatFormat

    def scale_for(self, x: Tensor) -> Tensor: ...


def stiffness(w: Tensor, fmt: Any, scale: Tensor | float, kind: str = "pow2") -> Tensor:
    """S(w) in w's units (float32, shape of w), never 0.

    ``pow2``: the exact grid spacing at |w|, ``fmt.ulp(w·s) / s`` = 2^(max(⌊log2|w·s|⌋, emin) − M) / s, a step
    function that doubles at every binade edge.  ``smooth``: |w|·2^−M, the same spacing without the staircase
    (within [1, 2)× of pow2 in normal binades), clamped below by the subnormal spacing min_subnormal / s, which is
    exactly pow2's value below the smallest normal.
    """
    if kind not in STIFFNESS_KINDS:
        raise ValueError(f"stiffness kind {kind!r} is not valid; valid: {', '.join(STIFFNESS_KINDS)}")
    if kind == "pow2":
        return scaled_ulp(w, fmt, scale)
    w32 = w.detach().float()
    floor = scaled_ulp(w32.new_zeros(()), fmt, scale)  # ulp(0)/s = min_subnormal/s (a tensor op, so it compiles)
    return torch.maximum(w32.abs() * 2.0 ** -fmt.mbits, floor)


def grid_stiffness(w: Tensor, grid: Grid, kind: str = "pow2") -> Tensor:
    """S(w) on ``grid``: its format at the scale ``grid.scale_for(w)`` the next forward pass would use.

    One pure function of (w, grid state), so ``altgrad.quant.compiled`` compiles scale and stiffness into one loop.
    """
    return stiffness(w, grid.spec.format, grid.scale_for(w), kind)

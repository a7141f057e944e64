"""Stiffness field S = ULP of each weight on its scaled grid, as the ULP-aware optimizers compute it.

log2 S shows how far apart the grid points are where the weights sit; corr(|g|, S) shows whether large gradients
land where the grid is coarse (helpful: big steps fit) or fine.
"""

from __future__ import annotations

import torch

from altgrad.quant.ulp import scaled_ulp


def log2_stiffness(w: torch.Tensor, fmt, scale: torch.Tensor | float) -> torch.Tensor:
    """log2 of S = ulp(w·s)/s (``altgrad.quant.ulp.scaled_ulp``) for every element (float32, w's shape); ``fmt`` is
    a FloatFormat."""
    return torch.log2(scaled_ulp(w, fmt, scale))


def pearson(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pearson correlation of two equally sized tensors (0-d float32; NaN when either is constant)."""
    a = a.detach().reshape(-1).float()
    b = b.detach().reshape(-1).float()
    a = a - a.mean()
    b = b - b.mean()
    return torch.dot(a, b) / (torch.linalg.vector_norm(a) * torch.linalg.vector_norm(b))

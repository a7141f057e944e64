"""Rank health of a weight matrix from its singular values: stable rank and effective rank."""

from __future__ import annotations

import torch


def _singular_values(w: torch.Tensor) -> torch.Tensor:
    if w.dim() != 2:
        raise ValueError(f"expected a matrix, got a tensor of shape {tuple(w.shape)}; valid: 2-d tensors")
    return torch.linalg.svdvals(w.detach().float())


def stable_rank(w: torch.Tensor) -> torch.Tensor:
    """‖W‖²_F / ‖W‖²_2 = Σσ² / σ_max² (between 1 and rank W; 0 for the zero matrix)."""
    s = _singular_values(w)
    top = s.max() ** 2
    return torch.where(top > 0, (s**2).sum() / torch.where(top > 0, top, torch.ones_like(top)), torch.zeros_like(top))


def effective_rank(w: torch.Tensor) -> torch.Tensor:
    """exp(H(p)) with p = σ / Σσ (Roy & Vetterli 2007): equals k for k equal nonzero singular values."""
    s = _singular_values(w)
    total = s.sum()
    p = s / torch.where(total > 0, total, torch.ones_like(total))
    h = -torch.special.xlogy(p, p).sum()
    return torch.where(total > 0, torch.exp(h), torch.zeros_like(h))

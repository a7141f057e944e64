"""Format utilization: how many of a format's codes a tensor actually uses, as Shannon entropy in bits."""

from __future__ import annotations

import torch


def code_histogram(indices: torch.Tensor, grid_size: int) -> torch.Tensor:
    """Count of each grid index 0..grid_size−1 (int64, on the input's device)."""
    if grid_size < 1:
        raise ValueError(f"grid_size={grid_size} is not valid; valid: >= 1")
    return torch.bincount(indices.reshape(-1).long(), minlength=grid_size)[:grid_size]


def entropy_bits(counts: torch.Tensor) -> torch.Tensor:
    """Shannon entropy −Σ p·log2 p of a histogram, in bits (0-d float32; 0·log 0 = 0).

    A tensor spread evenly over all 2^n codes of an n-bit format scores n: the "effective bits used".
    """
    counts = counts.detach().float().reshape(-1)
    total = counts.sum()
    p = counts / torch.where(total > 0, total, torch.ones_like(total))
    return -(torch.special.xlogy(p, p).sum() / torch.log(torch.tensor(2.0, device=p.device)))

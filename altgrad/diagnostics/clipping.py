"""Range-relative gradient clipping: clip each gradient to what its format can hold, not to one global norm."""

from __future__ import annotations

import torch


def clip_to_range_(grad: torch.Tensor, limit: torch.Tensor | float) -> torch.Tensor:
    """Clamp ``grad`` in place to [−limit, limit]; returns how many elements were clipped (0-d int64, no sync)."""
    limit = torch.as_tensor(limit, dtype=grad.dtype, device=grad.device)
    clipped = (grad.abs() > limit).sum()
    torch.clamp_(grad, min=-limit, max=limit)
    return clipped


def range_limit(fmt_max: float, scale: torch.Tensor | float, margin: float) -> torch.Tensor:
    """max / 2^margin / s: the largest magnitude that stays inside the format after scaling by s (s ≤ 0 → 1)."""
    s = torch.as_tensor(scale, dtype=torch.float32)
    s = torch.where(s > 0, s, torch.ones_like(s))
    return fmt_max / (2.0**margin) / s

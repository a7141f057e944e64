"""Attention entropy per head, recomputed from the fused q/k/v projection (the model uses fused SDPA kernels)."""

from __future__ import annotations

import math

import torch


def attention_probs(qkv: torch.Tensor, n_head: int, causal: bool = True) -> torch.Tensor:
    """softmax(q·kᵀ/√d) per head from nanoGPT's fused ``c_attn`` output (B, T, 3C) → (B, H, T, T)."""
    if qkv.dim() != 3 or qkv.shape[-1] % (3 * n_head) != 0:
        raise ValueError(f"expected c_attn output (B, T, 3·C) with C divisible by n_head={n_head}, "
                         f"got shape {tuple(qkv.shape)}")
    b, t, three_c = qkv.shape
    c = three_c // 3
    q, k, _ = qkv.detach().float().split(c, dim=2)
    q = q.view(b, t, n_head, c // n_head).transpose(1, 2)
    k = k.view(b, t, n_head, c // n_head).transpose(1, 2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(c // n_head)
    if causal:
        mask = torch.ones(t, t, dtype=torch.bool, device=qkv.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)


def attention_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Mean over batch and query positions of −Σ p·ln p, per head: (B, H, Tq, Tk) → (H,), in nats.

    A uniform map over T keys gives ln T; a one-hot (fully focused) map gives 0.
    """
    if probs.dim() != 4:
        raise ValueError(f"expected attention probabilities (B, H, Tq, Tk), got shape {tuple(probs.shape)}")
    h = -torch.special.xlogy(probs.float(), probs.float()).sum(-1)
    return h.mean(dim=(0, 2))

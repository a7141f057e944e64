"""The step's global gradient norm, computed once: the divergence check reads it before the optimizer step, and
gradient clipping reuses it instead of computing it again.

Clipping with the reused norm is torch's own ``clip_grad_norm_`` split in its two halves (``get_total_norm`` over
the same gradients in the same order, then ``clip_grads_with_norm_``), so the clipped gradients are the same bits.
The norm is reused only while every gradient is the tensor it was computed from, unchanged since (its storage and
version counter), and within the same optimizer step; anything else (a callback that clips or drops gradients in
between, another step) computes it afresh.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def step_grads(params: Iterable[torch.nn.Parameter]) -> list[torch.Tensor]:
    """The gradients clipping sees: those of ``params`` that exist, in order (as ``clip_grad_norm_`` takes them)."""
    return [p.grad for p in params if p.grad is not None]


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    """The optimizer's parameters, group by group (the order Lightning's precision plugins clip them in)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


class StepGradNorm:
    """Holds one step's global L2 gradient norm for reuse by clipping in the same step."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._norm: torch.Tensor | None = None

    @staticmethod
    def _key_of(grads: list[torch.Tensor], step: int) -> tuple:
        return step, tuple((g.data_ptr(), g._version, g.shape) for g in grads)

    def compute(self, grads: list[torch.Tensor], step: int) -> torch.Tensor:
        """``torch.nn.utils.get_total_norm(grads)`` (L2, non-finite allowed), kept for ``take`` at ``step``."""
        norm = torch.nn.utils.get_total_norm(grads, error_if_nonfinite=False)
        self._key, self._norm = self._key_of(grads, step), norm
        return norm

    def take(self, grads: list[torch.Tensor], step: int) -> torch.Tensor | None:
        """The kept norm when it was computed at ``step`` from exactly these unchanged gradients, else None; either
        way it is dropped (one use)."""
        key, norm = self._key, self._norm
        self._key = self._norm = None
        if key is None or not grads or key != self._key_of(grads, step):
            return None
        return norm

"""The ULP-aware optimizers' native step: ``manifold_step_`` and ``relative_step_`` as one C++ pass per tensor.

The same operations in the same order as their torch.compile'd CPU kernels (tests/optim/test_native_step.py checks
the bits), without dynamo's guards on every call and the compile in every process (the compiled step cost
ManifoldAdamW ≈ 13 ms a step more than AdamW on the small recipe: docs/benchmarks/job_profile.md). It serves
contiguous float32 CPU tensors whose grid computes one scale per tensor (scaling none, tensor or delayed); elsewhere
the optimizers run their compiled step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from altgrad.optim.stiffness import Grid
from altgrad.quant import native
from altgrad.quant.scaling import scale_consts

SCALE_KINDS = ("none", "tensor", "delayed")
"""Scalings whose scale the native step computes as a quantizer call does (one per tensor)."""


def _grid_scale(grid: Grid) -> dict | None:
    """The scale arguments of the native call for ``grid``, or None where it cannot compute that grid's scale."""
    spec, scaler = grid.spec, getattr(grid, "scaler", None)
    sc = spec.scaling
    if scaler is None or sc.kind not in SCALE_KINDS:
        return None
    state = scaler.state()
    if any(t.device.type != "cpu" or t.dtype != torch.float32 or not t.is_contiguous() for t in state):
        return None
    fmt = spec.format
    return {"emin": fmt.emin, "mbits": fmt.mbits, "kind": sc.kind, "pow2": sc.pow2,
            "consts": scale_consts(fmt, sc.margin, torch.device("cpu")),
            "scale": state[-1] if state else None, "history": state[0] if sc.kind == "delayed" else None,
            "reduce_max": sc.reduce == "max"}


def serves(*tensors: Tensor) -> bool:
    """Whether the native step can run on these tensors: the kernel is built and they are contiguous float32 CPU
    tensors of one size, outside any tracing."""
    n = tensors[0].numel()
    if not all(native.takes(t) and t.is_contiguous() and t.numel() == n for t in tensors):
        return False  # checked first: a CUDA run never builds the CPU kernel
    return native.kernel() is not None


def stiff_adam_step_(w: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, hyper: Tensor, beta1: float,
                     beta2: float, stiffness: str, on_update: bool = True, grid: Grid | None = None) -> bool:
    """One tensor's step in place, natively: ``manifold_step_`` (stiffness pow2 / smooth on ``grid``) or
    ``relative_step_`` (stiffness ``abs``, no grid). Returns False, touching nothing, where it does not serve."""
    if not serves(w, grad, exp_avg, exp_avg_sq) or hyper.device.type != "cpu" or hyper.dtype != torch.float32:
        return False
    scale: dict = {}
    if stiffness != "abs":
        found = _grid_scale(grid) if grid is not None else None
        if found is None:
            return False
        scale = found
    native.stiff_adam_step(native.kernel(), w, grad, exp_avg, exp_avg_sq, stiffness, on_update,
                           hyper.contiguous(), beta1, beta2, **scale)
    return True


def native_refusal(owner: str, p: Tensor) -> str:
    """The one-line error of ``kernel=native`` on a parameter the native step does not serve."""
    return (f"{owner}: kernel=native cannot step a {p.dtype} tensor of shape {tuple(p.shape)} on {p.device} (the "
            f"native step takes contiguous float32 CPU tensors on grids scaled {', '.join(SCALE_KINDS)}, with the "
            "kernel built); valid: kernel=auto (native where it serves, else compiled), compiled, eager")

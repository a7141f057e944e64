"""``kernel`` of the optimizers with a fused step (ManifoldAdamW, RelativeAdamW, GridOptim): how the step runs."""

from __future__ import annotations

from altgrad.quant.compiled import compile_default

STEP_KERNELS = ("compiled", "eager")
"""``compiled``: the optimizer's per-tensor step function through torch.compile (the configs' and ``make train``'s
choice); ``eager``: uncompiled torch ops (each optimizer's docstring says which, and whether its bits differ)."""


def step_kernel(kernel: str | None, owner: str) -> str:
    """``kernel`` checked (one-line ValueError naming ``owner``); None: ``compiled``, or ``eager`` inside
    ``compiled.compiling(False)``."""
    if kernel is None:
        return "compiled" if compile_default() else "eager"
    if kernel not in STEP_KERNELS:
        raise ValueError(f"{owner}: kernel={kernel!r} is not valid; valid: {', '.join(STEP_KERNELS)}")
    return kernel

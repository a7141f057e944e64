"""``kernel`` of the optimizers with a fused step (ManifoldAdamW, RelativeAdamW, GridOptim): how the step runs."""

from __future__ import annotations

from altgrad.quant.compiled import compile_default

STEP_KERNELS = ("compiled", "eager")
"""``compiled``: the optimizer's per-tensor step function through torch.compile; ``eager``: uncompiled torch ops
(each optimizer's docstring says which, and whether its bits differ)."""

NATIVE_STEP_KERNELS = ("auto", "native", "compiled", "eager")
"""The kernels of ManifoldAdamW and RelativeAdamW, whose step also exists in C++ (``altgrad.optim.native_step``, the
compiled step's bits): ``auto`` (native where it serves, else compiled: the configs' choice), ``native`` (C++ only; a
tensor it cannot serve is an error), ``compiled``, ``eager``."""


def step_kernel(kernel: str | None, owner: str, valid: tuple[str, ...] = STEP_KERNELS) -> str:
    """``kernel`` checked against ``valid`` (one-line ValueError naming ``owner``); None: ``auto`` where ``valid``
    has it, else ``compiled``, or ``eager`` inside ``compiled.compiling(False)``."""
    if kernel is None:
        if not compile_default():
            return "eager"
        return "auto" if "auto" in valid else "compiled"
    if kernel not in valid:
        raise ValueError(f"{owner}: kernel={kernel!r} is not valid; valid: {', '.join(valid)}")
    return kernel

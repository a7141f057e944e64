"""fused(fn): run a pure tensor function through torch.compile (one fused loop), falling back to eager.

Compilation is lazy and cached per device type; a failure is reported once and that device type stays eager.
Inside an outer torch.compile the function is traced as it is, so callers can compile whole models.
``ALTGRAD_COMPILE=0`` keeps everything eager (tests that do not need the compiler run much faster).
"""

from __future__ import annotations

import os
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch


def compile_enabled() -> bool:
    """Whether fused functions compile (environment variable ``ALTGRAD_COMPILE``, default on)."""
    return os.environ.get("ALTGRAD_COMPILE", "1").lower() not in ("0", "false", "no", "off", "")


def renamed(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """fn with a code object of its own called ``name``.

    dynamo keeps compiled graphs (and their recompile limit) per code object, so each configuration of a
    function built in a factory gets its own cache instead of competing for one; the name shows in profiles.
    """
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


# One shape-generic (dynamic) kernel serves tensors of every size, so Triton's pointwise autotuning, which benchmarks
# launch configs on the first call's tensor only, would fit the block size to whatever came first (measured on an
# H200: the same kernel at 2^28 elements ran 1.5x or 2.8x a copy depending on that). Inductor's size-independent
# default config is used instead.
_OPTIONS: dict[str, dict[str, Any]] = {"cuda": {"triton.autotune_pointwise": False}}


class fused:  # noqa: N801 - used like a decorator/function
    """Callable wrapper: ``fused(fn)(*args, compiled=True)``; ``compiled=False`` runs the eager function."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self._compiled: dict[str, Callable[..., Any]] = {}
        self._failed: set[str] = set()

    def __call__(self, *args: Any, compiled: bool = True) -> Any:
        if not compiled or not compile_enabled() or torch.compiler.is_compiling():
            return self.fn(*args)
        device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
        if device in self._failed:
            return self.fn(*args)
        cfn = self._compiled.get(device)
        if cfn is None:
            cfn = self._compiled[device] = torch.compile(self.fn, dynamic=True, fullgraph=True,
                                                         options=_OPTIONS.get(device))
        try:
            return cfn(*args)
        except Exception as err:  # noqa: BLE001 - any compiler failure means: use the eager function
            self._failed.add(device)
            warnings.warn(f"altgrad.quant: torch.compile of {self.fn.__name__} failed on {device} "
                          f"({type(err).__name__}: {err}); running it eagerly", stacklevel=3)
            return self.fn(*args)

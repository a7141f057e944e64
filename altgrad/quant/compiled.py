"""fused(fn): run a pure tensor function through torch.compile (one fused loop), falling back to eager.

Compilation is lazy and cached per device type; a failure is reported once and that device type stays eager.
Inside an outer torch.compile the function is traced as it is, so callers can compile whole models.
``ALTGRAD_COMPILE=0`` keeps everything eager (tests that do not need the compiler run much faster).
This is the package's compile helper: the quantizers' torch road (GPU, bf16, per-channel and per-block scales) and
the optimizers' fused steps use it; float32 CPU quantizer calls take the native kernel instead (``native``).
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


def stored_once(t: torch.Tensor) -> torch.Tensor:
    """t, written to a buffer of its own when traced by torch.compile for the CPU (identity otherwise).

    Inductor inlines a pointwise result into each consumer loop, and its C++ loops cannot hoist a load that may
    alias their output, so an unstored value is recomputed wherever it is read: a quantizer's input (read by the
    amax pass and the quantize pass) and a tensor scale's scalar arithmetic (read for every vector the quantizing
    loop writes). Not applied to GPU graphs: Triton recomputes per thread instead of going through memory.
    """
    if t.device.type != "cpu" or not torch.compiler.is_compiling():
        return t
    # Private API, torch 2.13: prims.inductor_force_stride_order (registered by torch._inductor.inductor_prims) is
    # the one way to make inductor materialise a value; tests/quant/test_compiled.py fails loudly when it changes.
    # Remove when torch offers a public "realize this buffer" hint.
    force = torch.ops.prims.inductor_force_stride_order
    if t.numel() == 1:  # stride constraints leave one-element tensors inlined: store two copies, read the first
        return force(t.reshape(1).expand(2), (1,))[0].reshape(t.shape)
    return force(t, t.stride())  # a no-op for a tensor already in memory (a graph input)


# A shape-generic (dynamic) kernel serves tensors of every size, so Triton's pointwise autotuning, which benchmarks
# launch configs on the first call's tensor only, would fit the block size to whatever came first; inductor's
# size-independent default config is used instead. On the CPU a shape-generic loop's masked vector tail puts an
# integer division per vector inside the OpenMP-outlined loop; a scalar tail loop after the vector loop
# (``cpp.enable_loop_tail_vec: False``) avoids it with the same operations per element, so the same bits.
# (Measurements: docs/benchmarks/step.md.)
_OPTIONS: dict[str, dict[str, Any]] = {"cuda": {"triton.autotune_pointwise": False},
                                       "cpu": {"cpp.enable_loop_tail_vec": False}}


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

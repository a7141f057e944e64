"""fused(fn): run a pure tensor function through torch.compile (one fused loop), falling back to eager.

Compilation is lazy and cached per device type; a failure is reported once and that device type stays eager.
Inside an outer torch.compile the function is traced as it is, so callers can compile whole models.
This is the package's compile helper: the quantizers' torch road (GPU, bf16, per-channel and per-block scales) and
the optimizers' fused steps use it; float32 CPU quantizer calls take the native kernel instead (``native``).

Which implementation runs is a choice of the caller, never of the environment: a run takes it from its config
(``quant.kernel``, ``optimizer.kernel``) and passes it down. Library calls that leave it open (``kernel=None``:
``auto``; ``compiled=None``) compile unless ``compiling(False)`` says otherwise inside a block (tests that need no
compiler, notebooks); the native CPU kernel is not a compile and still serves there.
"""

from __future__ import annotations

import contextlib
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

KERNELS = ("auto", "native", "compiled", "eager")
"""How quantizer calls run (``quant.kernel``): ``auto`` (the native CPU kernel where it serves, else compiled),
``native`` (the C++ kernel; CPU float32 only), ``compiled`` (torch.compile'd torch functions), ``eager`` (the same
torch functions uncompiled: the reference). Every road gives the same bits (tests/quant)."""

_COMPILE = [True]


def check_kernel(kernel: str, key: str = "quant.kernel", valid: tuple[str, ...] = KERNELS) -> str:
    """``kernel`` if it is one of ``valid``, else a one-line ValueError naming ``key``."""
    if kernel not in valid:
        raise ValueError(f"{key}={kernel!r} is not valid; valid: {', '.join(valid)}")
    return kernel


def compile_default() -> bool:
    """Whether calls that leave it open (``compiled=None``) compile: yes, unless inside ``compiling(False)``."""
    return _COMPILE[0]


@contextlib.contextmanager
def compiling(on: bool) -> Iterator[None]:
    """Inside the block, calls that leave the choice open compile (True) or run their torch functions eagerly."""
    before = _COMPILE[0]
    _COMPILE[0] = bool(on)
    try:
        yield
    finally:
        _COMPILE[0] = before


def compiles(compiled: bool | None) -> bool:
    """Whether a fused call compiles: ``compiled`` as given, or (None) ``compile_default()``."""
    return compile_default() if compiled is None else compiled


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
    """Callable wrapper: ``fused(fn)(*args, compiled=True)``; ``compiled=False`` runs the eager function, ``None``
    the process default (``compiles``)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self._compiled: dict[str, Callable[..., Any]] = {}
        self._failed: set[str] = set()

    def __call__(self, *args: Any, compiled: bool | None = None) -> Any:
        if not compiles(compiled) or torch.compiler.is_compiling():
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

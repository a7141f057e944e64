"""fused(fn): run a pure tensor function through torch.compile (one fused loop), falling back to eager.

Compilation is lazy and cached per device type; a failure is reported once and that device type stays eager.
Inside an outer torch.compile the function is traced as it is, so callers can compile whole models.
``ALTGRAD_COMPILE=0`` keeps everything eager (tests that do not need the compiler run much faster).

``fused(fn, static=True)`` (pure functions only: no input is mutated) adds a faster road for the calls a training
loop repeats: once one argument signature (shapes, strides, dtypes, devices of the tensors; the other arguments'
values) has been called ``STATIC_AFTER`` times (``ALTGRAD_STATIC_AFTER``, default 100) without autograd, its graph
is traced once (make_fx) and compiled by inductor for exactly those shapes, and later calls with that signature go
straight to the compiled code. A torch.compile'd function pays dynamo's frame and guard handling on every call
(about 70 µs here, more than the kernel itself on a small tensor); the direct call costs about 10 µs. Same aten
graph, same inductor kernels: the results are the same bits (tested). At most ``STATIC_LIMIT`` signatures per
function are compiled this way. The quantizers' per-call functions use it (``quant_call``: every forward and
backward call of a quantized layer), and so do the bare rounding kernels (``quantize``, ``quantize_scaled``: storage
rounding after every step, the diagnostics' re-quantizations); the batched weights (one call per step, and a 20-30 s
static compile of the unrolled graph) and the statistics of the diagnostics (called on some steps only) do not.
``static_for(*args)`` hands out the compile of one signature, so a caller that repeats it can skip even the
signature lookup (the quantizers' direct road, ``fake_quant._Direct``).
On a CUDA GPU the static kernel is also the faster one: knowing the size, inductor drops the bounds mask and Triton
autotunes the launch for it (measured on an H200 at 2^28 float32: nearest rounding at 97-100 % of a copy's
bandwidth against 77 % for the shape-generic kernel; docs/benchmarks/gpu.md).
"""

from __future__ import annotations

import os
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx
from torch.utils._pytree import tree_flatten, tree_unflatten


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
    """t, written to a buffer of its own when traced into an inductor graph for the CPU (identity otherwise).

    Inductor inlines a pointwise result into each consumer loop, and its C++ loops cannot hoist a load that may
    alias their output, so an unstored value is recomputed wherever it is read: a GELU feeding both passes of a
    quantizer (amax, then quantize) ran twice, and a tensor scale's ≈ 30 scalar operations (a float64 reciprocal
    among them) ran for every 8 elements the quantizing loop wrote (a compiled 2048×512 quantizer: 936 → 462 µs
    stored). Traced means under torch.compile or on ``fused``'s static make_fx road. Not applied to GPU graphs
    (not measured there: Triton recomputes per thread instead of going through memory).
    """
    if t.device.type != "cpu":
        return t
    if not torch.compiler.is_compiling():  # (dynamo folds this; inductor is already loaded under torch.compile)
        if get_proxy_mode() is None:  # eager: nothing to store
            return t
        from torch._inductor import inductor_prims  # noqa: F401 - registers prims.inductor_force_stride_order
    force = torch.ops.prims.inductor_force_stride_order
    if t.numel() == 1:  # stride constraints leave one-element tensors inlined: store two copies, read the first
        return force(t.reshape(1).expand(2), (1,))[0].reshape(t.shape)
    return force(t, t.stride())  # a no-op for a tensor already in memory (a graph input)


# One shape-generic (dynamic) kernel serves tensors of every size, so Triton's pointwise autotuning, which benchmarks
# launch configs on the first call's tensor only, would fit the block size to whatever came first (measured on an
# H200: the same kernel at 2^28 elements ran 1.5x or 2.8x a copy depending on that). Inductor's size-independent
# default config is used instead. A static compile is for one shape, so ``tune=True`` lets Triton autotune it
# (measured on an H200, 2^24 float32, nearest: 95 % of a copy's bandwidth tuned, 72 % with the default config); it
# costs seconds per kernel, so only the bare rounding kernels (few signatures) ask for it, not every quantizer call.
#
# On the CPU, a shape-generic loop over n = s0*s1 elements finishes its last partial vector with a masked vector
# tail whose guard, ``x0 < 8*floor(n/8)``, sits inside the OpenMP-outlined loop where the compiler cannot hoist it:
# an integer division per 8 elements, which made shape-generic quantizer kernels 2.6-3.3x their static twins. A
# scalar tail loop after the vector loop instead (``cpp.enable_loop_tail_vec: False``) measured: one 512x128 call's
# kernel 55 -> 30 µs (static: 17), the nano model's 17-weight batch 1.46 -> 0.78 ms per step, and its first compile
# 44 -> 32 s. Same operations per element, so the same bits (tests/quant compare eager, generic and static).
_OPTIONS: dict[str, dict[str, Any]] = {"cuda": {"triton.autotune_pointwise": False},
                                       "cpu": {"cpp.enable_loop_tail_vec": False}}


def _static_after() -> int:
    """``ALTGRAD_STATIC_AFTER`` (default 100; 0 = never): calls of one signature before its static compile."""
    raw = os.environ.get("ALTGRAD_STATIC_AFTER", "100")
    try:
        return max(int(raw), 0)
    except ValueError:
        raise SystemExit(f"ALTGRAD_STATIC_AFTER={raw!r} is not valid; valid: a whole number of calls "
                         "(0 = never compile per shape)") from None


# A static compile costs about a second (once per run and signature; inductor caches it on disk), so it waits until
# a signature has proven hot: a nano run's per-layer signatures switch within the first 25 steps, once-per-step
# ones (lm_head) at step 100; short runs and tests stay on the shape-generic function.
STATIC_AFTER = _static_after()
STATIC_LIMIT = 16  # static compiles per function; further signatures stay on the shape-generic torch.compile


_TENSOR = object()  # marks where the compiled graph's tensor outputs go back into the output structure


def _rebuilder(obj: Any) -> Callable[[Iterator[torch.Tensor]], Any] | None:
    """A function rebuilding ``obj``'s structure (tuples, lists, constants) around the next tensors of an iterator;
    None for structures it does not know (then pytree's unflatten does it). About 1 µs instead of pytree's ≈ 10 µs
    on a quantizer call's ``(y, stats, (state,))``."""
    if isinstance(obj, torch.Tensor):
        return next
    kind = type(obj)
    if kind is tuple or kind is list:  # (not a NamedTuple and the like: pytree rebuilds those)
        parts = [_rebuilder(o) for o in obj]
        if any(b is None for b in parts):
            return None
        return lambda it: kind([b(it) for b in parts])  # depth first, left to right: pytree's leaf order
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return lambda it: obj
    return None


class _Static:
    """One signature's inductor-compiled graph: tensors in, the function's output structure back out.

    ``compiled(*tensors)`` is the graph itself: the call's tensor arguments in order, its tensor outputs flat in
    pytree order (what a caller holding the compile, ``fused.static_for``, calls directly)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], options: dict[str, Any] | None) -> None:
        self.slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        self.template = [None if isinstance(a, torch.Tensor) else a for a in args]  # holds no tensor alive
        out: dict[str, Any] = {}

        def flat(*tensors: torch.Tensor) -> list[torch.Tensor]:
            full = list(self.template)
            for i, t in zip(self.slots, tensors):
                full[i] = t
            result = fn(*full)
            leaves, out["spec"] = tree_flatten(result)
            out["leaves"] = [_TENSOR if isinstance(x, torch.Tensor) else x for x in leaves]
            out["rebuild"] = _rebuilder(result)
            return [x for x in leaves if isinstance(x, torch.Tensor)]

        tensors = [args[i] for i in self.slots]
        self.compiled = torch._inductor.compile(make_fx(flat)(*tensors), tensors, options=options)
        self.spec, self.leaves = out["spec"], out["leaves"]
        self.rebuild = out["rebuild"] or self._unflatten  # (a bare tensor's rebuild is ``next``)

    def _unflatten(self, results: Iterator[torch.Tensor]) -> Any:
        return tree_unflatten([next(results) if x is _TENSOR else x for x in self.leaves], self.spec)

    def __call__(self, args: tuple[Any, ...]) -> Any:
        return self.rebuild(iter(self.compiled(*[args[i] for i in self.slots])))


def _signature(args: tuple[Any, ...]) -> tuple | None:
    """What a static compile is specialised on; None when a call cannot take that road (autograd, odd args)."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.requires_grad and torch.is_grad_enabled():
                return None
            key.append((a.shape, a.stride(), a.dtype, a.device))
        elif a is None or isinstance(a, (bool, int, float, str)):
            key.append((type(a), a))
        else:
            return None
    return tuple(key)


class fused:  # noqa: N801 - used like a decorator/function
    """Callable wrapper: ``fused(fn)(*args, compiled=True)``; ``compiled=False`` runs the eager function."""

    def __init__(self, fn: Callable[..., Any], static: bool = False, tune: bool = False) -> None:
        self.fn = fn
        self.static = static
        self.tune = tune  # static compiles autotune their launch config (CUDA)
        self._compiled: dict[str, Callable[..., Any]] = {}
        self._failed: set[str] = set()
        self._calls: dict[tuple, int] = {}  # signature -> calls so far (static only)
        self._static: dict[tuple, _Static | None] = {}  # None: its compile failed; stays shape-generic

    def __call__(self, *args: Any, compiled: bool = True) -> Any:
        if not compiled or not compile_enabled() or torch.compiler.is_compiling():
            return self.fn(*args)
        key = _signature(args) if self.static and STATIC_AFTER > 0 else None
        if key is not None:  # the hot road first: a signature compiled for its shapes
            fast = self._static.get(key)
            if fast is not None:
                return fast(args)
        device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
        if device in self._failed:
            return self.fn(*args)
        if key is not None and key not in self._static and len(self._static) < STATIC_LIMIT:  # past it: no counting
            n = self._calls[key] = self._calls.get(key, 0) + 1
            if n >= STATIC_AFTER:
                return self._compile_static(key, args, device)
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

    def static_for(self, *args: Any) -> _Static | None:
        """The graph compiled for exactly these arguments' signature, None while there is none (nothing is counted
        or compiled here): callers that repeat one signature can keep it and call it directly."""
        if not self.static or STATIC_AFTER <= 0 or not compile_enabled():
            return None
        key = _signature(args)
        return None if key is None else self._static.get(key)

    def _compile_static(self, key: tuple, args: tuple[Any, ...], device: str) -> Any:
        self._calls.pop(key, None)
        try:
            fast = self._static[key] = _Static(self.fn, args, None if self.tune else _OPTIONS.get(device))
            return fast(args)
        except Exception as err:  # noqa: BLE001 - the shape-generic compiled function still serves this call
            self._static[key] = None
            warnings.warn(f"altgrad.quant: static compile of {self.fn.__name__} failed on {device} "
                          f"({type(err).__name__}: {err}); keeping the shape-generic compiled function",
                          stacklevel=3)
            return self(*args)

"""quantize of large float32 CPU tensors by a hand-written AVX2 kernel (streaming.cpp): bit for bit the inductor
kernel's result, for every format, rounding mode and seed.

A kernel writing a fresh output far larger than the caches pays three memory streams with ordinary stores (read x,
read each output line for ownership, write it back); streaming stores skip the middle one. Inductor's C++ backend
emits no streaming store, so for outputs of ``STREAM_MIN_NUMEL`` elements and more ``quantize`` runs this twin of
``rounding._kernel`` instead, with streaming stores where the process keeps freed memory (``host_memory``; a fresh
mmap'd output is better served by ordinary ones); it also prefetches its input 2 KiB ahead, which the hardware
prefetcher alone left ≈ 20 % short of a streaming copy's speed. The same arithmetic runs faster here than in
inductor's kernel, stochastic rounding ≈ 3× (docs/benchmarks/quantize.md, with the measured ratios to
``x.clone()``). Below 2^22 elements (input and output then fit the 32 MiB L3) ordinary stores leave the result in
cache for its reader, and the inductor kernel stays.
The library is built on first use by inductor's C++ code cache (its compiler, flags and on-disk cache: ≈ 9 s here,
once per machine); where that fails or the CPU lacks AVX2, a warning says so once and the inductor kernel serves
every size.
"""

from __future__ import annotations

import ctypes
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch._C._functorch import is_functorch_wrapped_tensor

from altgrad.host_memory import freed_memory_kept
from altgrad.quant.fused import compile_enabled

if TYPE_CHECKING:
    from altgrad.quant.rounding import Variant

STREAM_MIN_NUMEL = 1 << 22  # 16 MiB of float32 output: input + output exceed this CPU's 32 MiB L3
_SOURCE = Path(__file__).with_suffix(".cpp")
_ROUNDING = {"nearest": 0, "stochastic": 1, "toward_zero": 2}  # streaming.cpp's enum
_FLAGS = {"bit_round": 1, "tie_flip": 2, "zero_sign": 4, "saturates": 8, "wide_quantum": 16}
_LIB: list[ctypes.CDLL | None] = []  # [] = not built yet; [None] = unavailable here


def _library() -> ctypes.CDLL | None:
    """The compiled kernel library, built once per process (None where it cannot be built or used)."""
    if _LIB:
        return _LIB[0]
    lib = None
    try:
        from torch._inductor.codecache import CppCodeCache

        lib = CppCodeCache.load(_SOURCE.read_text())
        lib.quantize_streaming.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                           ctypes.c_int, ctypes.c_int, ctypes.c_int32, ctypes.c_int, ctypes.c_int]
        lib.quantize_streaming.restype = ctypes.c_int
        if lib.streaming_lanes() == 0:
            warnings.warn("altgrad.quant: this CPU has no AVX2; large tensors keep the inductor kernel (ordinary "
                          "stores)", stacklevel=3)
            lib = None
    except Exception as err:  # noqa: BLE001 - any build failure: the inductor kernel still serves every size
        warnings.warn(f"altgrad.quant: building {_SOURCE.name} failed ({type(err).__name__}: {err}); large tensors "
                      "keep the inductor kernel", stacklevel=3)
        lib = None
    _LIB.append(lib)
    return lib


def takes_streaming(x: torch.Tensor) -> bool:
    """Whether ``quantize`` rounds x (unscaled) with the streaming kernel: a plain contiguous float32 CPU tensor of
    at least ``STREAM_MIN_NUMEL`` elements (and fewer than 2^31: the hash's int32 counter), outside any tracing,
    with the compiler on (``ALTGRAD_COMPILE=0`` keeps every kernel eager)."""
    return (not torch.compiler.is_compiling() and STREAM_MIN_NUMEL <= x.numel() < 2**31
            and x.device.type == "cpu" and x.dtype == torch.float32
            and type(x) in (torch.Tensor, torch.nn.Parameter) and x.is_contiguous()
            and not is_functorch_wrapped_tensor(x)  # (vmap, grad: no storage of their own)
            and compile_enabled() and _library() is not None)


def quantize_streaming(x: torch.Tensor, p: torch.Tensor, variant: Variant, seed: torch.Tensor | None,
                       stream: bool | None = None) -> torch.Tensor:
    """A new tensor: x rounded with the int32 kernel parameters ``p`` (``rounding._params``), a ``rounding.Variant``
    and, for stochastic rounding, the 0-dim int32 ``seed``. x: contiguous float32 on the CPU (any size below 2^31;
    ``takes_streaming`` says when it pays). ``stream``: streaming stores; by default where the process keeps freed
    memory (``host_memory``), since a freshly mmap'd output's page faults put each page in the cache already
    zeroed, and streaming past the cache then costs more than it saves (measured: 1.08× against 1.03× a clone)."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the streaming quantize kernel is not available here (see the warning issued)")
    if not (x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous() and x.numel() < 2**31):
        raise ValueError(f"quantize_streaming needs a contiguous float32 CPU tensor of < 2^31 elements, got "
                         f"{x.dtype} on {x.device}, {x.numel()} elements")
    if p.dtype != torch.int32 or p.device.type != "cpu":
        raise ValueError(f"quantize_streaming needs the int32 CPU parameter tensor, got {p.dtype} on {p.device}")
    rounding = _ROUNDING[variant.rounding]
    if rounding == _ROUNDING["stochastic"] and seed is None:
        raise ValueError("quantize_streaming: stochastic rounding needs a seed")
    flags = sum(bit for name, bit in _FLAGS.items() if getattr(variant, name))
    p = p.contiguous()
    y = torch.empty(x.shape, dtype=torch.float32)  # c10 aligns CPU storage to 64 bytes: whole streamed lines
    if y.data_ptr() % 32:
        raise RuntimeError("quantize_streaming: the output is not 32-byte aligned")
    if stream is None:
        stream = freed_memory_kept()
    if lib.quantize_streaming(x.data_ptr(), y.data_ptr(), x.numel(), p.data_ptr(), rounding, flags,
                              0 if seed is None else int(seed), int(stream), torch.get_num_threads()) != 0:
        raise RuntimeError(f"quantize_streaming: the kernel refused rounding mode {variant.rounding!r}")
    return y

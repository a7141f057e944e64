"""Shared inputs and comparisons for the quant tests (independent of the code under test)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch


def bf16_patterns() -> np.ndarray:
    """Every bfloat16 bit pattern as float32 (65,536 values: zeros, subnormals, normals, ±Inf, NaNs)."""
    return (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)


def random_inputs(n: int, lo_exp: int, hi_exp: int, seed: int = 0) -> np.ndarray:
    """n float32 values: random signs and mantissas, exponents uniform in [lo_exp, hi_exp] (clipped to float32)."""
    rng = np.random.default_rng(seed)
    e = rng.integers(max(lo_exp, -126), min(hi_exp, 127) + 1, n)
    mant = rng.integers(0, 1 << 23, n, dtype=np.int64)
    bits = ((e + 127).astype(np.int64) << 23) | mant | (rng.integers(0, 2, n) << 31)
    out = bits.astype(np.uint32).view(np.float32)
    # a slice of float32 subnormals and of raw bit patterns (NaN payloads, Inf) as well
    k = n // 20
    out[:k] = (rng.integers(0, 1 << 23, k) | (rng.integers(0, 2, k) << 31)).astype(np.uint32).view(np.float32)
    out[k:2 * k] = rng.integers(0, 1 << 32, k, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return out


def inputs_for(fmt, n: int, seed: int = 0) -> np.ndarray:
    """All bf16 patterns plus n random values concentrated on the format's range (and a little beyond)."""
    return np.concatenate([bf16_patterns(), random_inputs(n, fmt.emin - fmt.mbits - 3, fmt.emax + 2, seed)])


def bits(a) -> np.ndarray:
    a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    return a.astype(np.float32).view(np.uint32)


def assert_same_bits(ours, ref, x=None, what: str = "") -> None:
    """Bit-for-bit equal, with every NaN equal to every other NaN."""
    o = ours.numpy() if isinstance(ours, torch.Tensor) else np.asarray(ours, dtype=np.float32)
    r = np.asarray(ref, dtype=np.float32)
    bad = ~((bits(o) == bits(r)) | (np.isnan(o) & np.isnan(r)))
    if bad.any():
        i = np.flatnonzero(bad)[:8]
        where = f" at x={np.asarray(x)[i].tolist()}" if x is not None else ""
        raise AssertionError(f"{what}: {bad.sum()} mismatches{where}: ours={o[i].tolist()} ref={r[i].tolist()}")


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """The compiler off inside the block (calls that leave the kernel open run eagerly): the reference side."""
    from altgrad.quant.compiled import compiling

    with compiling(False):
        yield

"""Host memory of a training process: let glibc's malloc keep freed multi-megabyte blocks for the next step.

By default glibc serves blocks above a (dynamic) threshold with a fresh ``mmap`` and gives heap memory back to the
kernel when enough of it is free at the top. A training step frees and re-allocates the same activation and gradient
buffers every step, so memory handed back is faulted in again, page by page, in the next step. Keeping freed memory
(the same as ``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=...:glibc.malloc.trim_threshold=...:glibc.malloc.mmap_max=0``
set for the process, or a caching allocator such as jemalloc) removes those faults; the process keeps its peak heap.
The mmap threshold cannot exceed 32 MiB, so blocks above it are taken off mmap altogether (mmap_max = 0: glibc then
serves them from the heap). Measurements: docs/benchmarks/step.md.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1  # mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
MMAP_THRESHOLD = 32 * 2**20  # glibc's upper bound (64-bit): larger blocks are always mmap'd
TRIM_THRESHOLD = 2**30  # free heap kept before any is returned to the kernel


_KEPT: list[bool] = []  # [True] once keep_freed_memory succeeded in this process


def freed_memory_kept() -> bool:
    """Whether this process keeps freed memory (keep_freed_memory succeeded): a large fresh tensor is then reused
    heap memory, not a page-faulting mmap."""
    return bool(_KEPT)


def keep_freed_memory() -> bool:
    """Set glibc malloc's mmap and trim thresholds (and no mmap at all) for this process; False without glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; setting M_MMAP_THRESHOLD also turns off glibc's dynamic threshold
    kept = (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
            and mallopt(M_MMAP_MAX, 0) == 1)  # no block is mmap'd: the ones above the threshold stay in the heap
    if kept and not _KEPT:
        _KEPT.append(True)
    return kept

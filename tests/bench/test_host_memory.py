"""keep_freed_memory: freed multi-megabyte blocks are reused instead of faulted in again; train() applies it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import altgrad.train as train_mod
from altgrad.host_memory import freed_memory_kept, keep_freed_memory

from test_bench_train import tiny_cfg


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_glibc_takes_both_thresholds() -> None:
    # (its effect is measured, not asserted here: the page-faults column of `python -m altgrad.bench step`)
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True  # idempotent: train() may run several times in one process
    assert freed_memory_kept() is True


def test_train_sets_it_unless_switched_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(train_mod, "keep_freed_memory", lambda: calls.append(1) or True)
    cfg = tiny_cfg(tmp_path / "off", "trainer.keep_freed_memory=false")
    train_mod.train(cfg)
    assert calls == []
    assert tiny_cfg(tmp_path / "on").trainer.keep_freed_memory is True  # every trainer preset's default


_REUSE = """
import resource, sys, torch
from altgrad.host_memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory() is True
n = 1 << 24  # 64 MiB of float32: above the largest mmap threshold glibc accepts (32 MiB)
faults = []
for _ in range(32):  # allocated, written, freed: a step's buffers, step after step
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(n).sum()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults)
"""


def _faults(allocator: str) -> list[int]:
    done = subprocess.run([sys.executable, "-c", _REUSE, allocator], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    return [int(f) for f in done.stdout.split()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_block_above_the_mmap_threshold_is_reused_without_faults() -> None:
    # Fresh processes, as a training run starts (a pytest worker's heap carries whatever earlier tests left). The
    # first few blocks still extend the heap: torch asks for 64-byte-aligned memory, a little more than a freed block,
    # until freed neighbours merge (faults stopped after 3 to 9 rounds in 30 measured processes); then it is reused.
    kept, default = _faults("keep"), _faults("default")
    assert sum(f >= 1024 for f in kept[16:]) <= 1, f"page faults per re-allocated 64 MiB block, memory kept: {kept}"
    assert min(default[16:]) >= 16_000, f"... glibc's default (mmap'd, 16,384 pages): {default}"

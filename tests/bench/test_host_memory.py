"""keep_freed_memory: freed multi-megabyte blocks are reused instead of faulted in again; train() applies it."""

from __future__ import annotations

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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_block_above_the_mmap_threshold_is_reused_without_faults() -> None:
    import resource

    import torch

    assert keep_freed_memory() is True
    n = 1 << 24  # 64 MiB of float32: above the largest mmap threshold glibc accepts (32 MiB)
    for _ in range(2):  # allocated, written, freed (the heap settles after the second: the steady state of a run)
        torch.ones(n).sum()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(n).sum()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < 1024, f"{faults} page faults writing a re-allocated 64 MiB block (mmap'd: 16,384)"

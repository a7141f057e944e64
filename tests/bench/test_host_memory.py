"""keep_freed_memory: freed multi-megabyte blocks are reused instead of faulted in again; train() applies it."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import pytest
import torch

import altgrad.train as train_mod
from altgrad.host_memory import keep_freed_memory

from test_bench_train import tiny_cfg


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused_without_page_faults() -> None:
    assert keep_freed_memory()
    n = 12 * 2**20 // 4  # 12 MiB: past glibc's default mmap threshold, so by default a fresh mmap every time
    torch.empty(n).fill_(1.0)
    before = _faults()
    for _ in range(10):
        torch.empty(n).fill_(1.0)  # allocated, written (every page touched), freed
    # reused: no new pages (3,072 faults per allocation if each were a fresh mapping)
    assert _faults() - before < 300


def test_train_sets_it_unless_switched_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(train_mod, "keep_freed_memory", lambda: calls.append(1) or True)
    cfg = tiny_cfg(tmp_path / "off", "trainer.keep_freed_memory=false")
    train_mod.train(cfg)
    assert calls == []
    assert tiny_cfg(tmp_path / "on").trainer.keep_freed_memory is True  # every trainer preset's default

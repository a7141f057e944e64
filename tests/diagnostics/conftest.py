"""Fixtures of the diagnostics tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _fast_cpu(monkeypatch):
    """Eager quantization kernels (same numbers, no minutes of compilation on CPU) and one intra-op thread
    (the tiny tensors here only lose time to thread hand-offs on a shared machine); restored afterwards."""
    monkeypatch.setenv("ALTGRAD_COMPILE", "0")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

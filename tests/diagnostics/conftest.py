"""Fixtures of the diagnostics tests."""

from __future__ import annotations

import pytest
import torch

from altgrad.quant.compiled import compiling


@pytest.fixture(autouse=True)
def _fast_cpu():
    """Eager kernels where a call leaves the choice open (same numbers, no minutes of compilation on CPU) and one
    intra-op thread (the tiny tensors here only lose time to thread hand-offs on a shared machine); restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with compiling(False):
        yield
    torch.set_num_threads(threads)

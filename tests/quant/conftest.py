"""Quant tests run the eager kernels unless a test asks for the compiler (test_compile.py does).

They also run single-threaded: on a shared, oversubscribed 2-core machine every multi-threaded elementwise op
waits at an OpenMP barrier (10x slower here), while results do not depend on the thread count.
"""

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _eager_single_threaded(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("ALTGRAD_COMPILE", "0")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

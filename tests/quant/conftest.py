"""Quant tests run the eager kernels where a call leaves the choice open (compiling(False)), unless a test
asks for the compiler (test_compile.py, test_compiled.py do).

They also run single-threaded: on a shared, oversubscribed 2-core machine every multi-threaded elementwise op
waits at an OpenMP barrier (10x slower here), while results do not depend on the thread count.
"""

from collections.abc import Iterator

import pytest
import torch

from altgrad.quant.compiled import compiling


@pytest.fixture(autouse=True)
def _eager_single_threaded() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with compiling(False):
        yield
    torch.set_num_threads(threads)

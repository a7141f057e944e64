"""Quant tests run the eager kernels unless a test asks for the compiler (test_compile.py does)."""

import pytest


@pytest.fixture(autouse=True)
def _eager_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALTGRAD_COMPILE", "0")

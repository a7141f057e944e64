"""Fixtures of the diagnostics tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _eager_quant(monkeypatch):
    """Eager quantization kernels: the same numbers as compiled ones, without minutes of compilation on CPU."""
    monkeypatch.setenv("ALTGRAD_COMPILE", "0")

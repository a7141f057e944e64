"""`python -m altgrad.bench quantize`: its rows, columns and the kernel it names (the timings are not checked)."""

from __future__ import annotations

import re

import pytest

import altgrad.quant.compiled as compiled
from altgrad.bench import quantize as bench
from altgrad.quant import native

ROW = re.compile(r"^\| (.+?)\s+\| (.+?)\s+\|\s+([\d.]+) \|.*\|\s+([\d.]+)x \|\s+([\d.]+) \|$", re.M)


def rows_of(out: str) -> dict[tuple[str, str], float]:
    """(what, rounding) -> page faults per call, for every row of the table."""
    return {(m[1].strip(), m[2]): float(m[5]) for m in ROW.finditer(out)}


def test_every_mode_row_the_references_and_a_fault_column(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled, "_COMPILE", [False])  # eager kernels: the table, not the speed, is under test
    bench.main(["--log2n", "10", "--repeats", "5", "--warmup", "1", "--formats", "e4m3,e7m0", "--allocator",
                "default"])
    out = capsys.readouterr().out
    rows = rows_of(out)
    for fmt in ("e4m3", "e7m0"):
        assert {(fmt, r) for r in ("nearest", "stochastic", "toward_zero")} <= set(rows)
    assert ("x.clone()", "-") in rows and ("compiled x + 0 (floor)", "-") in rows
    assert ("torch float8_e4m3fn", "round trip") in rows and ("ml_dtypes float8_e5m2", "round trip") in rows
    kernel = "native (altgrad/quant/native_kernel.cpp)" if native.kernel() else "torch.compile (inductor)"
    assert f"malloc: glibc defaults; kernel: {kernel}" in out
    assert re.search(r"median over presets, stochastic: [\d.]+x clone \(worst [\d.]+x\)", out)


def test_the_native_kernel_is_named_beside_the_compiled_one(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    if native.kernel() is None:
        pytest.skip("no C++ compiler here")
    bench.main(["--log2n", "10", "--repeats", "5", "--warmup", "1", "--formats", "e5m2", "--roundings", "nearest",
                "--allocator", "default"])
    out = capsys.readouterr().out
    assert set(rows_of(out)) >= {("e5m2 (compiled kernel)", "nearest"), ("e5m2", "nearest")}
    assert "kernel: native (altgrad/quant/native_kernel.cpp)" in out

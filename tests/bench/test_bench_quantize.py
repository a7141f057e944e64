"""`python -m altgrad.bench quantize`: its rows, columns and the kernel it names (the timings are not checked)."""

from __future__ import annotations

import re

import pytest

import altgrad.quant.fused as fused
import altgrad.quant.streaming as streaming
from altgrad.bench import quantize as bench

ROW = re.compile(r"^\| (.+?)\s+\| (.+?)\s+\|\s+([\d.]+) \|.*\|\s+([\d.]+)x \|\s+([\d.]+) \|$", re.M)


def rows_of(out: str) -> dict[tuple[str, str], float]:
    """(what, rounding) -> page faults per call, for every row of the table."""
    return {(m[1].strip(), m[2]): float(m[5]) for m in ROW.finditer(out)}


def test_every_mode_row_the_references_and_a_fault_column(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALTGRAD_COMPILE", "0")  # eager kernels: the table, not the speed, is under test
    monkeypatch.setattr(fused, "STATIC_AFTER", 0)  # (the bench sets it for the process; restored afterwards)
    bench.main(["--log2n", "10", "--repeats", "5", "--warmup", "1", "--formats", "e4m3,e7m0", "--allocator",
                "default"])
    out = capsys.readouterr().out
    rows = rows_of(out)
    for fmt in ("e4m3", "e7m0"):
        assert {(fmt, r) for r in ("nearest", "stochastic", "toward_zero")} <= set(rows)
    assert ("x.clone()", "-") in rows and ("compiled x + 0 (floor)", "-") in rows
    assert ("torch float8_e4m3fn", "round trip") in rows and ("ml_dtypes float8_e5m2", "round trip") in rows
    assert "malloc: glibc defaults; kernel: inductor" in out
    assert re.search(r"median over presets, stochastic: [\d.]+x clone \(worst [\d.]+x\)", out)


def test_a_large_tensor_names_the_streaming_kernel_beside_the_inductor_one(
        capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    if streaming._library() is None:
        pytest.skip("no AVX2 or no C++ compiler here")
    monkeypatch.setattr(streaming, "STREAM_MIN_NUMEL", 512)  # 2^10 elements count as large
    monkeypatch.setattr(fused, "STATIC_AFTER", 0)
    bench.main(["--log2n", "10", "--repeats", "5", "--warmup", "1", "--formats", "e5m2", "--roundings", "nearest",
                "--allocator", "default"])
    out = capsys.readouterr().out
    assert set(rows_of(out)) >= {("e5m2 (inductor kernel)", "nearest"), ("e5m2", "nearest")}
    assert "kernel: hand-written AVX2 (altgrad/quant/streaming.cpp), ordinary stores" in out  # glibc's defaults

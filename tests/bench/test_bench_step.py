"""`python -m altgrad.bench step`: its variants and table (the timings themselves are not checked)."""

from __future__ import annotations

import re

import torch

import altgrad.quant.compiled as compiled
from altgrad.bench import step
from altgrad.callbacks.probe import quantizers

OFF, ON = "quantized, stats off (no diagnostic reads them)", "quantized, stats on (a diagnostic step)"
AMORTISED = "quantized, stats on 1 step in 4 (amortised*)"


def test_step_table_has_statistics_off_on_and_the_amortised_row(capsys, monkeypatch) -> None:
    monkeypatch.setattr(compiled, "_COMPILE", [False])  # calls that leave it open run eagerly (compiling(False))
    built: list[set[bool]] = []
    real = step.make_step

    def recording(model, compile_model, bf16=False):
        built.append({q.track_stats for q in quantizers(model)})
        return real(model, compile_model, bf16)

    monkeypatch.setattr(step, "make_step", recording)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step.main(["--steps", "1", "--warmup", "0", "--no-compile", "--batch", "1", "--stats-every", "4"])
    finally:
        torch.set_num_threads(threads)
    assert built == [set(), {False}, {True}]  # unquantized, statistics off, statistics on
    out = capsys.readouterr().out
    found = list(re.finditer(r"^off\s{2,}(.+?)\s+([\d.]+)\s+([\d.]+)(?:\s+(\d+))?$", out, flags=re.M))
    rows = {m[1].strip(): (float(m[2]), float(m[3])) for m in found}
    assert list(rows) == ["unquantized", OFF, ON, AMORTISED]
    assert [m[4] is not None for m in found] == [True, True, True, False]  # page faults per timed step
    assert rows["unquantized"][1] == 1.0
    assert abs(rows[AMORTISED][0] - (0.75 * rows[OFF][0] + 0.25 * rows[ON][0])) <= 0.02
    assert "0.75·off + 0.25·on" in out

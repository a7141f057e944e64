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


def test_format_config_is_the_composed_preset_with_fields_set_over_it() -> None:
    got = step.format_config("e4m3", rounding="stochastic")
    assert (got["name"], got["grad"], got["rounding"], got["overflow"]) == ("e4m3", "e5m2", "stochastic", "saturate")
    assert (got["scaling"]["kind"], got["scaling"]["pow2"]) == ("tensor", True)
    assert step.format_config("fp32")["grad"] is None  # the preset's own field over the base's
    assert step.format_config("fp32", grad="e5m2")["grad"] == "e5m2"


def test_format_config_names_the_valid_presets_for_an_unknown_one() -> None:
    import pytest

    with pytest.raises(SystemExit, match="'e9m9' is not a format preset; valid: .*e4m3"):
        step.format_config("e9m9")


def test_quantize_linears_quantizes_every_linear_with_statistics_as_asked() -> None:
    from altgrad.quant.layers import iter_quant_linears

    for stats in (False, True):
        model, _ = step.nano_model(0, vocab_size=257)
        n_linear = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
        step.quantize_linears(model, step.format_config("e4m3"), stats=stats)
        layers = list(iter_quant_linears(model))
        assert len(layers) == n_linear
        assert {(ql.weight_q.spec.format.name, ql.grad_q.spec.format.name) for _, ql in layers} == {("e4m3", "e5m2")}
        assert {q.track_stats for q in quantizers(model)} == {stats}


def test_the_amortised_row_defaults_to_the_jobs_logging_interval(capsys, monkeypatch) -> None:
    monkeypatch.setattr(compiled, "_COMPILE", [False])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:  # no --stats-every: trainer.log_every_n_steps as a job composes it (conf/trainer/default.yaml: 10)
        step.main(["--steps", "1", "--warmup", "0", "--no-compile", "--batch", "1"])
    finally:
        torch.set_num_threads(threads)
    assert "0.9·off + 0.1·on" in capsys.readouterr().out

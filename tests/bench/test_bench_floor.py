"""The floor bench: a step's quantizer calls, the recipes' shapes and each target's budget."""

from __future__ import annotations

import pytest

from altgrad.bench import floor
from altgrad.quant import native


def test_recipes_are_the_job_benchs() -> None:
    assert floor.recipe_shape("default") == (16, 128)  # conf: data.batch_size=16, model.block_size=128
    assert floor.recipe_shape("small") == (12, 64)  # job.RECIPES["small"]
    with pytest.raises(SystemExit, match="'tiny' is not a recipe; valid: default, small"):
        floor.recipe_shape("tiny")


def test_settings_take_torchs_default_and_refuse_a_bad_count() -> None:
    import torch

    got = floor.settings(["small"], ["default", "1"])
    assert [(s.threads, s.default_threads) for s in got] == [(torch.get_num_threads(), True), (1, False)]
    assert got[0].label == f"small recipe, default threads ({torch.get_num_threads()})"
    assert got[1].label == "small recipe, 1 thread"
    with pytest.raises(SystemExit, match="'0' is not a thread count"):
        floor.settings(["small"], ["0"])


def test_a_step_makes_51_calls_of_the_shapes_of_input_weight_and_gradient() -> None:
    model = floor._model(64, quantized=True)
    calls = floor.call_shapes(model, 768)
    assert len(calls) == 51  # 17 Linears × (input, weight, output gradient)
    # per block: c_attn 128 → 384, attn c_proj 128 → 128, c_fc 128 → 512, mlp c_proj 512 → 128; lm_head 128 → 257
    linears = [(128, 384), (128, 128), (128, 512), (512, 128)] * 4 + [(128, 257)]
    expected = sum(768 * i + o * i + 768 * o for i, o in linears)
    assert sum(a * b for _, (a, b) in calls) == expected == 7_406_464
    assert [q.role for q, _ in calls[:3]] == ["input", "weight", "grad"]


def _got(fp32: float, arith: float, stoch: float) -> dict:
    return {"ms": {"fp32 step": fp32, "e4m3 step (statistics off, no callbacks)": fp32 * 1.1,
                   "arithmetic, nearest": arith, "arithmetic, stochastic": stoch},
            "calls": 51, "elements": 7_411_456, "tokens": 768}


def test_each_target_is_judged_against_its_own_budget() -> None:
    setting = floor.Setting("small", 1, False)
    text = floor.table(setting, _got(fp32=40.0, arith=3.0, stoch=5.0))
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| `")}
    assert "| 4.00 | 3.00 | 0.75 | only if" in rows["| `e4m3` ≤ 1.10 ×"]  # budget 0.10 × 40 ms
    assert "| 2.00 | 3.00 | 1.50 | no: the arithmetic alone" in rows["| `e4m3 callbacks=none` ≤ 1.05 ×"]
    assert "| 6.00 | 5.00 | 0.83 | only if" in rows["| `e4m3 stochastic` ≤ 1.15 ×"]  # stochastic's own arithmetic
    assert "| arithmetic, nearest | 3.00 | +0.075 |" in text and "| fp32 step | 40.00 | 1.000 |" in text


@pytest.mark.skipif(native.kernel() is None or native.linear_ext() is None, reason="no native kernel or extension")
def test_the_bench_times_every_row_at_a_setting(capsys: pytest.CaptureFixture[str]) -> None:
    floor.main(["--recipes", "small", "--threads", "1", "--repeats", "1", "--steps", "1"])
    out = capsys.readouterr().out
    assert "### small recipe, 1 thread: 768 tokens a step, 51 quantizer calls, 7.41 M elements" in out
    for row in ("fp32 step", "e4m3 step (statistics off, no callbacks)", "arithmetic, nearest",
                "arithmetic, stochastic"):
        assert f"| {row} | " in out
    assert out.count("| `e4m3") == 3

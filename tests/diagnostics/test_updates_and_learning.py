"""Update sizes in ULPs (known answers, then inside Lightning training) and the "never learned" divergence rule."""

from __future__ import annotations

import math

import pytest
import torch
from diag_helpers import E4M3, TinyLM, fit, tiny_gpt
from hypothesis import given, settings
from hypothesis import strategies as st

from altgrad.callbacks.divergence import DivergenceCallback
from altgrad.callbacks.updates import UpdateCallback
from altgrad.diagnostics.ulp_updates import decile_index, summarize_updates, ulp_ratio
from altgrad.quant import get_format


def test_ulp_ratio_known_numbers() -> None:
    e4m3 = get_format("e4m3")  # 3 mantissa bits: spacing 2^(e − 3) in the binade [2^e, 2^(e+1))
    w = torch.tensor([1.0, 1.0, 1.5, -3.0, 0.3])
    dw = torch.tensor([0.05, -0.125, 0.0625, 0.25, 0.0078125])
    # spacings 0.125, 0.125, 0.125, 0.25, 2^-5 (0.3 lies in [0.25, 0.5))
    assert torch.equal(ulp_ratio(dw, w, e4m3, 1.0), torch.tensor([0.4, 1.0, 0.5, 1.0, 0.25]))  # float32, exact
    # a scale s moves the grid: S = ulp(w·s)/s; w = 1 at s = 4 sits in [4, 8): ulp 0.5 / 4 = 0.125 again
    assert torch.equal(ulp_ratio(torch.tensor([0.05]), torch.tensor([1.0]), e4m3, 4.0), torch.tensor([0.4]))
    # at s = 3 the scaled weight 3 sits in [2, 4): ulp 0.25 / 3
    assert ulp_ratio(torch.tensor([0.25 / 3]), torch.tensor([1.0]), e4m3, 3.0).item() == pytest.approx(1.0)


def test_decile_index() -> None:
    assert decile_index(torch.arange(20.0).flip(0)).tolist() == [9, 9, 8, 8, 7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2,
                                                                  1, 1, 0, 0]
    assert decile_index(torch.tensor([5.0])).tolist() == [0]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 300))
def test_decile_index_balances(n: int) -> None:
    counts = torch.bincount(decile_index(torch.randn(n, generator=torch.Generator().manual_seed(n))), minlength=10)
    assert int(counts.sum()) == n and int(counts.max() - counts.min()) <= 1


def test_summarize_updates_known_numbers() -> None:
    ratios = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.6, 0.8, 1.0, 2.0, 3.0, 4.0, float("inf")])
    rel = torch.arange(1.0, 21.0)
    dec = decile_index(rel)  # pairs (1, 2), (3, 4), ...: torch's median is the lower middle value
    out = summarize_updates(ratios, rel, dec)
    finite = ratios[:-1]
    assert out["ulp_update_q50"] == pytest.approx(float(torch.quantile(finite, 0.5)))
    assert out["ulp_update_q10"] == pytest.approx(float(torch.quantile(finite, 0.1)))
    assert out["sub_half_ulp_share"] == pytest.approx(0.4)  # 4 of the 10 finite ratios are below ½
    assert [out[f"rel_update_d{d}"] for d in range(1, 11)] == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 15.0, 17.0,
                                                                19.0]
    assert summarize_updates(torch.tensor([]), torch.tensor([]), torch.tensor([], dtype=torch.long)) == {}


def test_update_callback_in_training_records_adamw_steps_in_ulps(tmp_path) -> None:
    """AdamW's first steps are ≈ lr per weight whatever |w| is: |Δw|/|w| falls with the |w| decile, and the ULP
    ratio is ≈ lr / S. Sampled steps only; weights and losses are those of a run without the callback."""
    plain, observed = TinyLM(tiny_gpt(fmt=E4M3), lr=1e-3), TinyLM(tiny_gpt(fmt=E4M3), lr=1e-3)
    fit(plain, [], 6, tmp_path / "a")
    cb = UpdateCallback(every_n_steps=2, max_weights_per_tensor=64, seed=0)
    fit(observed, [cb], 6, tmp_path / "b")
    for a, b in zip(plain.state_dict().values(), observed.state_dict().values()):
        assert torch.equal(a, b)
    diag = observed.run_summary["diagnostics"]
    assert diag["update_steps_sampled"] == 3.0
    assert 0.0 < diag["ulp_update_q10"] <= diag["ulp_update_q50"] <= diag["ulp_update_q90"]
    assert 0.0 <= diag["sub_half_ulp_share"] <= 1.0
    assert diag["rel_update_d1"] > 10 * diag["rel_update_d10"]  # a |w|-blind step is relatively huge on small w
    with pytest.raises(ValueError, match="max_weights_per_tensor"):
        UpdateCallback(max_weights_per_tensor=0)


def test_update_callback_without_quantized_weights_records_nothing(tmp_path) -> None:
    module = TinyLM(tiny_gpt(fmt=None))
    fit(module, [UpdateCallback(every_n_steps=1)], 3, tmp_path)
    assert not any(k.startswith(("ulp_update", "rel_update")) for k in module.run_summary.get("diagnostics", {}))


def test_a_run_that_never_learns_is_flagged(tmp_path) -> None:
    def flat(module, loss):  # a loss that does not move: the run learns nothing
        return loss * 0 + 3.4657 + 0.001 * math.sin(module.trainer.global_step)

    module = TinyLM(tiny_gpt(fmt=None), hook=flat)
    trainer = fit(module, [DivergenceCallback(learn_within_steps=5, min_relative_drop=0.05)], 20, tmp_path)
    summary = module.run_summary
    assert summary["status"] == "diverged" and summary["diverged_at_step"] == 4
    assert summary["divergence_cause"].startswith("never learned: lowest training loss 3.465 after 5 steps is not "
                                                  "5% below the first (3.466)")
    assert trainer.global_step == 5


def test_a_run_that_learns_is_not_flagged_and_the_rule_is_off_by_default(tmp_path) -> None:
    def falling(module, loss):
        return loss * 0 + 4.0 / (1 + module.trainer.global_step)

    module = TinyLM(tiny_gpt(fmt=None), hook=falling)
    assert fit(module, [DivergenceCallback(learn_within_steps=5)], 8, tmp_path).global_step == 8
    assert "status" not in module.run_summary
    assert DivergenceCallback().learn_within_steps is None
    for bad in (dict(learn_within_steps=0), dict(min_relative_drop=1.5)):
        with pytest.raises(ValueError, match="is not valid"):
            DivergenceCallback(**bad)


def test_never_learned_state_survives_a_checkpoint() -> None:
    cb = DivergenceCallback(learn_within_steps=100)
    cb.never_learned(5.0)
    cb.never_learned(4.0)
    restored = DivergenceCallback(learn_within_steps=100)
    restored.load_state_dict(cb.state_dict())
    assert (restored.first_loss, restored.lowest_loss) == (5.0, 4.0)
    old = {"detector": cb.detector.state_dict()}  # a checkpoint from before the rule
    DivergenceCallback().load_state_dict(old)

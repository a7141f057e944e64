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
from altgrad.diagnostics.ulp_updates import decile_index, decile_indices, summarize_updates, ulp_ratio
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


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([0, 1, 7, 64, 4096]), min_size=1, max_size=6), st.integers(0, 2**31 - 1))
def test_decile_indices_are_each_tensors_own(sizes: list[int], seed: int) -> None:
    # tensors of one size are sorted together: each one's deciles must be those it has alone, ties (few distinct
    # values), NaN and zeros included
    g = torch.Generator().manual_seed(seed)
    tensors = []
    for n in sizes:
        x = torch.randint(0, 5, (n,), generator=g).float() if n % 2 else torch.randn(n, generator=g).abs()
        if n > 3:
            x[:: max(n // 3, 1)] = float("nan")
            x[1] = 0.0
        tensors.append(x)
    together = decile_indices(tensors)
    assert len(together) == len(tensors)
    for x, d in zip(tensors, together):
        assert torch.equal(d, decile_index(x))


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


def _sampled_steps(n_steps: int, per_step: int, seed: int = 0):
    """Synthetic sampled steps: ratios uniform in [0, 1); relative = decile + a fraction, so pairs can be checked."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n_steps):
        deciles = torch.randint(0, 10, (per_step,), generator=g).to(torch.int8)
        yield torch.rand(per_step, generator=g), deciles.float() + torch.rand(per_step, generator=g) * 0.5, deciles


def _kept(cb: UpdateCallback) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.cat(cb._ratios), torch.cat(cb._relative), torch.cat(cb._deciles)


def test_update_values_kept_are_bounded_and_a_uniform_sample() -> None:
    cb = UpdateCallback(max_values=5000, seed=3)
    for step in _sampled_steps(1000, 100):
        cb.keep(*step)
    ratios, relative, deciles = _kept(cb)
    # 100,000 values a quantity: five halvings (100,000 / 2^5 = 3,125) bring them under the bound
    assert cb.keep_level == 5
    assert 2500 <= ratios.numel() <= 5000 and 2500 <= relative.numel() <= 5000
    assert abs(ratios.numel() - 100_000 / 32) < 4 * (100_000 / 32) ** 0.5  # Binomial(100,000, 1/32)
    assert torch.equal(relative.floor().to(torch.int8), deciles)  # each kept |Δw|/|w| keeps its own decile
    assert abs((ratios < 0.5).float().mean().item() - 0.5) < 0.03  # uniform: the share below ½ survives
    early, late = (torch.cat([t for t, _, _ in _sampled_steps(1000, 100)][:500]),
                   torch.cat([t for t, _, _ in _sampled_steps(1000, 100)][500:]))
    from_early = torch.isin(ratios, early).float().mean().item()
    assert abs(from_early - 0.5) < 0.05  # early and late steps equally represented
    assert torch.isin(ratios, torch.cat([early, late])).all()  # only values that were seen


def test_update_values_below_the_bound_are_all_kept_and_resume_exactly(tmp_path) -> None:
    everything, bounded, straight = UpdateCallback(max_values=None), UpdateCallback(), UpdateCallback(max_values=700)
    for step in _sampled_steps(20, 100):
        everything.keep(*step)
        bounded.keep(*step)
        straight.keep(*step)
    assert bounded.keep_level == 0 and all(torch.equal(a, b) for a, b in zip(_kept(everything), _kept(bounded)))
    # a run stopped after 10 sampled steps and resumed from its checkpoint keeps exactly what the straight run keeps
    first = UpdateCallback(max_values=700)
    steps = list(_sampled_steps(20, 100))
    for step in steps[:10]:
        first.keep(*step)
    torch.save(first.state_dict(), tmp_path / "cb.pt")
    resumed = UpdateCallback(max_values=700)
    resumed.load_state_dict(torch.load(tmp_path / "cb.pt", weights_only=True))
    for step in steps[10:]:
        resumed.keep(*step)
    assert straight.keep_level == resumed.keep_level > 0
    assert all(torch.equal(a, b) for a, b in zip(_kept(straight), _kept(resumed)))
    with pytest.raises(ValueError, match="max_values"):
        UpdateCallback(max_values=0)


def test_update_callback_in_training_past_its_bound(tmp_path) -> None:
    """Training with a small bound: the summary says what share was kept, and training is untouched."""
    plain, observed = TinyLM(tiny_gpt(fmt=E4M3), lr=1e-3), TinyLM(tiny_gpt(fmt=E4M3), lr=1e-3)
    fit(plain, [UpdateCallback(every_n_steps=1, max_weights_per_tensor=64, seed=0)], 6, tmp_path / "a")
    fit(observed, [UpdateCallback(every_n_steps=1, max_weights_per_tensor=64, seed=0, max_values=100)], 6,
        tmp_path / "b")
    for a, b in zip(plain.state_dict().values(), observed.state_dict().values()):
        assert torch.equal(a, b)
    full, part = plain.run_summary["diagnostics"], observed.run_summary["diagnostics"]
    assert "update_values_kept_share" not in full
    assert 0 < part["update_values_kept_share"] < 1 and math.log2(part["update_values_kept_share"]).is_integer()
    assert part["update_steps_sampled"] == full["update_steps_sampled"] == 6.0
    assert 0.0 < part["ulp_update_q10"] <= part["ulp_update_q50"] <= part["ulp_update_q90"]


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

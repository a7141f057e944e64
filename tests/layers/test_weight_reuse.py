"""Outside training a QuantLinear reuses its quantized weight while nothing it depends on changed; any change
(an in-place weight update, a new spec, scaler state loaded, training mode) quantizes it again."""

from __future__ import annotations

import copy

import pytest
import torch

from altgrad.callbacks.fake_quant import FakeQuantCallback
from altgrad.model import GPT, GPTConfig
from altgrad.quant import QuantSpec, get_format, native
from altgrad.quant.fake_quant import Quantizer
from altgrad.quant.layers import iter_quant_linears


def quantized_model(fmt: dict | None = None) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32))
    FakeQuantCallback(fmt or {"name": "e4m3", "grad": "e5m2", "scaling": {"kind": "delayed", "history": 4}},
                      {"base_rules": []}).apply(model)
    return model


@pytest.fixture
def weight_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The roles of every quantizer call made (weights: ``weight``). The native Linear extension is switched off, so
    that every call, the training road's too, goes through ``quantize_now`` (the C++ node calls the kernel itself)."""
    calls: list[str] = []
    real = Quantizer.quantize_now
    monkeypatch.setattr(native, "_LINEAR", [None, "switched off by the test"])

    def spy(self: Quantizer, x: torch.Tensor, seed: torch.Tensor | None, update: bool) -> torch.Tensor:
        calls.append(self.role)
        return real(self, x, seed, update)

    monkeypatch.setattr(Quantizer, "quantize_now", spy)
    return calls


IDX = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))


def test_eval_reuses_weights_with_the_same_results(weight_calls: list[str]) -> None:
    model = quantized_model()
    reference = copy.deepcopy(model)
    model.train()
    model(IDX).sum().backward()  # a training step's forward: scaler states move, nothing is kept
    reference(IDX).sum().backward()
    model.eval()
    reference.eval()
    with torch.no_grad():
        first = model(IDX)
        weight_calls.clear()
        second = model(IDX)
        assert weight_calls.count("weight") == 0 and weight_calls.count("input") == 9  # 2 blocks × 4 + lm_head
        for m in (reference,):  # a fresh copy quantizes everything: the same values
            assert torch.equal(m(IDX), first) and torch.equal(second, first)


def test_a_changed_weight_is_quantized_again(weight_calls: list[str]) -> None:
    model = quantized_model()
    model.eval()
    with torch.no_grad():
        model(IDX)
        layer = model.transformer.h[0].mlp.c_fc
        layer.weight.mul_(3.0)  # in place: the version counter moves
        weight_calls.clear()
        out = model(IDX)
        assert weight_calls.count("weight") == 1
        fresh = copy.deepcopy(model)
        for _, m in iter_quant_linears(fresh):
            m.weight_cache = None
        assert torch.equal(fresh(IDX), out)


def test_new_state_spec_or_training_drop_the_reuse(weight_calls: list[str]) -> None:
    model = quantized_model()
    model.eval()
    layer = model.transformer.h[1].attn.c_attn
    with torch.no_grad():
        model(IDX)
        layer.weight_q.scaler.load_state_dict({"amax_history": torch.full((4,), 0.5), "scale": torch.tensor(8.0)})
        weight_calls.clear()
        model(IDX)
        assert weight_calls.count("weight") == 1  # the loaded scaler state changed the scale
        layer.weight_q.spec = QuantSpec(get_format("e5m2"))
        weight_calls.clear()
        model(IDX)
        assert weight_calls.count("weight") == 1
    model.train()
    model(IDX)
    assert all(m.weight_cache is None for _, m in iter_quant_linears(model))
    model.eval()
    weight_calls.clear()
    model(IDX)  # autograd on: nothing reused (the graph must reach the weights)
    model(IDX)
    assert weight_calls.count("weight") == 18


def test_stochastic_weight_rounding_is_never_reused(weight_calls: list[str]) -> None:
    model = quantized_model({"name": "e4m3", "grad": "e5m2", "rounding": "stochastic"})
    model.eval()
    with torch.no_grad():
        model(IDX)
        weight_calls.clear()
        model(IDX)
    assert weight_calls.count("weight") == 9

"""The instruments' layer lists: walked once, walked again when the surgery or a quantizer changes them."""

from __future__ import annotations

import gc

import torch

from altgrad.callbacks import base
from altgrad.callbacks.base import linear_layers, quantized_weights, quantizer_roles
from altgrad.callbacks.fake_quant import FakeQuantCallback
from altgrad.callbacks.fallback import switch_format
from altgrad.quant import get_format

from diag_helpers import E4M3, tiny_gpt


def fresh(model: torch.nn.Module) -> tuple[list, list, list]:
    """The three lists from a walk of the module tree now (no cache)."""
    mods = list(model.named_modules())
    return ([(n, m) for n, m in mods if isinstance(m, (base.QuantLinear, torch.nn.Linear))],
            [(n, m) for n, m in mods if isinstance(m, base.QuantLinear) and m.weight_q is not None],
            [(n, r, q) for n, m in mods if isinstance(m, base.QuantLinear) for r, q in m.quantizers()])


def cached(model: torch.nn.Module) -> tuple[list, list, list]:
    return linear_layers(model), quantized_weights(model), quantizer_roles(model)


def test_the_lists_follow_the_layer_surgery():
    model = tiny_gpt(fmt=None)
    assert cached(model) == fresh(model) and quantized_weights(model) == []
    FakeQuantCallback(E4M3, {"base_rules": []}).apply(model)  # Linear → QuantLinear, in place
    assert cached(model) == fresh(model) and len(quantized_weights(model)) > 0


def test_the_lists_follow_a_quantizer_change_and_stay_the_callers():
    model = tiny_gpt()
    roles = quantizer_roles(model)
    roles.clear()  # a caller's list is its own
    assert quantizer_roles(model) == fresh(model)[2]
    _, _, q = quantizer_roles(model)[0]
    switch_format(q, get_format("e5m2"))
    assert cached(model) == fresh(model)


def test_a_models_lists_go_with_it():
    model = tiny_gpt()
    cached(model)
    assert any(key[1] == id(model) for key in base._WALKS)
    key_id = id(model)
    del model
    gc.collect()
    assert not any(key[1] == key_id for key in base._WALKS)


def test_the_statistics_switch_and_eval_mode_keep_the_lists(monkeypatch):
    # a logging step switches every quantizer's statistics on and the next step off, and validation puts the model in
    # eval mode: none of it changes which layers or quantizers there are, so the module tree is not walked again
    # (the one-node call's plans still see the switch: changes.COUNT moves)
    from altgrad.quant import changes
    from altgrad.quant.fake_quant import set_track_stats

    model = tiny_gpt()
    first = cached(model)
    walks = []
    named_modules = type(model).named_modules

    def counting(self, *args, **kwargs):
        walks.append(1)
        return named_modules(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "named_modules", counting)
    count = changes.COUNT[0]
    quantizers = [q for _, _, q in quantizer_roles(model)]
    set_track_stats(quantizers, True)
    model.eval()
    model.train()
    set_track_stats(quantizers, False)
    assert changes.COUNT[0] > count
    assert cached(model) == first and walks == []
    switch_format(quantizers[0], get_format("e5m2"))  # a new spec is a change of what the lists hold
    again = cached(model)
    assert walks and again == fresh(model)

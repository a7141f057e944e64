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

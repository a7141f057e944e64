"""QuantLinear numerics against the quantization core, surgery, storage policy and compile-friendliness."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import altgrad.quant.quantizer_call as quantizer_call_module

from altgrad.callbacks.fake_quant import FakeQuantCallback
from altgrad.model import GPT, GPTConfig
from altgrad.quant import QuantSpec, ScalingSpec, get_format, quantize
from altgrad.quant.scaling import compute_scale
from altgrad.quant.layers import QuantLinear, iter_quant_linears, weight_grids

FORMAT = {"name": "e4m3", "grad": "e5m2", "rounding": "nearest", "overflow": "saturate",
          "scaling": {"kind": "tensor", "pow2": True}}


def lm_loss(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    logits = model(idx)
    return F.cross_entropy(logits.flatten(0, 1), idx.flatten())


def spec(name: str, kind: str = "tensor") -> QuantSpec:
    return QuantSpec(get_format(name), scaling=ScalingSpec(kind=kind, pow2=True))


def reference_fake_quant(t: torch.Tensor, s: QuantSpec, q: nn.Module) -> torch.Tensor:
    scale = q.scale_for(t)
    return quantize(t * scale, s.format) / scale


@pytest.mark.parametrize("fmt", ["e4m3", "e7m0", "e3m4"])
def test_forward_and_backward_match_the_reference(fmt):
    torch.manual_seed(0)
    lin = nn.Linear(24, 16)
    x = torch.randn(5, 24, requires_grad=True)
    ql = QuantLinear(lin, "layer", weight=spec(fmt), input=spec(fmt), grad=spec("e5m2"))
    y = ql(x)
    w_q = reference_fake_quant(lin.weight.detach(), ql.weight_q.spec, ql.weight_q)
    x_q = reference_fake_quant(x.detach(), ql.input_q.spec, ql.input_q)
    assert torch.equal(y, F.linear(x_q, w_q, lin.bias))

    grad_out = torch.randn_like(y)
    y.backward(grad_out)
    gscale = compute_scale(grad_out, get_format("e5m2"), ql.grad_q.spec.scaling)
    g_q = quantize(grad_out * gscale, get_format("e5m2")) / gscale
    # straight-through estimators: the input/weight gradients are the GEMMs of the quantized grad_output
    assert torch.equal(x.grad, g_q @ w_q)
    assert torch.equal(lin.weight.grad, g_q.T @ x_q)
    assert torch.equal(lin.bias.grad, g_q.sum(0))


def test_unquantized_roles_are_untouched():
    torch.manual_seed(1)
    lin = nn.Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    ql = QuantLinear(lin, "layer", weight=None, input=None, grad=None)
    y = ql(x)
    assert torch.equal(y, F.linear(x, lin.weight, lin.bias))
    g = torch.randn_like(y)
    y.backward(g)
    assert torch.equal(x.grad, g @ lin.weight.detach())


def test_surgery_keeps_parameters_ties_and_state_dict_keys():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0))
    params_before = {n: p for n, p in model.named_parameters()}
    keys_before = set(model.state_dict())
    FakeQuantCallback(FORMAT, {"base_rules": []}).apply(model)
    assert {n: p for n, p in model.named_parameters()} == params_before
    assert model.lm_head.weight is model.transformer.wte.weight
    assert isinstance(model.lm_head, QuantLinear) and model.lm_head.tied
    assert {k for k in model.state_dict() if k in keys_before} == keys_before
    names = [n for n, _ in iter_quant_linears(model)]
    assert len(names) == 9 and set(weight_grids(model)) == {model.get_submodule(n).weight for n in names}
    idx = torch.randint(0, 64, (2, 16))
    assert torch.isfinite(lm_loss(model, idx))


def test_master_none_keeps_every_quantized_weight_on_its_grid():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0))
    cb = FakeQuantCallback({**FORMAT, "name": "e7m0"}, {"base_rules": []}, master="none",
                           storage_rounding="stochastic")
    cb.apply(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx = torch.randint(0, 64, (4, 16))
    wte_before = model.transformer.wte.weight.detach().clone()
    for step in range(3):
        opt.zero_grad()
        lm_loss(model, idx).backward()
        opt.step()
        cb.project_weights(model, step)
        for name, ql in iter_quant_linears(model):
            if ql.tied:
                continue
            w = ql.weight.detach()
            assert torch.equal(reference_fake_quant(w, ql.weight_q.spec, ql.weight_q), w), name
    # the tied head is quantized in the forward pass only: the embedding stays a float32 master
    assert not torch.equal(model.transformer.wte.weight.detach(), wte_before)


@pytest.mark.slow
def test_quantized_block_compiles_without_graph_breaks():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=0.0))
    FakeQuantCallback(FORMAT, {"base_rules": []}).apply(model)
    block = model.transformer.h[0]
    x = torch.randn(2, 16, 16)
    quantizer_call_module._CALLS.clear()  # cold caches: the first traced call must not build functions (a break)
    explanation = torch._dynamo.explain(model)(torch.randint(0, 64, (2, 16)))
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    explanation = torch._dynamo.explain(block)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    assert torch.equal(out, block(x))
    out.sum().backward()

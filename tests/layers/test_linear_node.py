"""QuantLinear's one-node road (linear_node.py) gives the module road's bits: outputs, every gradient, scaler state,
statistics and the RNG stream, for every operand layout and switch; and it steps aside where it cannot serve."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from altgrad.callbacks.fake_quant import FakeQuantCallback
from altgrad.callbacks.probe import quantizers
from altgrad.model import GPT, GPTConfig
from altgrad.quant import QuantSpec, ScalingSpec, get_format
from altgrad.quant.fake_quant import Quantizer
from altgrad.quant.layers import QuantLinear


def spec(name: str, kind: str = "tensor", rounding: str = "nearest", pow2: bool = True) -> QuantSpec:
    return QuantSpec(get_format(name), rounding=rounding, scaling=ScalingSpec(kind=kind, pow2=pow2))


class ModuleRoad(QuantLinear):
    """The same layer, always through the quantizer modules (the reference)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_modules(x)


def pair(lin: nn.Linear, **roles) -> tuple[QuantLinear, QuantLinear]:
    node = QuantLinear(copy.deepcopy(lin), "layer", **roles)
    ref = ModuleRoad(copy.deepcopy(lin), "layer", **copy.deepcopy(roles))
    return node, ref


def state_of(m: nn.Module) -> list[torch.Tensor]:
    return [b.clone() for b in m.buffers()]


def same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int32), b.view(torch.int32))


def run(layer: QuantLinear, x0: torch.Tensor, g: torch.Tensor, x_grad: bool, seed: int) -> dict:
    x = x0.clone().requires_grad_(x_grad)
    torch.manual_seed(seed)
    y = layer(x)
    y.backward(g)
    return {"y": y.detach(), "dx": x.grad, "dw": layer.weight.grad,
            "db": None if layer.bias is None else layer.bias.grad, "buffers": state_of(layer),
            "rng": torch.randint(0, 2**31 - 1, (4,)), "node": type(y.grad_fn).__name__}


ROLES = {
    "all e4m3": dict(weight=spec("e4m3"), input=spec("e4m3"), grad=spec("e5m2")),
    "delayed, no pow2": dict(weight=spec("e4m3", "delayed", pow2=False), input=spec("e5m2", "delayed"),
                             grad=spec("e5m2", "delayed")),
    "stochastic everywhere": dict(weight=spec("e4m3", rounding="stochastic"), input=spec("e3m4", rounding="stochastic"),
                                  grad=spec("e5m2", rounding="stochastic")),
    "no scale, toward zero": dict(weight=spec("e7m0", "none", "toward_zero"), input=spec("e4m3", "none"), grad=None),
    "weight only": dict(weight=spec("e4m3"), input=None, grad=None),
    "grad only": dict(weight=None, input=None, grad=spec("e5m2", rounding="stochastic")),
    "input only": dict(weight=None, input=spec("e4m3"), grad=None),
}


@pytest.mark.parametrize("roles", list(ROLES))
@pytest.mark.parametrize("shape,out", [((37, 24), 40), ((6, 16), 8), ((3, 11, 24), 40), ((2, 3, 5, 24), 40),
                                       ((1, 24), 40)])
@pytest.mark.parametrize("bias", [False, True])
def test_one_node_equals_the_module_road(roles: str, shape: tuple[int, ...], out: int, bias: bool) -> None:
    """(6, 16) → 8 is a size where MKL's products differ with the operands' order: a wrong formula shows there."""
    torch.manual_seed(0)
    lin = nn.Linear(shape[-1], out, bias=bias)
    node, ref = pair(lin, **ROLES[roles])
    gen = torch.Generator().manual_seed(1)
    for step in range(3):  # scaler state carried from call to call
        x0 = torch.randn(*shape, generator=gen) * torch.randn(*shape, generator=gen).exp2()
        g = torch.randn(*shape[:-1], out, generator=gen) * 1e-3
        for m in (node, ref):
            m.zero_grad(set_to_none=True)
        a, b = run(node, x0, g, True, step), run(ref, x0, g, True, step)
        assert a.pop("node") == "QuantLinearFunctionBackward" and b.pop("node") != "QuantLinearFunctionBackward"
        for key in a:
            if key == "buffers":
                assert all(same(u, v) for u, v in zip(a[key], b[key])), (roles, step, key)
            else:
                assert same(a[key], b[key]), (roles, step, key)


@pytest.mark.parametrize("x_grad,w_grad", [(False, True), (True, False), (False, False)])
def test_operands_without_gradients(x_grad: bool, w_grad: bool) -> None:
    torch.manual_seed(0)
    lin = nn.Linear(16, 8, bias=True)
    node, ref = pair(lin, **ROLES["stochastic everywhere"])
    for m in (node, ref):
        m.weight.requires_grad_(w_grad)
    x0, g = torch.randn(4, 5, 16), torch.randn(4, 5, 8)
    out = []
    for m in (node, ref):
        x = x0.clone().requires_grad_(x_grad)
        torch.manual_seed(3)
        y = m(x)
        if y.requires_grad:
            y.backward(g)
        out.append((y.detach(), x.grad, m.weight.grad, m.bias.grad, torch.rand(3), state_of(m)))
    for u, v in zip(*out):
        assert all(same(p, q) for p, q in zip(u, v)) if isinstance(u, list) else same(u, v)


def test_switched_off_quantizers_are_identities() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(16, 8)
    node, ref = pair(lin, **ROLES["all e4m3"])
    for m in (node, ref):
        for _, q in m.quantizers():
            q.enabled = False
    x0, g = torch.randn(6, 16), torch.randn(6, 8)
    a, b = run(node, x0, g, True, 0), run(ref, x0, g, True, 0)
    assert same(a["y"], F.linear(x0, lin.weight, lin.bias).detach())
    assert all(same(a[k], b[k]) for k in ("y", "dx", "dw", "db"))


def test_statistics_are_recorded_as_on_the_module_road() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(32, 16, bias=False)
    node, ref = pair(lin, **ROLES["all e4m3"])
    x0, g = torch.randn(8, 32), torch.randn(8, 16) * 1e-6  # gradients deep in e5m2's subnormals
    for flag in (True, False, True):
        for m in (node, ref):
            for _, q in m.quantizers():
                q.track_stats = flag
        run(node, x0, g, True, 0)
        run(ref, x0, g, True, 0)
        for (_, p), (_, q) in zip(node.quantizers(), ref.quantizers()):
            assert same(p.stats, q.stats)


def test_a_noncontiguous_quantized_operand_replays_f_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    """A road that returned a column-major result (none does today) still gets F.linear's gradients bit for bit."""
    real = Quantizer.quantize_now

    def column_major(self: Quantizer, x: torch.Tensor, seed: torch.Tensor | None, update: bool) -> torch.Tensor:
        y = real(self, x, seed, update)
        return y.t().contiguous().t() if y.dim() == 2 else y

    monkeypatch.setattr(Quantizer, "quantize_now", column_major)
    torch.manual_seed(0)
    lin = nn.Linear(24, 40, bias=True)
    node, ref = pair(lin, **ROLES["all e4m3"])
    x0, g = torch.randn(9, 24), torch.randn(9, 40)
    a, b = run(node, x0, g, True, 0), run(ref, x0, g, True, 0)
    assert a["node"] == "QuantLinearFunctionBackward"
    assert all(same(a[k], b[k]) for k in ("y", "dx", "dw", "db"))


def test_training_steps_of_a_quantized_gpt_are_bit_identical() -> None:
    """A few AdamW steps of the nano-shaped model (tied head, every Linear quantized): the same weights, scaler
    states and statistics on both roads."""
    torch.manual_seed(0)
    base = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.1))
    fmt = {"name": "e4m3", "grad": "e5m2", "rounding": "stochastic", "scaling": {"kind": "delayed", "history": 4}}
    models = []
    for road in (QuantLinear, ModuleRoad):
        m = copy.deepcopy(base)
        FakeQuantCallback(fmt, {"base_rules": []}).apply(m)
        for module in m.modules():
            if isinstance(module, QuantLinear):
                module.__class__ = road
        models.append(m)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in models]
    idx = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(2))
    for step in range(3):
        losses = []
        for m, opt in zip(models, opts):
            torch.manual_seed(10 + step)
            loss = F.cross_entropy(m(idx).flatten(0, 1), idx.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        assert same(*losses), step
    for (n, p), (_, q) in zip(models[0].named_parameters(), models[1].named_parameters()):
        assert same(p.detach(), q.detach()), n
    for p, q in zip(quantizers(models[0]), quantizers(models[1])):
        assert all(same(u, v) for u, v in zip(p.buffers(), q.buffers()))


def test_it_steps_aside_where_it_cannot_serve() -> None:
    torch.manual_seed(0)
    ql = QuantLinear(nn.Linear(16, 8), "layer", **ROLES["all e4m3"])
    x = torch.randn(3, 16, requires_grad=True)
    assert type(ql(x).grad_fn).__name__ == "QuantLinearFunctionBackward"
    with torch.no_grad():
        assert ql(x).grad_fn is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ql(x).dtype == torch.bfloat16  # F.linear under autocast, as before
    assert type(ql(x.t().contiguous().t()).grad_fn).__name__ != "QuantLinearFunctionBackward"  # non-contiguous
    seen = []
    handle = ql.input_q.register_forward_hook(lambda m, args, out: seen.append(out))
    try:
        y = ql(x)  # a hook on a quantizer: the module road, so the hook fires
        assert len(seen) == 1 and type(y.grad_fn).__name__ != "QuantLinearFunctionBackward"
    finally:
        handle.remove()


@pytest.mark.parametrize("shape", [(1, 1), (1, 1, 1), (5, 1)])
def test_one_feature_inputs_take_the_column_major_formula(shape: tuple[int, ...]) -> None:
    """A (1, 1) folded input counts as column-major for torch's mm_mat1_backward: the other product order."""
    torch.manual_seed(0)
    node, ref = pair(nn.Linear(1, 7, bias=False), **ROLES["all e4m3"])
    x0, g = torch.randn(*shape), torch.randn(*shape[:-1], 7)
    a, b = run(node, x0, g, True, 0), run(ref, x0, g, True, 0)
    assert a["node"] == "QuantLinearFunctionBackward"
    assert all(same(a[k], b[k]) for k in ("y", "dx", "dw"))

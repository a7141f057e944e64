"""QuantLinear's one-node road (linear_node.py: the C++ node of native_linear.cpp and its Python twin) gives the module
road's bits: outputs, every gradient, scaler state, statistics and the RNG stream, for every operand layout and
switch; and it steps aside where it cannot serve."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from altgrad.callbacks.fake_quant import FakeQuantCallback
from altgrad.callbacks.probe import quantizers
from altgrad.model import GPT, GPTConfig
from altgrad.quant import QuantSpec, ScalingSpec, get_format, native
from altgrad.quant.fake_quant import Quantizer
from altgrad.quant.layers import QuantLinear
from altgrad.quant.scaling import make_scaler


@pytest.fixture(params=["cpp", "python"])
def node(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which one-node road QuantLinear takes: the C++ node (skipped where the extension cannot be built) or the
    Python node (the extension switched off: quantizers then call the kernel through ctypes)."""
    if request.param == "cpp":
        if native.kernel() is None or native.linear_ext() is None:
            pytest.skip("the native Linear extension is unavailable here")
    else:
        monkeypatch.setattr(native, "_LINEAR", [None, "switched off by the test"])
    return request.param


def one_node(y: torch.Tensor, kind: str) -> bool:
    """Whether y came out of the one-node road of that kind."""
    name = y.grad_fn.name() if y.grad_fn is not None else ""
    return name == ("torch::autograd::CppNode<altgrad::QuantLinearFn>" if kind == "cpp"
                    else "QuantLinearFunctionBackward")


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
            "rng": torch.randint(0, 2**31 - 1, (4,)), "node": y}


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
def test_one_node_equals_the_module_road(node: str, roles: str, shape: tuple[int, ...], out: int, bias: bool) -> None:
    """(6, 16) → 8 is a size where MKL's products differ with the operands' order: a wrong formula shows there."""
    torch.manual_seed(0)
    lin = nn.Linear(shape[-1], out, bias=bias)
    layer, ref = pair(lin, **ROLES[roles])
    gen = torch.Generator().manual_seed(1)
    for step in range(3):  # scaler state carried from call to call
        x0 = torch.randn(*shape, generator=gen) * torch.randn(*shape, generator=gen).exp2()
        g = torch.randn(*shape[:-1], out, generator=gen) * 1e-3
        for m in (layer, ref):
            m.zero_grad(set_to_none=True)
        a, b = run(layer, x0, g, True, step), run(ref, x0, g, True, step)
        assert one_node(a.pop("node"), node) and not one_node(b.pop("node"), node)
        for key in a:
            if key == "buffers":
                assert all(same(u, v) for u, v in zip(a[key], b[key])), (roles, step, key)
            else:
                assert same(a[key], b[key]), (roles, step, key)


@pytest.mark.parametrize("x_grad,w_grad", [(False, True), (True, False), (False, False)])
def test_operands_without_gradients(node: str, x_grad: bool, w_grad: bool) -> None:
    torch.manual_seed(0)
    lin = nn.Linear(16, 8, bias=True)
    layer, ref = pair(lin, **ROLES["stochastic everywhere"])
    for m in (layer, ref):
        m.weight.requires_grad_(w_grad)
    x0, g = torch.randn(4, 5, 16), torch.randn(4, 5, 8)
    out = []
    for m in (layer, ref):
        x = x0.clone().requires_grad_(x_grad)
        torch.manual_seed(3)
        y = m(x)
        if y.requires_grad:
            y.backward(g)
        out.append((y.detach(), x.grad, m.weight.grad, m.bias.grad, torch.rand(3), state_of(m)))
    for u, v in zip(*out):
        assert all(same(p, q) for p, q in zip(u, v)) if isinstance(u, list) else same(u, v)


def test_switched_off_quantizers_are_identities(node: str) -> None:
    torch.manual_seed(0)
    lin = nn.Linear(16, 8)
    layer, ref = pair(lin, **ROLES["all e4m3"])
    for m in (layer, ref):
        for _, q in m.quantizers():
            q.enabled = False
    x0, g = torch.randn(6, 16), torch.randn(6, 8)
    a, b = run(layer, x0, g, True, 0), run(ref, x0, g, True, 0)
    assert one_node(a["node"], node)
    assert same(a["y"], F.linear(x0, lin.weight, lin.bias).detach())
    assert all(same(a[k], b[k]) for k in ("y", "dx", "dw", "db"))


def test_statistics_are_recorded_as_on_the_module_road(node: str) -> None:
    """Including a switch of track_stats between a forward and its backward: the gradient's statistics follow the
    switch as it is when the backward runs."""
    torch.manual_seed(0)
    lin = nn.Linear(32, 16, bias=False)
    layer, ref = pair(lin, **ROLES["all e4m3"])
    gen = torch.Generator().manual_seed(5)
    for forward_flag, backward_flag in ((True, True), (False, False), (True, False), (False, True), (True, True)):
        x0 = torch.randn(8, 32, generator=gen)
        g = torch.randn(8, 16, generator=gen) * 1e-6  # gradients deep in e5m2's subnormals
        for m in (layer, ref):
            for _, q in m.quantizers():
                q.track_stats = forward_flag
            y = m(x0.clone().requires_grad_(True))
            m.grad_q.track_stats = backward_flag
            y.backward(g)
        for (_, p), (_, q) in zip(layer.quantizers(), ref.quantizers()):
            assert same(p.stats, q.stats), (forward_flag, backward_flag, p.role)


def test_a_noncontiguous_quantized_operand_replays_f_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    """A road that returned a column-major result (none does today) still gets F.linear's gradients bit for bit
    (the Python node: the C++ one calls the kernel itself and its results are contiguous)."""
    monkeypatch.setattr(native, "_LINEAR", [None, "switched off by the test"])
    real = Quantizer.quantize_now

    def column_major(self: Quantizer, x: torch.Tensor, seed: torch.Tensor | None, update: bool) -> torch.Tensor:
        y = real(self, x, seed, update)
        return y.t().contiguous().t() if y.dim() == 2 else y

    monkeypatch.setattr(Quantizer, "quantize_now", column_major)
    torch.manual_seed(0)
    lin = nn.Linear(24, 40, bias=True)
    layer, ref = pair(lin, **ROLES["all e4m3"])
    x0, g = torch.randn(9, 24), torch.randn(9, 40)
    a, b = run(layer, x0, g, True, 0), run(ref, x0, g, True, 0)
    assert one_node(a["node"], "python")
    assert all(same(a[k], b[k]) for k in ("y", "dx", "dw", "db"))


def test_training_steps_of_a_quantized_gpt_are_bit_identical(node: str) -> None:
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


def test_it_steps_aside_where_it_cannot_serve(node: str) -> None:
    torch.manual_seed(0)
    ql = QuantLinear(nn.Linear(16, 8), "layer", **ROLES["all e4m3"])
    x = torch.randn(3, 16, requires_grad=True)
    assert one_node(ql(x), node)
    with torch.no_grad():
        assert ql(x).grad_fn is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ql(x).dtype == torch.bfloat16  # F.linear under autocast, as before
    wide = torch.randn(16, 3, requires_grad=True)
    assert type(ql(wide.t()).grad_fn).__name__ == "_QuantGradBackward"  # a non-contiguous input: the module road
    seen = []
    handle = ql.input_q.register_forward_hook(lambda m, args, out: seen.append(out))
    try:
        y = ql(x)  # a hook on a quantizer: the module road, so the hook fires
        assert len(seen) == 1 and not one_node(y, node)
    finally:
        handle.remove()


def test_a_quantizer_off_the_native_road_takes_the_python_node() -> None:
    """quant.kernel=eager (or any quantizer the kernel cannot serve) still gets one node: the Python one."""
    torch.manual_seed(0)
    lin = nn.Linear(16, 8)
    roles = ROLES["stochastic everywhere"]
    layer = QuantLinear(copy.deepcopy(lin), "layer", **roles, kernel="eager")
    ref = ModuleRoad(copy.deepcopy(lin), "layer", **copy.deepcopy(roles), kernel="eager")
    x0, g = torch.randn(5, 16), torch.randn(5, 8)
    a, b = run(layer, x0, g, True, 0), run(ref, x0, g, True, 0)
    assert one_node(a["node"], "python")
    assert all(same(a[k], b[k]) for k in ("y", "dx", "dw", "db", "rng"))


@pytest.mark.parametrize("shape", [(1, 1), (1, 1, 1), (5, 1)])
def test_one_feature_inputs_take_the_column_major_formula(node: str, shape: tuple[int, ...]) -> None:
    """A (1, 1) folded input counts as column-major for torch's mm_mat1_backward: the other product order."""
    torch.manual_seed(0)
    layer, ref = pair(nn.Linear(1, 7, bias=False), **ROLES["all e4m3"])
    x0, g = torch.randn(*shape), torch.randn(*shape[:-1], 7)
    a, b = run(layer, x0, g, True, 0), run(ref, x0, g, True, 0)
    assert one_node(a["node"], node)
    assert all(same(a[k], b[k]) for k in ("y", "dx", "dw"))


def test_a_change_after_the_first_call_is_seen(node: str) -> None:
    """The resolution kept on the layer follows later changes: a switch, a new spec, training mode, a deep copy."""
    torch.manual_seed(0)
    lin = nn.Linear(16, 8)
    layer, ref = pair(lin, **ROLES["all e4m3"])
    x0, g = torch.randn(5, 16) * 100, torch.randn(5, 8)

    def both(what: str) -> None:
        a, b = run(layer, x0, g, True, 0), run(ref, x0, g, True, 0)
        assert one_node(a["node"], node), what
        assert all(same(a[k], b[k]) for k in ("y", "dx", "dw", "db")), what
        assert all(same(u, v) for u, v in zip(a["buffers"], b["buffers"])), what

    both("first call")
    for m in (layer, ref):
        m.input_q.enabled = False
    both("input quantizer switched off")
    for m in (layer, ref):
        m.input_q.enabled = True
        m.weight_q.spec = spec("e3m4", "delayed")
        m.weight_q.scaler = make_scaler(m.weight_q.spec.scaling, m.weight_q.spec.format)
    both("a new weight spec")
    for m in (layer, ref):
        m.eval()
    both("eval mode: no scaler update")
    for m in (layer, ref):
        m.train()
    copied, copied_ref = copy.deepcopy(layer), copy.deepcopy(ref)
    before = state_of(layer)
    a, b = run(copied, x0 * 3, g, True, 0), run(copied_ref, x0 * 3, g, True, 0)
    assert one_node(a["node"], node) and all(same(a[k], b[k]) for k in ("y", "dx", "dw"))
    assert all(same(u, v) for u, v in zip(state_of(layer), before))  # the copy wrote its own buffers


def test_every_road_gives_the_same_bits_and_names_its_node() -> None:
    """linear_node.road picks the C++ node (auto, where the extension is built), the Python node or the module road
    for one layer in training: outputs, every gradient, scaler state and the RNG stream equal on all three."""
    from altgrad.quant import linear_node

    torch.manual_seed(0)
    layer = QuantLinear(nn.Linear(24, 40), "layer", **ROLES["stochastic everywhere"])
    x0, g = torch.randn(3, 7, 24), torch.randn(3, 7, 40)
    built = native.kernel() is not None and native.linear_ext() is not None
    nodes = {"auto": "CppNode<altgrad::QuantLinearFn>" if built else "QuantLinearFunctionBackward",
             "python": "QuantLinearFunctionBackward", "modules": "_QuantGradBackward"}
    got = {}
    for name in linear_node.ROADS:
        copied = copy.deepcopy(layer)
        with linear_node.road(name):
            got[name] = run(copied, x0, g, True, 0)
        assert nodes[name] in got[name]["node"].grad_fn.name(), name
    for name in ("python", "modules"):
        assert all(same(got["auto"][k], got[name][k]) for k in ("y", "dx", "dw", "db", "rng")), name
        assert all(same(u, v) for u, v in zip(got["auto"]["buffers"], got[name]["buffers"])), name
    with pytest.raises(ValueError, match="road 'fast' is not valid; valid: auto, python, modules"):
        with linear_node.road("fast"):
            pass

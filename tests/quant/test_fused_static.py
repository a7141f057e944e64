"""fused(fn, static=True): repeated signatures move to a per-shape inductor compile with the same bits."""

from __future__ import annotations

import pytest
import torch
from torch.utils._pytree import tree_flatten
from quant_testlib import assert_same_bits, eager

import altgrad.quant.fused as fused_mod
from altgrad.quant import (GradQuantizer, QuantSpec, ScalingSpec, TensorQuantizer, get_format, quantize,
                           quantize_scaled)
from altgrad.quant.fake_quant import _Direct, _plan
from altgrad.quant.fused import _rebuilder, _signature, fused
from altgrad.quant.rounding import _kernel, _kernel_for, draw_seed, kernel_params, kernel_variant


@pytest.fixture(autouse=True)
def _compile_soon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALTGRAD_COMPILE", "1")
    monkeypatch.setattr(fused_mod, "STATIC_AFTER", 2)


def _static_compiles(f: fused) -> int:
    return sum(v is not None for v in f._static.values())


def test_static_and_generic_kernels_agree_and_the_limit_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_mod, "STATIC_LIMIT", 1)
    fmt = get_format("e3m4")
    v = kernel_variant(fmt, "nearest", "overflow")
    p = kernel_params(fmt, "nearest", "overflow", torch.device("cpu"))
    f = fused(lambda x, p, s: _kernel(x, p, v, s, None), static=True)
    for n in (1000, 999):  # the second signature exceeds the limit: it stays on the shape-generic function
        x = torch.randn(n) * 10
        s = torch.tensor(0.5)
        ref = _kernel(x, p, v, s, None)
        for _ in range(4):
            assert_same_bits(f(x, p, s), ref.numpy(), x.numpy(), f"n={n}")
    assert _static_compiles(f) == 1 and len(f._static) == 1


def test_signature_refuses_autograd_inputs_and_unknown_arguments() -> None:
    x = torch.ones(3, requires_grad=True)
    assert _signature((x,)) is None
    with torch.no_grad():
        assert _signature((x, None, True, 2)) is not None
    assert _signature((torch.ones(2), [1, 2])) is None


def test_a_failing_static_compile_warns_once_and_keeps_the_generic_result(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("no compiler today")

    monkeypatch.setattr(fused_mod, "_Static", boom)
    f = fused(lambda a, b: (a * 2 + b, None), static=True)
    x, y = torch.arange(6.0), torch.ones(6)
    with pytest.warns(UserWarning, match="static compile of"):
        for _ in range(3):
            out, none = f(x, y)
    assert torch.equal(out, x * 2 + 1) and none is None
    assert list(f._static.values()) == [None]


def test_static_after_comes_from_the_environment_with_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALTGRAD_STATIC_AFTER", "0")
    assert fused_mod._static_after() == 0  # never
    monkeypatch.setenv("ALTGRAD_STATIC_AFTER", "often")
    with pytest.raises(SystemExit, match="ALTGRAD_STATIC_AFTER='often' is not valid; valid: a whole number"):
        fused_mod._static_after()


def test_static_compiles_off_keeps_every_call_shape_generic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_mod, "STATIC_AFTER", 0)
    f = fused(lambda a: a * 3, static=True)
    x = torch.arange(5.0)
    for _ in range(4):
        assert torch.equal(f(x), x * 3)
    assert not f._static


@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "toward_zero"])
def test_quantize_and_quantize_scaled_switch_to_static_kernels_with_identical_bits(rounding: str) -> None:
    fmt = get_format("e4m3")
    g = torch.Generator().manual_seed(1)
    x2 = torch.randn(24, 40, generator=g) * 30
    x1 = x2.reshape(-1).clone()
    leaf = x2.clone().requires_grad_(True)  # quantize is not differentiable: its input may still carry grad
    row_scale = torch.rand(24, 1, generator=g) + 0.5
    learnt = torch.tensor(0.75, requires_grad=True)
    calls = {
        "2-D": lambda: quantize(x2, fmt, rounding, seed=9),
        "1-D": lambda: quantize(x1, fmt, rounding, seed=9),
        "requires_grad": lambda: quantize(leaf, fmt, rounding, seed=9),
        "pow2 scale": lambda: quantize_scaled(x2, fmt, torch.tensor(0.25), rounding, seed=9, scale_pow2=True),
        "row scales": lambda: quantize_scaled(x2, fmt, row_scale, rounding, seed=9),
        "scale with grad": lambda: quantize_scaled(x2, fmt, learnt, rounding, seed=9),
    }
    for name, call in calls.items():
        with eager():
            ref = call()
        for i in range(4):  # calls 1-2 shape-generic, then the static kernel
            out = call()
            assert out.shape == ref.shape and not out.requires_grad, name
            assert_same_bits(out, ref.detach().numpy(), x2.numpy().reshape(ref.shape), f"{name} call {i}")
    v = kernel_variant(fmt, rounding, "saturate")
    assert _static_compiles(_kernel_for(v, None)) >= 1
    assert _static_compiles(_kernel_for(v, "pow2")) >= 1 and _static_compiles(_kernel_for(v, "any")) >= 1


def test_seed_draws_are_int32_and_follow_the_generator() -> None:
    a = draw_seed(torch.device("cpu"), torch.Generator().manual_seed(3))
    b = draw_seed(torch.device("cpu"), torch.Generator().manual_seed(3))
    assert a.dtype == torch.int32 and a.dim() == 0 and int(a) == int(b) and 0 <= int(a) < 2**31 - 1
    expected = torch.randint(0, 2**31 - 1, (), generator=torch.Generator().manual_seed(3))  # the int64 draw
    assert int(a) == int(expected)


@pytest.mark.parametrize("kind", ["tensor", "delayed", "channel", "block"])
def test_a_traced_scale_is_stored_once_and_eager_scales_are_untouched(kind: str) -> None:
    # Unrealized, inductor's CPU loop recomputes the scale's ~30 scalar operations for every 8 elements it writes.
    from torch.fx.experimental.proxy_tensor import make_fx

    from altgrad.quant.fused import stored_once
    from altgrad.quant.scaling import make_scaler, scale_consts

    fmt = get_format("e4m3")
    scaler = make_scaler(ScalingSpec(kind=kind, history=4), fmt)
    consts = scale_consts(fmt, 0, torch.device("cpu"))
    x = torch.randn(64, 48)

    def scale(t: torch.Tensor) -> torch.Tensor:
        return type(scaler).scale_fn(t, consts, scaler.state(), True, "max", 32)[0]

    graph = make_fx(scale)(x).graph
    forced = [n for n in graph.nodes if n.target is torch.ops.prims.inductor_force_stride_order.default]
    assert len(forced) == 1, graph
    assert torch.equal(make_fx(scale)(x)(x), scale(x))
    s = torch.tensor(4.0)
    assert stored_once(s) is s  # eager: no copy


@pytest.mark.parametrize("cols", [48, 100])
def test_block_scales_compile_right_when_rows_are_not_whole_blocks(cols: int) -> None:
    # inductor once miscompiled the expand/reshape/slice form of this: scales past the first block were wrong
    from altgrad.quant.scaling import block_scale, scale_consts

    consts = scale_consts(get_format("e4m3"), 0, torch.device("cpu"))
    x = torch.randn(16, cols) * torch.logspace(-3, 3, cols)

    def scaled(t: torch.Tensor) -> torch.Tensor:
        return t * block_scale(t, consts, (), True, "max", 32)[0]

    assert torch.equal(torch.compile(scaled, dynamic=False)(x), scaled(x))


def test_static_output_rebuilder_matches_pytree() -> None:
    """The static road's fast rebuild of an output structure gives what pytree's unflatten gives (tensors in leaf
    order, constants and None kept); structures it does not know are left to pytree."""
    a, b, c = torch.ones(1), torch.zeros(2), torch.full((3,), 2.0)
    structure = [a, None, (b,), 3, "s", [c, (None, 1.5)], ()]
    leaves, _ = tree_flatten(structure)
    out = _rebuilder(structure)(iter([x for x in leaves if isinstance(x, torch.Tensor)]))
    assert repr(out) == repr(structure) and type(out[2]) is tuple and type(out[5]) is list
    assert out[0] is a and out[2][0] is b and out[5][0] is c
    assert _rebuilder((a, {"k": b})) is None  # dicts: pytree's unflatten


def _count_direct_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one on every call that takes a quantizer's direct road."""
    calls: list[int] = []
    original = _Direct.__call__

    def counted(self, x, seed):  # noqa: ANN001, ANN202
        calls.append(1)
        return original(self, x, seed)

    monkeypatch.setattr(_Direct, "__call__", counted)
    return calls


@pytest.mark.parametrize("kind,rounding,stats,training", [
    ("tensor", "nearest", False, True), ("delayed", "stochastic", True, True), ("channel", "nearest", True, False),
    ("block", "toward_zero", False, True), ("none", "nearest", True, True)])
def test_repeated_calls_take_the_static_compile_then_the_direct_road_with_identical_bits(
        monkeypatch: pytest.MonkeyPatch, kind: str, rounding: str, stats: bool, training: bool) -> None:
    calls = _count_direct_calls(monkeypatch)
    spec = QuantSpec(format=get_format("e4m3"), rounding=rounding, scaling=ScalingSpec(kind=kind, history=3))
    fast = TensorQuantizer(spec, role="input", track_stats=stats).train(training)
    ref = TensorQuantizer(spec, role="input", track_stats=stats).train(training)
    g = torch.Generator().manual_seed(1)
    for step in range(6):  # call 2 compiles the signature and builds the road; calls 3-6 take it
        x = (torch.randn(48, 40, generator=g) * 2.0 ** (3 - step)).requires_grad_()
        torch.manual_seed(step)
        y = fast(x)
        torch.manual_seed(step)
        with eager():
            y_ref = ref(x)
        assert_same_bits(y.detach(), y_ref.detach().numpy(), x.detach().numpy(), f"{kind} call {step}")
        y.sum().backward()  # still straight through
        assert torch.equal(x.grad, torch.ones_like(x))
        for (name, a), b in zip(fast.named_buffers(), ref.buffers()):
            assert torch.equal(a, b), f"{kind}: buffer {name} differs after call {step}"
    assert _static_compiles(_plan(fast, x.device).call) >= 1 and len(calls) == 4


@pytest.mark.parametrize("kind,rounding", [("tensor", "nearest"), ("delayed", "stochastic")])
def test_grad_quantizer_backward_takes_the_static_compile_then_the_direct_road(monkeypatch: pytest.MonkeyPatch,
                                                                              kind: str, rounding: str) -> None:
    calls = _count_direct_calls(monkeypatch)
    spec = QuantSpec(format=get_format("e5m2"), rounding=rounding, scaling=ScalingSpec(kind=kind, history=2))
    fast, ref = GradQuantizer(spec), GradQuantizer(spec)
    for step in range(5):
        w = torch.randn(24, 8, requires_grad=True)
        up = torch.randn(24, 8) * 10.0 ** -step
        torch.manual_seed(step)
        fast(w).backward(up)
        g_fast, w.grad = w.grad.clone(), None
        torch.manual_seed(step)
        with eager():
            ref(w).backward(up)
        assert_same_bits(g_fast, w.grad.numpy(), up.numpy(), f"grad step {step}")
        for a, b in zip(fast.buffers(), ref.buffers()):
            assert torch.equal(a, b)
    assert _static_compiles(_plan(fast, torch.device("cpu")).call) >= 1 and len(calls) == 3


def test_the_direct_road_follows_replaced_buffers_specs_stats_and_the_compile_switch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_direct_calls(monkeypatch)
    spec = QuantSpec(format=get_format("e4m3"), scaling=ScalingSpec(kind="tensor"))
    q = TensorQuantizer(spec, role="input", track_stats=False)
    x = torch.randn(32, 16) * 100.0
    for _ in range(3):
        q(x)
    assert len(calls) == 1
    scale = q.scaler.scale.clone()

    old = q.scaler.scale  # a buffer replaced (not copied into): the road must write the new one, not the old
    q.scaler.scale = torch.zeros(())
    q(x)
    assert torch.equal(q.scaler.scale, scale) and torch.equal(old, scale)
    old.fill_(-1.0)
    q.load_state_dict({k: v.clone() * 0 for k, v in q.state_dict().items()}, assign=True)
    q(x)
    assert torch.equal(q.scaler.scale, scale) and old.item() == -1.0

    q.track_stats = True  # statistics on: another road, which writes them
    q(x)
    q(x)
    assert q.stats.abs().sum() > 0
    q.stats.zero_()
    q.track_stats = False
    q(x)
    assert q.stats.abs().sum() == 0

    q.spec = QuantSpec(format=get_format("e5m2"), scaling=ScalingSpec(kind="tensor"))  # a new spec: its own grid
    y = q(x)
    assert_same_bits(y, quantize_scaled(x, get_format("e5m2"), scale, "nearest", "saturate",
                                        scale_pow2=True).numpy(), x.numpy(), "after the spec changed")

    n = len(calls)
    with eager():  # the compiler switched off: no compiled road, direct or not
        q(x)
    assert len(calls) == n


def test_static_for_returns_only_an_existing_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    f = fused(lambda a: a + 1, static=True)
    x = torch.arange(4.0)
    assert f.static_for(x) is None
    f(x)
    assert f.static_for(x) is None  # one call: not compiled yet (STATIC_AFTER = 2)
    f(x)
    assert f.static_for(x) is f._static[_signature((x,))] is not None
    assert f.static_for(torch.arange(5.0)) is None  # another signature
    assert fused(lambda a: a + 1).static_for(x) is None  # not a static function
    monkeypatch.setenv("ALTGRAD_COMPILE", "0")
    assert f.static_for(x) is None

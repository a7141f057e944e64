"""Scalers: the scale each strategy picks, history across steps, degenerate amax, state in state_dict."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from altgrad.quant import QuantSpec, ScalingSpec, TensorQuantizer, get_format, make_scaler
from altgrad.quant.scaling import compute_scale, finite_amax, pow2_floor

E4M3 = get_format("e4m3")


def is_pow2(s: torch.Tensor) -> bool:
    m, _ = torch.frexp(s)
    return bool((m == 0.5).all())


def tensor_with_amax(a: float, n: int = 64) -> torch.Tensor:
    x = torch.linspace(-a / 2, a / 2, n)
    x[3] = -a
    return x


def test_tensor_scale_is_max_over_amax() -> None:
    x = tensor_with_amax(3.0)
    s = make_scaler(ScalingSpec("tensor", pow2=False), E4M3)(x)
    assert float(s) == pytest.approx(448 / 3.0, rel=1e-7)
    s2 = make_scaler(ScalingSpec("tensor", pow2=True), E4M3)(x)
    assert float(s2) == 2.0 ** math.floor(math.log2(448 / 3.0)) and is_pow2(s2)
    s3 = make_scaler(ScalingSpec("tensor", pow2=True, margin=2), E4M3)(x)
    assert float(s3) == float(s2) / 4


@pytest.mark.parametrize("kind", ["tensor", "delayed", "channel", "block"])
@pytest.mark.parametrize("bad", [0.0, math.inf, math.nan])
def test_degenerate_amax_never_gives_a_bad_scale(kind: str, bad: float) -> None:
    scaler = make_scaler(ScalingSpec(kind), E4M3)
    x = torch.full((4, 64), bad)
    for _ in range(2):
        s = scaler(x)
        assert torch.isfinite(s).all() and (s > 0).all()
    assert (scaler(torch.zeros(3, 32)) == 1).all()  # nothing seen yet: the fallback is 1


def test_tensor_scaler_falls_back_to_the_previous_scale() -> None:
    scaler = make_scaler(ScalingSpec("tensor"), E4M3)
    s_good = scaler(tensor_with_amax(5.0))
    assert float(scaler(torch.zeros(10))) == float(s_good)
    assert float(scaler(torch.full((3,), math.nan))) == float(s_good)
    # non-finite entries are ignored by amax, the finite ones still count
    x = tensor_with_amax(5.0)
    x[0] = math.inf
    assert float(make_scaler(ScalingSpec("tensor"), E4M3)(x)) == float(s_good)


@pytest.mark.parametrize("reduce, expected_amax", [
    ("max", [1.0, 1.0, 8.0, 8.0, 2.0]),
    ("most_recent", [1.0, 1.0, 8.0, 2.0, 0.5]),
])
def test_delayed_scaling_uses_the_history_of_previous_calls(reduce: str, expected_amax: list[float]) -> None:
    scaler = make_scaler(ScalingSpec("delayed", pow2=False, history=2, reduce=reduce), E4M3)
    amaxes = [1.0, 8.0, 2.0, 0.5, 0.25]
    got = []
    for a in amaxes:
        got.append(448 / float(scaler(tensor_with_amax(a))))
    assert got == pytest.approx(expected_amax, rel=1e-6)
    assert scaler.amax_history.tolist() == [0.25, 0.5]


def test_delayed_scaling_state_round_trips_through_state_dict() -> None:
    spec = QuantSpec(E4M3, scaling=ScalingSpec("delayed", history=4))
    a = TensorQuantizer(spec)
    for amax in (3.0, 50.0, 0.2):
        a(tensor_with_amax(amax))
    b = TensorQuantizer(spec)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.scaler.amax_history, b.scaler.amax_history)
    x = torch.randn(32) * 7
    assert torch.equal(a.scale_for(x), b.scale_for(x))
    assert torch.equal(a(x), b(x))
    assert set(a.state_dict()) == {"stats", "scaler.amax_history", "scaler.scale"}


def test_update_false_and_eval_mode_leave_state_alone() -> None:
    spec = QuantSpec(E4M3, scaling=ScalingSpec("delayed", history=3))
    q = TensorQuantizer(spec)
    q(tensor_with_amax(2.0))
    hist = q.scaler.amax_history.clone()
    q.scale_for(tensor_with_amax(100.0))
    q.eval()
    q(tensor_with_amax(100.0))
    assert torch.equal(q.scaler.amax_history, hist)


def test_channel_scales_one_per_row() -> None:
    x = torch.randn(5, 7, 16) * torch.logspace(-3, 3, 5)[:, None, None]
    s = make_scaler(ScalingSpec("channel"), E4M3)(x)
    assert s.shape == (5, 7, 1) and is_pow2(s)
    amax = x.abs().amax(-1, keepdim=True)
    assert ((x.abs() * s).amax(-1, keepdim=True) <= 448).all()
    assert ((amax * s * 2) > 448).all()  # the largest power of two that fits


@pytest.mark.parametrize("cols", [64, 70])
def test_block_scales_are_powers_of_two_per_32_values(cols: int) -> None:
    x = torch.randn(3, cols) * torch.logspace(-4, 4, cols)
    s = make_scaler(ScalingSpec("block", block=32), E4M3)(x)
    assert s.shape == x.shape and is_pow2(s)
    for start in range(0, cols, 32):
        blk = s[:, start:start + 32]
        assert (blk == blk[:, :1]).all()
        amax = x[:, start:start + 32].abs().amax(-1)
        assert ((amax * blk[:, 0]) <= 448).all() and ((amax * blk[:, 0] * 2) > 448).all()


def test_compute_scale_is_stateless() -> None:
    x = tensor_with_amax(3.0)
    assert compute_scale(x, E4M3, ScalingSpec("none")) is None
    assert float(compute_scale(x, E4M3, ScalingSpec("delayed"))) == float(compute_scale(x, E4M3, ScalingSpec()))


@pytest.mark.parametrize("kwargs, msg", [
    (dict(kind="row"), "scaling.kind='row' is not valid; valid: none, tensor, delayed, channel, block"),
    (dict(reduce="mean"), "scaling.reduce='mean'.*max, most_recent"),
    (dict(history=0), "scaling.history=0"),
    (dict(block=0), "scaling.block=0"),
    (dict(margin=0.5), "scaling.margin=0.5"),
])
def test_scaling_spec_validation(kwargs: dict, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        ScalingSpec(**kwargs)


def test_quant_spec_dict_round_trip() -> None:
    spec = QuantSpec(get_format("e3m4"), "stochastic", "overflow", ScalingSpec("delayed", history=4, margin=1))
    d = json.loads(json.dumps(spec.to_dict()))
    back = QuantSpec.from_dict(d)
    assert back == spec and back.format.name == "e3m4"
    assert QuantSpec.from_dict({"format": "e5m2"}) == QuantSpec(get_format("e5m2"))
    with pytest.raises(ValueError, match="rounding='round'"):
        QuantSpec(E4M3, rounding="round")
    with pytest.raises(ValueError, match="FloatFormat"):
        QuantSpec("e4m3")  # type: ignore[arg-type]


def test_unscale_and_reciprocal_equal_ieee_float32_division_bit_for_bit() -> None:
    # What the kernels use instead of float32 '/' (approximate under Triton): same bits as IEEE division.
    from altgrad.quant.rounding import unscale
    from altgrad.quant.scaling import exact_reciprocal

    gen = torch.Generator().manual_seed(11)
    q = torch.randn(4096, generator=gen) * torch.exp2(torch.randint(-140, 120, (4096,), generator=gen).float())
    q[:4] = torch.tensor([0.0, -0.0, float("inf"), float("nan")])
    for s in (torch.exp2(torch.randint(-126, 127, (4096,), generator=gen).float()),  # powers of two, full range
              torch.rand(4096, generator=gen) * torch.exp2(torch.randint(-60, 60, (4096,), generator=gen).float())):
        pow2 = bool((s == pow2_floor(s)).all())
        got, ref = unscale(q, s, pow2), q / s
        assert torch.equal(got.view(torch.int32)[4:], ref.view(torch.int32)[4:]) and got[3].isnan()
        assert torch.equal(got[:3].view(torch.int32), ref[:3].view(torch.int32))
        assert torch.equal(exact_reciprocal(s).view(torch.int32), torch.reciprocal(s).view(torch.int32))


def _finite_amax_reference(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The float definition: abs, Inf/NaN → 0, max (what the bit-pattern version replaces)."""
    a = x.abs().to(torch.float32)
    a = torch.where(torch.isfinite(a), a, 0.0)
    if dim is None:
        return a.amax() if a.numel() else a.new_zeros(())
    return a.amax(dim=dim, keepdim=True)


@settings(max_examples=200, deadline=None)
@given(bits=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=0, max_size=64), cols=st.sampled_from([1, 2, 4]))
def test_finite_amax_on_bit_patterns_equals_the_float_definition(bits: list[int], cols: int) -> None:
    """Every float32 pattern (NaN payloads, ±Inf, ±0, subnormals): the same amax bits, overall and per row."""
    x = torch.tensor(bits, dtype=torch.int32).view(torch.float32)
    got, want = finite_amax(x), _finite_amax_reference(x)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    rows = x[: len(bits) // cols * cols].reshape(-1, cols)
    if rows.numel():
        assert torch.equal(finite_amax(rows, dim=-1).view(torch.int32),
                           _finite_amax_reference(rows, dim=-1).view(torch.int32))


def test_finite_amax_of_special_and_narrow_inputs() -> None:
    nan, inf = float("nan"), float("inf")
    cases = [torch.tensor([-0.0]), torch.tensor([nan, -inf, inf]), torch.tensor([]), torch.tensor(-3.5),
             torch.tensor([inf, -5.5, 2.0]), (torch.randn(6, 10) * 100).to(torch.bfloat16),
             torch.tensor([-65504.0, 1.0], dtype=torch.float16)]
    for x in cases:
        got, want = finite_amax(x), _finite_amax_reference(x)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (x, got, want)
    assert finite_amax(torch.tensor([-0.0])).view(torch.int32).item() == 0  # +0, never -0

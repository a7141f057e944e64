"""Straight-through fake quantization, gradient quantization, the quantizer modules and their stats."""

from __future__ import annotations

import math

import pytest
import torch

from altgrad.quant import (STAT_NAMES, GradQuantizer, QuantSpec, ScalingSpec, TensorQuantizer, fake_quant,
                           get_format, quant_grad, quantize, quantize_scaled)
from altgrad.quant.scaling import compute_scale

E4M3, E5M2 = get_format("e4m3"), get_format("e5m2")


def on_grid(y: torch.Tensor, s: torch.Tensor, fmt) -> bool:
    return bool(torch.isin((y.double() * s.double()).float(), fmt.values()).all())


@pytest.mark.parametrize("kind", ["none", "tensor", "channel", "block"])
def test_fake_quant_forward_is_scaled_quantize_and_backward_is_identity(kind: str) -> None:
    spec = QuantSpec(E4M3, scaling=ScalingSpec(kind))
    x = (torch.randn(8, 64) * 3).requires_grad_()
    y = fake_quant(x, spec)
    s = compute_scale(x.detach(), E4M3, spec.scaling)
    ref = quantize(x.detach(), E4M3) if s is None else quantize(x.detach() * s, E4M3) / s
    assert torch.equal(y.detach(), ref)
    g = torch.randn_like(x)
    y.backward(g)
    assert torch.equal(x.grad, g)  # straight-through: exactly the incoming gradient


def test_quant_grad_quantizes_only_the_backward() -> None:
    x = torch.randn(16, 32, requires_grad=True)
    spec = QuantSpec(E5M2, scaling=ScalingSpec("tensor"))
    y = quant_grad(x, spec)
    assert torch.equal(y.detach(), x.detach())
    g = torch.randn(16, 32) * 1e-3
    y.backward(g)
    expected = quantize_scaled(g, E5M2, compute_scale(g, E5M2, spec.scaling))
    assert torch.equal(x.grad, expected) and not torch.equal(x.grad, g)
    x.grad = None
    quant_grad(x).backward(g)  # default spec: e5m2 with tensor scaling
    assert torch.equal(x.grad, expected)


def test_tensor_quantizer_forward_grid_identity_when_disabled() -> None:
    q = TensorQuantizer(QuantSpec(E4M3, scaling=ScalingSpec("channel")), "weight")
    w = torch.randn(16, 64, requires_grad=True)
    y = q(w)
    assert on_grid(y.detach(), q.scale_for(w), E4M3)
    y.sum().backward()
    assert torch.equal(w.grad, torch.ones_like(w))
    q.enabled = False
    assert q(w) is w


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_project_puts_weights_on_the_grid_in_place(rounding: str) -> None:
    q = TensorQuantizer(QuantSpec(E4M3, scaling=ScalingSpec("tensor")), "weight")
    w = torch.nn.Parameter(torch.randn(32, 32))
    ptr = w.data_ptr()
    s = q.scale_for(w)
    q.project_(w, rounding)
    assert w.data_ptr() == ptr and on_grid(w.detach(), s, E4M3)
    before = w.detach().clone()
    q.project_(w)
    assert torch.equal(w.detach(), before)  # already on the grid (pow2 scale: the grid does not move)


def test_stats_values_and_buffer_identity() -> None:
    q = TensorQuantizer(QuantSpec(E4M3, scaling=ScalingSpec("none")), "input")
    buf = q.stats
    x = torch.tensor([1000.0, 1e-5, 0.005, 0.0, math.inf, math.nan, 1.0, -2.0])
    q(x)
    assert q.stats is buf and q.stats.dtype == torch.float32 and len(STAT_NAMES) == 6
    st = {k: float(v) for k, v in q.stat_dict().items()}
    assert st == {"frac_saturated": 1 / 8, "frac_zero": 1 / 8, "frac_subnormal": 1 / 8, "nonfinite": 2.0,
                  "amax": 1000.0, "scale": 1.0}
    q2 = TensorQuantizer(QuantSpec(E4M3, scaling=ScalingSpec("tensor")), "input")
    q2(torch.tensor([3.0, -1.5, 0.25]))
    assert float(q2.stat_dict()["scale"]) == 128.0 and float(q2.stat_dict()["amax"]) == 3.0


def test_grad_quantizer_backward_and_stats() -> None:
    gq = GradQuantizer(QuantSpec(E5M2, scaling=ScalingSpec("none")))
    x = torch.randn(4, 8, requires_grad=True)
    g = torch.tensor([1e6, 1e-9] + [0.5] * 30).reshape(4, 8)
    gq(x).backward(g)
    assert torch.equal(x.grad, quantize(g, E5M2))
    st = gq.stat_dict()
    assert float(st["frac_saturated"]) == 1 / 32 and float(st["frac_zero"]) == 1 / 32
    gq.enabled = False
    assert gq(x) is x
    assert GradQuantizer().spec.format == E5M2


def test_grad_quantizer_delayed_scaling_updates_in_backward() -> None:
    gq = GradQuantizer(QuantSpec(E5M2, scaling=ScalingSpec("delayed", history=3)))
    for amax in (2.0, 4.0):
        x = torch.zeros(8, requires_grad=True)
        gq(x).backward(torch.full((8,), amax))
    assert gq.scaler.amax_history.tolist() == [4.0, 2.0, 0.0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_activations_keep_their_dtype(dtype: torch.dtype) -> None:
    q = TensorQuantizer(QuantSpec(E4M3), "input")
    x = (torch.randn(4, 32) * 5).to(dtype).requires_grad_()
    y = q(x)
    assert y.dtype == dtype
    y.float().sum().backward()
    assert x.grad.dtype == dtype and torch.equal(x.grad, torch.ones_like(x))
    s = q.scale_for(x)
    assert torch.equal(y.detach().float(), quantize(x.detach().float() * s, E4M3) / s)


def test_quantizers_reject_a_non_spec() -> None:
    with pytest.raises(ValueError, match="QuantSpec"):
        TensorQuantizer(E4M3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="QuantSpec"):
        GradQuantizer("e5m2")  # type: ignore[arg-type]


def test_without_track_stats_the_stats_keep_their_last_values() -> None:
    q = TensorQuantizer(QuantSpec(E4M3, scaling=ScalingSpec("none")), "input")
    q(torch.tensor([1000.0, 1.0]))
    recorded = q.stats.clone()
    assert recorded[STAT_NAMES.index("frac_saturated")] == 0.5
    q.track_stats = False
    y = q(torch.tensor([1.0, 2.0, math.nan]))
    assert torch.equal(q.stats, recorded)
    assert torch.equal(y[:2], torch.tensor([1.0, 2.0]))  # quantization itself is unchanged
    gq = GradQuantizer(QuantSpec(E5M2, scaling=ScalingSpec("none")), track_stats=False)
    x = torch.zeros(4, requires_grad=True)
    gq(x).backward(torch.tensor([1e6, 1.0, 0.5, 0.25]))
    assert torch.equal(gq.stats, torch.zeros(len(STAT_NAMES)))
    gq.track_stats = True
    gq(x).backward(torch.tensor([1e6, 1.0, 0.5, 0.25]))
    assert float(gq.stat_dict()["frac_saturated"]) == 0.25


def test_stats_step_names_the_step_of_the_shared_record() -> None:
    from altgrad.quant.fake_quant import StatsRecord, set_track_stats

    qs = [TensorQuantizer(QuantSpec(E4M3)), GradQuantizer()]
    assert [q.stats_step for q in qs] == [None, None]  # no switch: every call with track_stats on records
    record = StatsRecord()
    set_track_stats(qs, False, record)
    assert [q.track_stats for q in qs] == [False, False] and [q.stats_step for q in qs] == [None, None]
    record.step = 7
    assert [q.stats_step for q in qs] == [7, 7]
    set_track_stats(qs, True)
    assert all(q.stats_record is record and q.track_stats for q in qs)


@pytest.mark.parametrize("kind", ["none", "tensor", "delayed", "channel", "block"])
def test_kept_scale_is_the_scale_the_statistics_record(kind: str) -> None:
    """Consumers that only need the scale read the scaler instead of the statistics: the same value, bit for bit."""
    from altgrad.quant.fake_quant import kept_scale

    torch.manual_seed(0)
    q = TensorQuantizer(QuantSpec(E4M3, scaling=ScalingSpec(kind, history=4)), "weight")
    gq = GradQuantizer(QuantSpec(E5M2, scaling=ScalingSpec(kind, history=4)))
    for amax in (3.0, 40.0, 0.5):  # delayed: the scale used comes from the history before this call
        x = (torch.randn(4, 64) * amax).requires_grad_()
        gq(q(x)).backward(torch.randn(4, 64) * amax * 1e-3)
        for quantizer in (q, gq):
            s = kept_scale(quantizer)
            if kind in ("channel", "block"):
                assert s is None
            else:
                assert s.dtype == torch.float32 and s.item() == quantizer.stats[STAT_NAMES.index("scale")].item()

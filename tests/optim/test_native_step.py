"""The native ManifoldAdamW / RelativeAdamW step (altgrad.optim.native_step) against their compiled steps, bit for bit.

The compiled step made the committed records, so it is the reference: same weights and moments after several steps,
on vectors long enough for the vector loop, its scalar tail and two parallel chunks, for every stiffness, placement,
scale kind and both branches of torch's lerp. These tests compile (a few seconds each, warm cache).
"""

from __future__ import annotations

import pytest
import torch
from optim_helpers import PLAIN, TinyNet

from altgrad.optim import ManifoldAdamW
from altgrad.optim.adam import hyper_tensor
from altgrad.optim.manifold import _manifold_step
from altgrad.optim.native_step import serves, stiff_adam_step_
from altgrad.optim.relative import RelativeAdamW, _relative_step
from altgrad.quant import QuantSpec, ScalingSpec, TensorQuantizer, get_format
from altgrad.quant.layers import weight_grids

pytestmark = pytest.mark.skipif(not serves(torch.zeros(1)), reason="the native kernel is not built here")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def _grid(fmt: str, kind: str, pow2: bool, margin: int) -> TensorQuantizer:
    q = TensorQuantizer(QuantSpec(get_format(fmt), scaling=ScalingSpec(kind=kind, pow2=pow2, margin=margin)))
    if kind == "delayed":  # a history from earlier calls, some of it above today's amax
        q.scaler.amax_history.copy_(torch.linspace(0.0, 3.0, q.scaler.amax_history.numel()))
    return q


CASES = [  # (format, scaling, pow2, margin, stiffness, on_update, beta1)
    ("e4m3", "tensor", True, 0, "pow2", True, 0.9),
    ("e7m0", "tensor", True, 0, "pow2", True, 0.9),
    ("e0m7", "tensor", True, 0, "pow2", False, 0.9),
    ("e5m2", "none", True, 0, "smooth", True, 0.9),
    ("e3m4", "delayed", True, 0, "pow2", True, 0.3),   # lerp's other branch: from the end
    ("e4m3", "tensor", False, 1, "smooth", False, 0.9),  # a scale that is not a power of two, a margin
    ("e5m2", "delayed", False, 0, "pow2", False, 0.3),
    (None, None, None, None, "abs", True, 0.9),          # RelativeAdamW
]


@pytest.mark.parametrize(("fmt", "kind", "pow2", "margin", "stiffness", "on_update", "beta1"), CASES)
@pytest.mark.parametrize("n", [1027, 70001])
def test_native_step_gives_the_compiled_steps_bits(fmt, kind, pow2, margin, stiffness, on_update, beta1, n):
    gen = torch.Generator().manual_seed(n)
    w = torch.randn(n, generator=gen) * torch.logspace(-7, 1, n)  # binades from deep subnormal grids up
    w[::97] = 0.0
    grid = None if stiffness == "abs" else _grid(fmt, kind, pow2, margin)
    ref = [w.clone(), torch.zeros(n), torch.zeros(n)]
    nat = [w.clone(), torch.zeros(n), torch.zeros(n)]
    fused = _relative_step if stiffness == "abs" else _manifold_step
    fused._failed.clear()
    with torch._dynamo.config.patch(recompile_limit=64):
        for t in range(1, 5):
            g = torch.randn(n, generator=gen) * torch.logspace(-9, 2, n)
            g[5] = 0.0
            hyper = hyper_tensor(2e-3 * t, 0.1, 1 - beta1 ** t, (1 - 0.99 ** t) ** 0.5, 1e-8, w.device)
            if stiffness == "abs":
                _relative_step(*ref[:1], g, *ref[1:], hyper, beta1, 0.99, compiled=True)
            else:
                _manifold_step(*ref[:1], g, *ref[1:], grid, stiffness, on_update, hyper, beta1, 0.99, compiled=True)
            assert stiff_adam_step_(nat[0], g, nat[1], nat[2], hyper, beta1, 0.99, stiffness, on_update, grid)
    assert not fused._failed, "the compiled reference fell back to eager"
    for name, a, b in zip(("weights", "first moment", "second moment"), ref, nat):
        differ = (_bits(a) != _bits(b)).sum().item()
        assert differ == 0, f"{name}: {differ} of {n} elements differ from the compiled step"


def _train(opt_cls, kernel: str, scaling: str = "tensor", **kw) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    torch.manual_seed(0)
    net = TinyNet("e4m3", scaling=scaling, dim=16)
    opt = opt_cls(net.parameters(), weight_decay=0.1, grids=weight_grids(net), kernel=kernel, **PLAIN, **kw)
    gen = torch.Generator().manual_seed(1)
    fused = _relative_step if opt_cls is RelativeAdamW else _manifold_step
    fused._failed.clear()
    with torch._dynamo.config.patch(recompile_limit=64):  # one graph per configuration this process has seen
        for _ in range(6):
            for group in opt.param_groups:  # a schedule: a new lr at every step
                group["lr"] = group["lr"] * 0.9
            for p in net.parameters():
                p.grad = torch.randn(p.shape, generator=gen)
            opt.step()
    assert not fused._failed, "the compiled step fell back to eager"
    moments = [t for s in opt.state.values() for t in (s["exp_avg"], s["exp_avg_sq"])]
    return [p.detach().clone() for p in net.parameters()], moments


@pytest.mark.parametrize(("opt_cls", "kw"), [(ManifoldAdamW, {"lr": 0.5}),
                                             (ManifoldAdamW, {"lr": 1e-3, "stiffness_on": "grad"}),
                                             (RelativeAdamW, {"lr": 0.05})])
def test_the_optimizers_step_alike_on_every_kernel_but_eager(opt_cls, kw):
    compiled = _train(opt_cls, "compiled", **kw)
    for kernel in ("native", "auto"):
        other = _train(opt_cls, kernel, **kw)
        for a, b in zip(compiled[0] + compiled[1], other[0] + other[1]):
            assert torch.equal(_bits(a), _bits(b)), kernel


def test_auto_takes_the_compiled_step_where_the_native_one_does_not_serve():
    """Per-row scales (channel scaling) are not computed natively: auto steps them compiled, native refuses."""
    compiled = _train(ManifoldAdamW, "compiled", scaling="channel", lr=0.5)
    auto = _train(ManifoldAdamW, "auto", scaling="channel", lr=0.5)
    for a, b in zip(compiled[0] + compiled[1], auto[0] + auto[1]):
        assert torch.equal(_bits(a), _bits(b))
    with pytest.raises(ValueError) as err:
        _train(ManifoldAdamW, "native", scaling="channel", lr=0.5)
    message = str(err.value)
    assert "kernel=native cannot step" in message and "valid: kernel=auto" in message and "\n" not in message


def test_an_unknown_kernel_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"kernel='fast' is not valid; valid: auto, native, compiled, eager$"):
        ManifoldAdamW([torch.zeros(2, requires_grad=True)], kernel="fast")

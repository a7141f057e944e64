"""On a CUDA GPU the quantizers compute exactly what they compute on the CPU (skipped where there is none).

The CPU's eager kernel is the reference here: tests/quant proves it bit-exact against ml_dtypes, torch's casts,
gfloat and enumeration. On CUDA both the Triton kernels torch.compile builds and the eager kernel must give the
same bits, for every preset and rounding mode, with unscaled and non-power-of-two scales (which would expose an
approximate division or a fused multiply-add in the generated code), and the stochastic stream must be the same
counter hash. Run on a GPU machine with `python -m pytest tests/gpu`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quant"))
from quant_testlib import assert_same_bits, eager, inputs_for  # noqa: E402

from altgrad.quant import (GradQuantizer, QuantSpec, ScalingSpec, TensorQuantizer, get_format,  # noqa: E402
                           list_formats, quantize_scaled)
from altgrad.quant.compiled import compiling  # noqa: E402
from altgrad.quant.stats import STAT_NAMES  # noqa: E402

# ALTGRAD_TEST_DEVICE=cpu runs these tests' logic on the CPU (compiled CPU kernels against the eager reference).
CUDA = torch.device(os.environ.get("ALTGRAD_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(CUDA.type == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def _compile():
    """Calls that leave the kernel open compile (the road a GPU run takes)."""
    with compiling(True):
        yield


def on_cuda(x: torch.Tensor, fmt, scale, rounding: str, overflow: str, compiled: bool) -> torch.Tensor:
    sc = None if scale is None else scale.to(CUDA)
    return quantize_scaled(x.to(CUDA), fmt, sc, rounding, overflow, seed=1234, compiled=compiled).cpu()


@pytest.mark.parametrize("rounding", ["nearest", "toward_zero", "stochastic"])
def test_cuda_kernels_equal_cpu_reference_for_every_preset(rounding: str) -> None:
    for i, name in enumerate(list_formats()):
        fmt = get_format(name)
        x = torch.from_numpy(inputs_for(fmt, 200_000, seed=i))
        for overflow in ("saturate", "overflow"):
            ref = quantize_scaled(x, fmt, None, rounding, overflow, seed=1234, compiled=False)
            for compiled in (True, False):
                got = on_cuda(x, fmt, None, rounding, overflow, compiled)
                assert_same_bits(got, ref.numpy(), x.numpy(),
                                 f"{name} {rounding} {overflow} cuda {'compiled' if compiled else 'eager'}")


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_cuda_scaled_kernel_equals_cpu_with_non_power_of_two_scales(rounding: str) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(512, 96, generator=gen) * torch.logspace(-5, 5, 96)
    scales = (torch.tensor(3.0), torch.tensor(1 / 7), torch.rand(512, 1, generator=gen) * 100 + 0.01,
              torch.rand(512, 96, generator=gen) * 10 + 0.1)
    for name in ("e4m3", "e5m2", "e7m0", "e0m7", "p3109_p3"):
        fmt = get_format(name)
        for s in scales:
            ref = quantize_scaled(x, fmt, s, rounding, "saturate", seed=1234, compiled=False)
            for compiled in (True, False):
                got = on_cuda(x, fmt, s, rounding, "saturate", compiled)
                assert_same_bits(got, ref.numpy(), x.numpy(), f"{name} {rounding} scale {tuple(s.shape)}")
    xb = x.to(torch.bfloat16)  # bf16 activations under autocast keep their dtype
    ref = quantize_scaled(xb, get_format("e4m3"), scales[0], rounding, "saturate", seed=1234, compiled=False)
    got = on_cuda(xb, get_format("e4m3"), scales[0], rounding, "saturate", True)
    assert got.dtype == torch.bfloat16 and torch.equal(got, ref)


SCALINGS = [ScalingSpec("none"), ScalingSpec("tensor"), ScalingSpec("tensor", pow2=False),
            ScalingSpec("delayed", history=4), ScalingSpec("delayed", pow2=False, reduce="most_recent", margin=1),
            ScalingSpec("channel"), ScalingSpec("channel", pow2=False), ScalingSpec("block")]


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: f"{s.kind}-pow2{s.pow2}-{s.reduce}")
def test_cuda_quantizers_match_cpu_outputs_state_and_statistics(scaling: ScalingSpec) -> None:
    spec = QuantSpec(get_format("e4m3"), scaling=scaling)
    cpu, gpu = TensorQuantizer(spec), TensorQuantizer(spec).to(CUDA)
    gcpu = GradQuantizer(QuantSpec(get_format("e5m2"), scaling=scaling))
    ggpu = GradQuantizer(gcpu.spec).to(CUDA)
    gen = torch.Generator().manual_seed(0)
    for step in range(3):  # several calls: the delayed scaler's history must advance alike
        x = torch.randn(64, 128, generator=gen) * 10.0 ** (step - 1)
        x[0, :3] = torch.tensor([float("inf"), float("nan"), 0.0])
        with eager():
            ref = cpu(x)
        got = gpu(x.to(CUDA)).cpu()
        assert_same_bits(got, ref.numpy(), x.numpy(), f"{scaling} step {step}")
        for a, b in zip(cpu.scaler.state(), gpu.scaler.state()):
            assert torch.equal(a, b.cpu()), f"scaler state differs at step {step}"
        sc, sg = cpu.stats, gpu.stats.cpu()
        exact = [i for i, n in enumerate(STAT_NAMES) if n != "scale"]  # the mean scale is a float sum
        assert torch.equal(sc[exact], sg[exact]), dict(zip(STAT_NAMES, zip(sc.tolist(), sg.tolist())))
        torch.testing.assert_close(sc, sg, rtol=1e-6, atol=0)

        xg = x.nan_to_num().requires_grad_()
        xgg = xg.detach().to(CUDA).requires_grad_()
        g = torch.randn(64, 128, generator=gen) * 1e-3
        with eager():
            gcpu(xg).backward(g)
        ggpu(xgg).backward(g.to(CUDA))
        assert_same_bits(xgg.grad.cpu(), xg.grad.numpy(), g.numpy(), f"grad {scaling} step {step}")


def test_quantized_block_compiles_to_one_graph_on_cuda_under_bf16_autocast() -> None:
    from altgrad.quant.layers import QuantLinear

    torch.manual_seed(0)
    spec = QuantSpec(get_format("e4m3"))

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = QuantLinear(torch.nn.Linear(64, 256), "fc", spec, spec, QuantSpec(get_format("e5m2")))
            self.proj = QuantLinear(torch.nn.Linear(256, 64), "proj", spec, spec, QuantSpec(get_format("e5m2")))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.proj(F.gelu(self.fc(x)))

    eager = Block().to(CUDA)
    model = Block().to(CUDA)
    model.load_state_dict(eager.state_dict())
    x = torch.randn(8, 32, 64, device=CUDA)
    with torch.autocast(CUDA.type, dtype=torch.bfloat16):
        explained = torch._dynamo.explain(model)(x)
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        compiled = torch.compile(model, fullgraph=True)
        losses = []
        for m in (eager, compiled):
            loss = m(x).float().square().mean()
            loss.backward()
            losses.append(loss.item())
    assert np.isfinite(losses).all()
    assert losses[0] == pytest.approx(losses[1], rel=2e-2)
    for name in ("fc", "proj"):  # the weights themselves are quantized in float32, before autocast's cast
        w = getattr(eager, name).weight
        q_eager = getattr(eager, name).weight_q(w)
        q_comp = getattr(model, name).weight_q(getattr(model, name).weight)
        assert torch.equal(q_eager, q_comp)
        assert torch.isfinite(getattr(model, name).weight.grad).all()

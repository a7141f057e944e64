"""The compiled kernels (the road of quant.kernel=compiled, and of auto wherever the native kernel does not serve)
equal the eager ones bit for bit. Each test checks that the compiled side really compiled (the native kernel
answers CPU float32 calls first under auto, so these ask for kernel="compiled")."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from quant_testlib import assert_same_bits, inputs_for

from altgrad.quant import (GradQuantizer, QuantSpec, ScalingSpec, TensorQuantizer, get_format, quant_stats,
                           quantize_scaled)
from altgrad.quant.compiled import compiling
from altgrad.quant.rounding import compiled_kernel, kernel_variant


@pytest.fixture(autouse=True)
def _compile() -> Iterator[None]:
    with compiling(True):
        yield


def both(x: torch.Tensor, fmt, rounding: str, overflow: str, scale=None, pow2: bool = False
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the compiled road's result, the eager one's); fails unless the compiled kernel really compiled and ran."""
    kw = dict(rounding=rounding, overflow=overflow, seed=99, scale_pow2=pow2)
    kernel = compiled_kernel(kernel_variant(fmt, rounding, overflow), None if scale is None else
                             "pow2" if pow2 else "any")
    calls = []
    compiled = quantize_scaled(x, fmt, scale, kernel="compiled", **kw)
    assert x.device.type in kernel._compiled and not kernel._failed, f"{fmt} {rounding}: the kernel did not compile"
    real = kernel._compiled[x.device.type]
    kernel._compiled[x.device.type] = lambda *a: calls.append(1) or real(*a)
    try:
        again = quantize_scaled(x, fmt, scale, kernel="compiled", **kw)
    finally:
        kernel._compiled[x.device.type] = real
    assert calls == [1], "the compiled kernel was not the one that ran"
    assert_same_bits(again.float().reshape(-1), compiled.float().reshape(-1).numpy(), what="compiled, twice")
    return compiled, quantize_scaled(x, fmt, scale, kernel="eager", **kw)


# One compiled kernel per Variant (rounding mode + the optional steps a format needs) serves every format with it;
# the default suite compiles three variants per mode (about 10 s each, cold), `make test-slow` all of them.
FEW = (("e4m3", "overflow"), ("e7m0", "saturate"), ("bf16", "overflow"))
ALL = (*FEW, ("p3109_p1", "overflow"), ("e0m7", "saturate"), ("p3109_p4", "overflow"), ("fp16", "saturate"))


@pytest.mark.parametrize(("rounding", "cases"), [
    ("nearest", FEW), ("stochastic", FEW),
    pytest.param("nearest", ALL[3:], marks=pytest.mark.slow),
    pytest.param("stochastic", ALL[3:], marks=pytest.mark.slow),
    pytest.param("toward_zero", ALL, marks=pytest.mark.slow)])
def test_compiled_equals_eager(rounding: str, cases: tuple[tuple[str, str], ...]) -> None:
    for name, overflow in cases:
        fmt = get_format(name)
        x = torch.from_numpy(inputs_for(fmt, 100_000, seed=5))
        c, e = both(x, fmt, rounding, overflow)
        assert_same_bits(c, e.numpy(), x.numpy(), f"{name} {rounding} compiled vs eager")


@pytest.mark.slow  # two more compiled kernels (about 30 s cold)
def test_compiled_scaled_kernel_and_stats_equal_eager() -> None:
    fmt = get_format("e5m2")
    x = torch.randn(64, 96) * torch.logspace(-6, 6, 96)
    for scale in (torch.tensor(8.0), torch.exp2(torch.randint(-8, 8, (64, 1)).float())):
        c, e = both(x, fmt, "nearest", "saturate", scale)
        assert torch.equal(c, e)
        assert torch.equal(quant_stats(x, c, fmt, scale, compiled=True), quant_stats(x, e, fmt, scale,
                                                                                     compiled=False))
    xb = x.to(torch.bfloat16)
    c, e = both(xb, fmt, "stochastic", "saturate", torch.tensor(4.0))
    assert c.dtype == torch.bfloat16 and torch.equal(c, e)


@pytest.mark.slow  # compiles forward and backward of a small model (about 80 s cold)
def test_model_with_quantizers_compiles_without_graph_breaks_and_matches_eager() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(32, 16)
            self.wq = TensorQuantizer(QuantSpec(get_format("e4m3"), scaling=ScalingSpec("delayed")))
            self.iq = TensorQuantizer(QuantSpec(get_format("e4m3"), scaling=ScalingSpec("block")), "input")
            self.gq = GradQuantizer(QuantSpec(get_format("e5m2")))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.gq(torch.nn.functional.linear(self.iq(x), self.wq(self.lin.weight), self.lin.bias))

    eager = Tiny()
    model = Tiny()
    model.load_state_dict(eager.state_dict())
    compiled = torch.compile(model, fullgraph=True)  # fullgraph: a graph break would raise
    x = torch.randn(4, 32)
    for m in (eager, compiled):
        for _ in range(2):
            m(x).square().sum().backward()
    assert torch.equal(eager.lin.weight.grad, model.lin.weight.grad)
    for a, b in zip(eager.buffers(), model.buffers()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())

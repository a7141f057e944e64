"""The fused optimizer steps under torch.compile: the eager maths, and no recompiles as the lr schedule moves.

Python floats that change every step (a scheduled lr, Adam's bias corrections) would make dynamo specialise and
recompile per value until its limit, then fall back to eager for the rest of the run; GridOptim therefore passes
them as one float32 tensor. These tests compile (a few seconds, warm cache).
"""

from __future__ import annotations

import pytest
import torch
from optim_helpers import PLAIN, TinyNet

from altgrad.optim import GridOptim, ManifoldAdamW
from altgrad.optim.grid import _grid_adam_step, _grid_move
from altgrad.optim.manifold import _manifold_step
from altgrad.quant.layers import weight_grids


def _run(monkeypatch: pytest.MonkeyPatch, compiled: bool, inner: str, error_on_recompile: bool = False,
         lr_unit: str = "ulp") -> list[torch.Tensor]:
    torch.manual_seed(0)
    net = TinyNet("e4m3", scaling="tensor", dim=16)
    lr = 0.5 if lr_unit == "ulp" else 5e-3
    opt = GridOptim(net.parameters(), lr=lr, inner=inner, lr_unit=lr_unit, weight_decay=0.1, seed=3,
                    grids=weight_grids(net), kernel="compiled" if compiled else "eager", **PLAIN)
    gen = torch.Generator().manual_seed(1)
    for step in range(8):
        for group in opt.param_groups:  # a schedule: a new lr at every step
            group["lr"] = lr * (step + 1) / 8 if not group["plain"] else 1e-3
        for p in net.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        if step == 1 and error_on_recompile:  # the first steps compile (one graph per tensor rank)
            torch._dynamo.config.error_on_recompile = True
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


@pytest.mark.parametrize(("inner", "lr_unit"), [("adam", "ulp"), ("sgd", "ulp"), ("adam", "real")])
def test_compiled_grid_step_equals_eager_and_never_recompiles(monkeypatch, inner, lr_unit):
    eager = _run(monkeypatch, compiled=False, inner=inner, lr_unit=lr_unit)
    fused_step = _grid_adam_step if inner == "adam" else _grid_move
    fused_step._failed.clear()  # a compile failure (a recompile, here) would make it fall back to eager quietly
    fused_step._compiled.clear()
    with torch._dynamo.config.patch(error_on_recompile=False):
        torch._dynamo.reset()
        try:
            compiled = _run(monkeypatch, compiled=True, inner=inner, error_on_recompile=True, lr_unit=lr_unit)
        finally:
            torch._dynamo.config.error_on_recompile = False
    assert "cpu" in fused_step._compiled and not fused_step._failed, "the step fell back to eager"
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


@pytest.mark.parametrize("on", ["update", "grad"])
def test_compiled_manifold_step_matches_eager_and_never_recompiles(monkeypatch, on):
    def run(compiled: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        net = TinyNet("e4m3", scaling="tensor", dim=16)
        opt = ManifoldAdamW(net.parameters(), lr=0.5 if on == "update" else 1e-3, stiffness_on=on,
                            weight_decay=0.1, grids=weight_grids(net), kernel="compiled" if compiled else "eager",
                            **PLAIN)
        gen = torch.Generator().manual_seed(1)
        for step in range(8):
            for group in opt.param_groups:  # a schedule: a new lr at every step
                group["lr"] = group["lr"] * 0.9
            for p in net.parameters():
                p.grad = torch.randn(p.shape, generator=gen)
            if step == 1 and compiled:
                torch._dynamo.config.error_on_recompile = True
            opt.step()
        return [p.detach().clone() for p in net.parameters()]

    eager = run(compiled=False)  # the multi-tensor AdamW arithmetic
    _manifold_step._failed.clear()
    _manifold_step._compiled.clear()
    torch._dynamo.reset()
    try:
        compiled = run(compiled=True)  # one fused in-place call per tensor
    finally:
        torch._dynamo.config.error_on_recompile = False
    assert "cpu" in _manifold_step._compiled and not _manifold_step._failed, "the step fell back to eager"
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)  # float32 rounding only (eager kernels fuse FMAs)

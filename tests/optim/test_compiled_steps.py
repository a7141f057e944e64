"""The fused optimizer steps under torch.compile: bitwise the eager maths, and no recompiles as the lr schedule moves.

Python floats that change every step (a scheduled lr, Adam's bias corrections) would make dynamo specialise and
recompile per value until its limit, then fall back to eager for the rest of the run; GridOptim therefore passes
them as one float32 tensor. These tests compile (a few seconds, warm cache).
"""

from __future__ import annotations

import pytest
import torch
from optim_helpers import TinyNet

from altgrad.optim import GridOptim
from altgrad.optim.grid import _grid_adam_step, _grid_move
from altgrad.quant.layers import weight_grids


def _run(monkeypatch: pytest.MonkeyPatch, compiled: bool, inner: str, error_on_recompile: bool = False
         ) -> list[torch.Tensor]:
    monkeypatch.setenv("ALTGRAD_COMPILE", "1" if compiled else "0")
    torch.manual_seed(0)
    net = TinyNet("e4m3", scaling="tensor", dim=16)
    opt = GridOptim(net.parameters(), lr=0.5, inner=inner, weight_decay=0.1, seed=3, grids=weight_grids(net))
    gen = torch.Generator().manual_seed(1)
    for step in range(8):
        for group in opt.param_groups:  # a schedule: a new lr at every step
            group["lr"] = 0.5 * (step + 1) / 8 if not group["plain"] else 1e-3
        for p in net.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        if step == 1 and error_on_recompile:  # the first steps compile (one graph per tensor rank)
            torch._dynamo.config.error_on_recompile = True
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


@pytest.mark.parametrize("inner", ["adam", "sgd"])
def test_compiled_grid_step_equals_eager_and_never_recompiles(monkeypatch, inner):
    eager = _run(monkeypatch, compiled=False, inner=inner)
    fused_step = _grid_adam_step if inner == "adam" else _grid_move
    fused_step._failed.clear()  # a compile failure (a recompile, here) would make it fall back to eager quietly
    fused_step._compiled.clear()
    with torch._dynamo.config.patch(error_on_recompile=False):
        torch._dynamo.reset()
        try:
            compiled = _run(monkeypatch, compiled=True, inner=inner, error_on_recompile=True)
        finally:
            torch._dynamo.config.error_on_recompile = False
    assert "cpu" in fused_step._compiled and not fused_step._failed, "the step fell back to eager"
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)

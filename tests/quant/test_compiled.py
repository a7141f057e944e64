"""altgrad.quant.compiled: torch.compile with an eager fallback, and the private torch API it relies on."""

from __future__ import annotations

import warnings

import pytest
import torch

import altgrad.quant.compiled as compiled_mod
from altgrad.quant import ScalingSpec, get_format
from altgrad.quant.compiled import fused, stored_once
from altgrad.quant.rounding import draw_seed
from altgrad.quant.scaling import block_scale, make_scaler, scale_consts


def test_seed_draws_are_int32_and_follow_the_generator() -> None:
    a = draw_seed(torch.device("cpu"), torch.Generator().manual_seed(3))
    b = draw_seed(torch.device("cpu"), torch.Generator().manual_seed(3))
    assert a.dtype == torch.int32 and a.dim() == 0 and int(a) == int(b) and 0 <= int(a) < 2**31 - 1
    expected = torch.randint(0, 2**31 - 1, (), generator=torch.Generator().manual_seed(3))  # the int64 draw
    assert int(a) == int(expected)


def test_the_private_stride_order_prim_still_exists() -> None:
    """stored_once relies on prims.inductor_force_stride_order (private, torch 2.13): this fails when torch drops it."""
    from torch._inductor import inductor_prims  # noqa: F401 - registers the prim, as torch.compile's inductor does

    op = torch.ops.prims.inductor_force_stride_order.default
    t = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(op(t, t.stride()), t)


@pytest.mark.parametrize("kind", ["tensor", "delayed", "channel", "block"])
def test_a_compiled_scale_stored_once_equals_the_eager_scale(kind: str) -> None:
    fmt = get_format("e4m3")
    scaler = make_scaler(ScalingSpec(kind=kind, history=4), fmt)
    consts = scale_consts(fmt, 0, torch.device("cpu"))
    x = torch.randn(64, 48)

    def scaled(t: torch.Tensor) -> torch.Tensor:
        return t * type(scaler).scale_fn(t, consts, scaler.state(), True, "max", 32)[0]

    assert torch.equal(torch.compile(scaled, dynamic=True, fullgraph=True)(x), scaled(x))
    s = torch.tensor(4.0)
    assert stored_once(s) is s  # eager: no copy


@pytest.mark.parametrize("cols", [48, 100])
def test_block_scales_compile_right_when_rows_are_not_whole_blocks(cols: int) -> None:
    # inductor once miscompiled the expand/reshape/slice form of this: scales past the first block were wrong
    consts = scale_consts(get_format("e4m3"), 0, torch.device("cpu"))
    x = torch.randn(16, cols) * torch.logspace(-3, 3, cols)

    def scaled(t: torch.Tensor) -> torch.Tensor:
        return t * block_scale(t, consts, (), True, "max", 32)[0]

    assert torch.equal(torch.compile(scaled, dynamic=False)(x), scaled(x))


def test_a_failing_compile_warns_once_and_runs_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:

    def boom(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("no compiler today")

    monkeypatch.setattr(compiled_mod.torch, "compile", lambda *a, **k: boom)
    f = fused(lambda t: t + 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(f(torch.ones(3), compiled=True), torch.full((3,), 2.0))
        assert torch.equal(f(torch.ones(3), compiled=True), torch.full((3,), 2.0))
    assert len([w for w in caught if "no compiler today" in str(w.message)]) == 1

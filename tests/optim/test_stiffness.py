"""S(w): the grid spacing at w on the grid the forward pass uses (format + current scale), never 0."""

from __future__ import annotations

import pytest
import torch

from altgrad.optim import stiffness
from altgrad.quant import get_format

FORMATS = ["e0m7", "e1m6", "e3m4", "e4m3", "e5m2", "e7m0", "p3109_p4", "bf16"]


@pytest.mark.parametrize(("name", "scale"), [(f, s) for f in FORMATS for s in (1.0, 2.0**5, 2.0**-3)
                                             if f != "bf16" or s == 1.0])  # bf16 ÷ 2^-3 leaves float32
def test_pow2_is_the_distance_to_the_next_larger_grid_value(name, scale):
    fmt = get_format(name)
    grid = fmt.values()
    positive = grid[(grid >= 0)][:-1]  # every non-negative value but the largest
    following = grid[(grid >= 0)][1:]
    w = positive / scale  # the grid {v / s} a weight lives on under scale s
    s = stiffness(w, fmt, torch.tensor(scale), "pow2")
    assert torch.equal(s, (following - positive) / scale)
    assert torch.equal(stiffness(-w, fmt, torch.tensor(scale), "pow2"), s)  # symmetric in the sign


@pytest.mark.parametrize("name", FORMATS)
def test_pow2_uses_the_quant_core_ulp_and_never_vanishes(name):
    fmt = get_format(name)
    w = torch.cat([torch.zeros(1), torch.randn(500) * 10.0 ** torch.randint(-6, 3, (500,))])
    scale = torch.tensor(2.0**7)
    s = stiffness(w, fmt, scale, "pow2")
    assert torch.equal(s, fmt.ulp(w * scale) / scale)
    assert s[0] == fmt.min_subnormal / 2.0**7
    assert bool((s > 0).all())


@pytest.mark.parametrize("name", ["e3m4", "e4m3", "e5m2", "e7m0", "p3109_p4"])
def test_smooth_is_within_a_factor_two_of_pow2_and_equal_below_the_smallest_normal(name):
    fmt = get_format(name)
    scale = torch.tensor(4.0)
    w = torch.cat([torch.zeros(1), (torch.rand(2000) * 2 - 1) * fmt.max / 4.0])
    pow2, smooth = stiffness(w, fmt, scale, "pow2"), stiffness(w, fmt, scale, "smooth")
    normal = (w * scale).abs() >= fmt.min_normal
    ratio = smooth[normal] / pow2[normal]
    assert bool(((ratio >= 1) & (ratio < 2)).all())
    assert torch.equal(smooth[~normal], pow2[~normal])  # the subnormal floor min_subnormal / s
    assert torch.allclose(smooth[normal], w[normal].abs() * 2.0**-fmt.mbits)


def test_per_row_scales_broadcast():
    fmt = get_format("e4m3")
    w = torch.randn(3, 5)
    scale = torch.tensor([[1.0], [8.0], [64.0]])
    s = stiffness(w, fmt, scale)
    for row in range(3):
        assert torch.equal(s[row], fmt.ulp(w[row] * scale[row]) / scale[row])


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="valid: pow2, smooth"):
        stiffness(torch.ones(2), get_format("e4m3"), 1.0, "exact")

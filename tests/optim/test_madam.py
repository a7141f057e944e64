"""Madam: the paper's multiplicative update on a small tensor, sign preservation and the p_scale bound."""

from __future__ import annotations

import math

import pytest
import torch
from optim_helpers import PLAIN, quantizer

from altgrad.optim import Madam


def reference_madam(w0: list[float], grads: list[list[float]], lr: float, p_scale: float, g_bound: float,
                    beta: float) -> list[float]:
    """Bernstein et al. 2020 (Algorithm 1, as in the authors' code), coordinate by coordinate in float64."""
    w = list(w0)
    bound = p_scale * math.sqrt(sum(x * x for x in w0) / len(w0))
    v = [0.0] * len(w)
    for t, g in enumerate(grads, start=1):
        v = [beta * vi + (1 - beta) * gi * gi for vi, gi in zip(v, g)]
        for i, gi in enumerate(g):
            denom = math.sqrt(v[i] / (1 - beta**t))
            g_hat = 0.0 if denom == 0 else gi / denom
            g_hat = min(max(g_hat, -g_bound), g_bound)
            w[i] = w[i] * math.exp(-lr * math.copysign(1.0, w[i]) * g_hat if w[i] != 0 else 0.0)
            w[i] = min(max(w[i], -bound), bound)
    return w


@pytest.mark.parametrize(("lr", "g_bound"), [(0.01, 10.0), (0.3, 1.5)])  # second: both clamps are active
def test_matches_the_paper_update_formula(lr, g_bound):
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(2, 5, generator=gen)
    w0[0, 0] = 0.0  # zero stays zero
    grads = [torch.randn(2, 5, generator=gen) * (30.0 if t == 4 else 1.0) for t in range(8)]  # a spike at t=4
    for g in grads:
        g[1, 1] = 0.0  # a coordinate that never sees a gradient: 0/0 → ĝ = 0
    p = torch.nn.Parameter(w0.clone())
    opt = Madam([p], lr=lr, g_bound=g_bound)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    expected = reference_madam(w0.flatten().tolist(), [g.flatten().tolist() for g in grads], lr, 3.0, g_bound,
                               0.999)
    assert torch.allclose(p.detach().flatten().double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5)
    assert p[0, 0] == 0.0 and p[1, 1] == w0[1, 1]


def test_signs_never_flip_and_magnitudes_stay_bounded():
    torch.manual_seed(0)
    w0 = torch.randn(64, 32)
    p = torch.nn.Parameter(w0.clone())
    opt = Madam([p], lr=0.5, g_bound=10.0)
    bound = 3.0 * w0.square().mean().sqrt()
    for _ in range(100):
        p.grad = torch.randn_like(p) * 10 + torch.sign(p.detach()) * 5  # a strong push towards zero
        opt.step()
        assert torch.equal(torch.sign(p.detach()), torch.sign(w0))
        assert bool((p.detach().abs() <= bound * (1 + 1e-6)).all())


def test_a_step_changes_log_magnitude_by_at_most_lr_times_g_bound():
    p = torch.nn.Parameter(torch.tensor([0.5, -0.25, 1.0]))
    opt = Madam([p], lr=0.1, g_bound=2.0)
    p.grad = torch.tensor([1.0, -1.0, 1.0])  # first step: ĝ = g/|g|·1 = sign(g)
    opt.step()
    ratio = (p.detach() / torch.tensor([0.5, -0.25, 1.0])).log()
    assert torch.allclose(ratio, torch.tensor([-0.1, -0.1, -0.1]), atol=1e-6)


def test_with_grids_only_quantized_weights_are_multiplicative():
    q = quantizer("e4m3", "tensor")
    w, b = torch.nn.Parameter(torch.randn(4, 4)), torch.nn.Parameter(torch.zeros(4))
    opt = Madam([w, b], grids={w: q}, **PLAIN | {"plain_lr": 1e-2})
    w.grad, b.grad = torch.randn(4, 4), torch.ones(4)
    opt.step()
    assert opt.plain_params() == [b]
    assert torch.allclose(b.detach(), torch.full((4,), -1e-2))  # AdamW's first step: −lr·sign(g)


def test_bad_hyper_parameters_are_rejected():
    p = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match="p_scale"):
        Madam([p], p_scale=0.0)
    with pytest.raises(ValueError, match="beta"):
        Madam([p], beta=1.0)

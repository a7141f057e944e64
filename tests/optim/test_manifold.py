"""ManifoldAdamW: lr in ULPs for `update`; for `grad` the stiffness cancels in Adam unless a weight changes binade."""

from __future__ import annotations

import math

import pytest
import torch
from optim_helpers import quantizer

from altgrad.optim import ManifoldAdamW, stiffness
from altgrad.quant.codes import encode


def hand_adam_ratio(grads: list[list[float]], betas: tuple[float, float], eps: float) -> list[list[float]]:
    """m̂/(√v̂+ε) after each step, per coordinate, in float64 from the textbook recursion."""
    beta1, beta2 = betas
    m = [0.0] * len(grads[0])
    v = [0.0] * len(grads[0])
    out = []
    for t, g in enumerate(grads, start=1):
        m = [beta1 * mi + (1 - beta1) * gi for mi, gi in zip(m, g)]
        v = [beta2 * vi + (1 - beta2) * gi * gi for vi, gi in zip(v, g)]
        out.append([(mi / (1 - beta1**t)) / (math.sqrt(vi / (1 - beta2**t)) + eps) for mi, vi in zip(m, v)])
    return out


def test_update_moves_each_weight_by_lr_times_adam_ratio_ulps():
    q = quantizer("e4m3", "tensor")
    # w·s mid-binade (s = 256 from the amax sentinel 1.0, which gets no gradient and so never moves)
    w0 = torch.tensor([1.0, 20.0, -40.0, 100.0, -5.5, 0.5]) / 256
    w0[0] = 1.0
    p = torch.nn.Parameter(w0.clone())
    lr, betas, eps = 0.2, (0.9, 0.95), 1e-8
    opt = ManifoldAdamW([p], lr=lr, betas=betas, eps=eps, grids={p: q})
    gen = torch.Generator().manual_seed(0)
    grads = [(torch.rand(6, generator=gen) * 2 - 1).tolist() for _ in range(5)]
    for g in grads:
        g[0] = 0.0
    expected = hand_adam_ratio(grads, betas, eps)
    for g, ratio in zip(grads, expected):
        assert q.scale_for(p).item() == 256.0
        before = p.detach().clone()
        ulp = torch.tensor([2.0 ** (math.floor(math.log2(abs(x) * 256)) - 3) / 256 for x in before.tolist()])
        p.grad = torch.tensor(g)
        opt.step()
        moved = (p.detach() - before) / ulp
        hand = -lr * torch.tensor(ratio[1:], dtype=torch.float64)
        assert torch.allclose(moved[1:].double(), hand, rtol=1e-5, atol=1e-6)
        assert p[0].item() == 1.0


def test_integer_lr_moves_the_quantized_weight_by_whole_grid_points():
    q = quantizer("e4m3", "none")
    fmt = q.spec.format
    start = torch.tensor([1.25, 2.5, -3.0, 12.0, -20.0, 0.5625])  # on grid, ≥ 3 points from a binade edge below
    p = torch.nn.Parameter(start.clone())
    opt = ManifoldAdamW([p], lr=3.0, eps=0.0, grids={p: q})
    p.grad = -torch.sign(start)  # first Adam step: m̂/√v̂ = sign(g) exactly, so Δ = 3 ULPs away from zero
    opt.step()
    codes_before = encode(start, fmt).to(torch.int64) & 0x7F
    codes_after = encode(q(p.detach()), fmt).to(torch.int64) & 0x7F
    assert torch.equal(codes_after - codes_before, torch.full((6,), 3))
    assert torch.equal(q(p.detach()), p.detach())  # landed exactly on grid points


def test_grad_on_constant_stiffness_format_is_adamw_with_eps_over_s():
    # e0m7 without scaling: S = 2^-7 for every |w| < 1, so g·S only rescales Adam's moments
    torch.manual_seed(0)
    w0 = (torch.rand(64) * 1.2 - 0.6)
    grads = [torch.randn(64) for _ in range(40)]
    eps = 1e-8
    runs = {}
    for name in ("manifold", "adamw_eps_over_s", "adamw_eps"):
        p = torch.nn.Parameter(w0.clone())
        if name == "manifold":
            opt = ManifoldAdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=eps, weight_decay=0.1, stiffness_on="grad",
                                grids={p: quantizer("e0m7")})
        else:
            opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, foreach=True,
                                    eps=eps * 2**7 if name == "adamw_eps_over_s" else eps)
        for g in grads:
            p.grad = g.clone()
            opt.step()
        runs[name] = p.detach().clone()
    assert bool((runs["manifold"].abs() < 0.99).all())
    assert torch.equal(runs["manifold"], runs["adamw_eps_over_s"])  # exact: S is a power of two
    # ... and AdamW with the same ε differs only through ε (|Δw| ~ 1e-6 after 40 steps of ~1e-3)
    assert not torch.equal(runs["manifold"], runs["adamw_eps"])
    assert torch.allclose(runs["manifold"], runs["adamw_eps"], rtol=0, atol=1e-5)


def test_grad_on_e4m3_differs_from_adamw_only_where_weights_changed_binade():
    torch.manual_seed(1)
    n = 256
    w0 = torch.rand(n) * 3.5 + 0.5  # e4m3 normals, unscaled: binades [0.5,1), [1,2), [2,4)
    drift = torch.randn(n).sign()
    grads = [drift * 0.5 + torch.randn(n) for _ in range(60)]
    q = quantizer("e4m3", "none")
    p_m, p_a = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    manifold = ManifoldAdamW([p_m], lr=0.02, betas=(0.9, 0.95), eps=0.0, stiffness_on="grad", grids={p_m: q})
    adamw = torch.optim.AdamW([p_a], lr=0.02, betas=(0.9, 0.95), eps=0.0, weight_decay=0.0, foreach=True)
    crossed = torch.zeros(n, dtype=torch.bool)
    binade0 = torch.floor(torch.log2(w0.abs()))
    for g in grads:
        crossed |= torch.floor(torch.log2(p_m.detach().abs())) != binade0  # S(w) at this step ≠ S(w0)
        p_m.grad, p_a.grad = g.clone(), g.clone()
        manifold.step()
        adamw.step()
    differs = p_m.detach() != p_a.detach()
    assert int(crossed.sum()) >= 10 and int((~crossed).sum()) >= 10
    assert not bool((differs & ~crossed).any()), "a weight that stayed in its binade left AdamW's trajectory"
    assert bool(differs[crossed].float().mean() > 0.9)


def test_update_weight_decay_is_adamw_decay_at_rate_lr_times_s():
    q = quantizer("e4m3", "none")
    p = torch.nn.Parameter(torch.tensor([1.5, -3.0, 40.0]))
    before = p.detach().clone()
    s = stiffness(before, q.spec.format, 1.0)
    opt = ManifoldAdamW([p], lr=0.5, weight_decay=0.2, eps=0.0, grids={p: q})
    p.grad = torch.full((3,), 1e-3)  # first step: m̂/√v̂ = 1 exactly
    opt.step()
    expected = before - 0.5 * s * 0.2 * before - 0.5 * s * 1.0
    assert torch.allclose(p.detach(), expected, rtol=1e-6)


def test_smooth_stiffness_steps_proportionally_to_the_weight():
    q = quantizer("e4m3", "none")
    w0 = torch.tensor([1.0, 1.9, 3.0, 7.5])
    p = torch.nn.Parameter(w0.clone())
    opt = ManifoldAdamW([p], lr=0.25, eps=0.0, stiffness_kind="smooth", grids={p: q})
    p.grad = torch.ones(4)
    opt.step()
    assert torch.allclose((w0 - p.detach()) / w0, torch.full((4,), 0.25 * 2.0**-3), rtol=1e-6)


def test_parameters_without_a_grid_are_stepped_like_torch_adamw():
    torch.manual_seed(2)
    quantized, plain = torch.nn.Parameter(torch.randn(4, 4)), torch.nn.Parameter(torch.randn(4))
    twin = torch.nn.Parameter(plain.detach().clone())
    opt = ManifoldAdamW([{"params": [quantized, plain], "weight_decay": 0.1}], plain_lr=3e-3,
                        plain_betas=(0.9, 0.99), plain_eps=1e-8, grids={quantized: quantizer("e4m3", "tensor")})
    ref = torch.optim.AdamW([twin], lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, foreach=True)
    assert [g["plain"] for g in opt.param_groups] == [False, True]
    assert opt.plain_params() == [plain]
    for _ in range(5):
        g = torch.randn(4)
        quantized.grad, plain.grad, twin.grad = torch.randn(4, 4), g.clone(), g.clone()
        opt.step()
        ref.step()
    assert torch.equal(plain.detach(), twin.detach())


def test_bad_arguments_fail_with_the_valid_choices():
    p = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match="valid: update, grad"):
        ManifoldAdamW([p], stiffness_on="moments", grids={p: quantizer("e4m3")})
    with pytest.raises(ValueError, match="valid: pow2, smooth"):
        ManifoldAdamW([p], stiffness_kind="exact", grids={p: quantizer("e4m3")})
    with pytest.raises(ValueError, match="needs `grids`"):
        ManifoldAdamW([p])

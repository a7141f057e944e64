"""Madam: multiplicative weight updates (Bernstein, Zhao, Meister, Liu, Anandkumar, Yue 2020, "Learning
compositional functions via multiplicative weight updates").

w ← w · exp(−lr · sign(w) · ĝ), ĝ = g / √v̂ (v̂: bias-corrected EMA of g²), with ĝ clamped to ±g_bound and |w| to
p_scale · rms(w at the first step).  A step changes log|w| by at most lr·g_bound: a relative step, what a ULP
step on a floating-point grid approximates, so this is the published anchor for ``manifold``.  Signs never flip.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from altgrad.optim.base import QuantAwareOptimizer, check_hyper
from altgrad.optim.stiffness import Grid


class Madam(QuantAwareOptimizer):
    """The paper's Algorithm (and the authors' reference code) as a multi-tensor step.

    ``lr`` is the relative step in units of ĝ (the paper's default 0.01).  The multiplicative rule has no weight
    decay (it is bounded by ``p_scale``, as in the paper); ``weight_decay`` is the plain AdamW groups' decay unless
    ``plain_weight_decay`` is given (the configs give the baseline's).  With ``grids``
    given, the rule updates the quantized weights and everything else is plain AdamW (like the other ULP-aware
    optimizers); ``grids=None`` applies the rule to every parameter (zero-initialised ones would never move).
    """

    needs_grid = False

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.01,
        p_scale: float = 3.0,
        g_bound: float = 10.0,
        beta: float = 0.999,
        weight_decay: float = 0.0,
        grids: Mapping[Tensor, Grid] | None = None,
        plain_lr: float | None = None,
        plain_betas: tuple[float, float] | None = None,
        plain_eps: float | None = None,
        plain_weight_decay: float | None = None,
    ) -> None:
        check_hyper("Madam", lr=lr, weight_decay=weight_decay)
        if p_scale <= 0 or g_bound <= 0:
            raise ValueError(f"Madam: p_scale={p_scale}, g_bound={g_bound} are not valid; valid: both > 0")
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Madam: beta={beta} is not valid; valid: [0, 1)")
        defaults = {"lr": lr, "p_scale": p_scale, "g_bound": g_bound, "beta": beta, "weight_decay": weight_decay}
        super().__init__(params, defaults, grids, plain_lr, plain_betas, plain_eps, plain_weight_decay)

    def _rule_step(self, group: dict[str, Any]) -> None:
        params = self._with_grads(group)
        if not params:
            return
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                # the bound is fixed by the weights Madam first sees: p_scale × their rms
                state["max"] = group["p_scale"] * p.detach().float().square().mean().sqrt()
        states = [self.state[p] for p in params]
        grads = [p.grad for p in params]
        beta = group["beta"]
        for state in states:
            state["step"] += 1
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        torch._foreach_mul_(exp_avg_sqs, beta)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta)
        denom = torch._foreach_div(exp_avg_sqs, [1 - beta ** s["step"].item() for s in states])
        torch._foreach_sqrt_(denom)
        g_normed = torch._foreach_div(grads, denom)
        for g in g_normed:
            torch.nan_to_num_(g, nan=0.0)  # 0/0 where g and v are both 0 (the reference sets these to 0)
        torch._foreach_clamp_min_(g_normed, -group["g_bound"])
        torch._foreach_clamp_max_(g_normed, group["g_bound"])
        factors = torch._foreach_mul(g_normed, -group["lr"])
        torch._foreach_mul_(factors, torch._foreach_sign(params))
        torch._foreach_exp_(factors)
        torch._foreach_mul_(params, factors)  # exp(·) > 0: no sign flips
        for p, state in zip(params, states):
            bound = state["max"].to(device=p.device, dtype=p.dtype)
            p.clamp_(-bound, bound)

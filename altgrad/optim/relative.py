"""RelativeAdamW, the relative-step control: Δw = −lr·|w|·m̂/(√v̂+ε), AdamW with a per-coordinate step ∝ |w|.

ManifoldAdamW[update] scales AdamW's step by one ULP of w, S(w) = |w|·2^−M·(1 … 2) in a normal binade, so it is a
relative step with the format's staircase on top.  This control keeps the step ∝ |w| and drops the format, so
"ULP geometry helps" and "a step proportional to |w| helps" are separate arms.  Everything else is ManifoldAdamW's:
decoupled decay at the same per-coordinate rate (w ← w − lr·|w|·wd·w), the same rule/plain split (the rule steps
exactly the weights that have a grid; the others are plain AdamW at the baseline's hyper-parameters), the same
Adam arithmetic.  ``lr`` is a fraction of |w| per step per unit of m̂/(√v̂+ε) (lr·2^−M ULPs, roughly).  A weight
at exactly 0 never moves (as in Madam); nanoGPT initialises no matmul weight to 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from altgrad.optim.adam import adamw_step_, init_adam_state
from altgrad.optim.base import QuantAwareOptimizer, check_hyper
from altgrad.optim.stiffness import Grid
from altgrad.optim.kernels import NATIVE_STEP_KERNELS, step_kernel
from altgrad.optim.native_step import native_refusal, stiff_adam_step_
from altgrad.quant.compiled import fused


class RelativeAdamW(QuantAwareOptimizer):
    """AdamW with per-coordinate learning rate lr·|w| on the weights that have a grid (every parameter when
    ``grids`` is None); plain AdamW for the rest.  See the module docstring.  ``kernel``: as ManifoldAdamW's
    (``compiled``: ``relative_step_`` through torch.compile; ``native``: its C++ twin, the same bits; ``auto``: native
    where it serves, else compiled; ``eager``: the multi-tensor ``adamw_step_``)."""

    needs_grid = False  # |w| needs no format: with grids=None every parameter takes the rule

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.99),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        grids: Mapping[Tensor, Grid] | None = None,
        plain_lr: float | None = None,
        plain_betas: tuple[float, float] | None = None,
        plain_eps: float | None = None,
        plain_weight_decay: float | None = None,
        kernel: str | None = None,
    ) -> None:
        self.kernel = step_kernel(kernel, "RelativeAdamW", NATIVE_STEP_KERNELS)
        check_hyper("RelativeAdamW", lr=lr, lr_means=" (a fraction of |w| per step)", betas=betas, eps=eps,
                    weight_decay=weight_decay)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults, grids, plain_lr, plain_betas, plain_eps, plain_weight_decay)

    def _rule_step(self, group: dict[str, Any]) -> None:
        params = self._with_grads(group)
        if not params:
            return
        for p in params:
            if not self.state[p]:
                init_adam_state(self.state[p], p)
        if self.kernel != "eager" and not torch.compiler.is_compiling():
            beta1, beta2 = group["betas"]
            for p in params:
                hyper = self._advance_adam(p, group)
                state = self.state[p]
                args = (p.detach(), p.grad, state["exp_avg"], state["exp_avg_sq"], hyper, beta1, beta2)
                if self.kernel != "compiled" and stiff_adam_step_(*args, "abs"):
                    continue
                if self.kernel == "native":
                    raise ValueError(native_refusal("RelativeAdamW", p))
                _relative_step(*args, compiled=True)
            return
        beta1, beta2 = group["betas"]
        adamw_step_(params, [p.grad for p in params], *self._adam_lists(params),
                    stiffness=[p.detach().abs() for p in params], lr=group["lr"], beta1=beta1, beta2=beta2,
                    eps=group["eps"], weight_decay=group["weight_decay"])


def relative_step_(w: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, hyper: Tensor, beta1: float,
                   beta2: float) -> None:
    """One tensor's RelativeAdamW step in place, ``manifold_step_``'s arithmetic with S = |w| (scalars from
    ``hyper``: lr, weight_decay, 1 − β1^t, √(1 − β2^t), ε)."""
    lr, wd, bc1, bc2_sqrt, eps = hyper.unbind(0)
    stiff = w.abs()
    w.sub_(lr * wd * stiff * w)  # decoupled decay at the per-coordinate rate lr·|w|
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (exp_avg_sq.sqrt() / bc2_sqrt + eps) / stiff  # m̂/((√v̂+ε)/|w|) = |w|·m̂/(√v̂+ε); 1/0 → 0 step
    w.sub_(lr / bc1 * exp_avg / denom)


_relative_step = fused(relative_step_)

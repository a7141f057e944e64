"""ManifoldAdamW: AdamW whose step is measured in ULPs of each weight's own grid.

``stiffness_on="update"`` (the hypothesis): Δw = −lr·S(w)·m̂/(√v̂+ε), so ``lr`` is in ULPs per step and a weight
moves the same number of grid points whatever its binade.  ``stiffness_on="grad"`` (the seed design, kept as an
ablation): Adam's moments see g·S.  Adam divides by √v̂ per coordinate, so a stiffness that stays constant for
~1/(1−β2) steps cancels and the trajectory is AdamW's (with ε/S for ε); it differs only after a weight changes
binade.  ``lr`` is then in real units, as AdamW's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from altgrad.optim.adam import adamw_step_, init_adam_state
from altgrad.optim.base import QuantAwareOptimizer, check_hyper
from altgrad.optim.stiffness import STIFFNESS_KINDS, Grid, grid_stiffness
from altgrad.optim.kernels import NATIVE_STEP_KERNELS, step_kernel
from altgrad.optim.native_step import native_refusal, stiff_adam_step_
from altgrad.quant.compiled import fused

STIFFNESS_PLACEMENTS = ("update", "grad")

_stiffness = fused(grid_stiffness)  # scale + stiffness in one compiled loop per tensor (stiffness_of)


class ManifoldAdamW(QuantAwareOptimizer):
    """AdamW with per-coordinate learning rate lr·S(w) (``update``) or on the stiff gradient g·S(w) (``grad``).

    Weight decay is decoupled as in AdamW, at the same per-coordinate rate (w ← w − lr·S·wd·w for ``update``).
    Parameters without a grid are stepped by plain AdamW at ``plain_lr`` (see QuantAwareOptimizer).
    ``kernel``: ``compiled`` (``manifold_step_``, one torch.compile'd pass per tensor), ``native`` (the same
    arithmetic in one C++ pass, ``native_step``: the same bits), ``auto`` (native where it serves, else compiled: what
    runs by default) or ``eager`` (torch's multi-tensor AdamW ops with a stiffness list, ``adamw_step_``); eager
    agrees with the others to float32 rounding, not bit for bit (see ``manifold_step_``). None: ``auto`` unless
    inside compiled.compiling(False).
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1.0,
        betas: tuple[float, float] = (0.9, 0.99),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        stiffness_on: str = "update",
        stiffness_kind: str = "pow2",
        grids: Mapping[Tensor, Grid] | None = None,
        plain_lr: float | None = None,
        plain_betas: tuple[float, float] | None = None,
        plain_eps: float | None = None,
        plain_weight_decay: float | None = None,
        kernel: str | None = None,
    ) -> None:
        self.kernel = step_kernel(kernel, "ManifoldAdamW", NATIVE_STEP_KERNELS)
        check_hyper("ManifoldAdamW", lr=lr, lr_means=" (ULPs per step for 'update')", betas=betas, eps=eps,
                    weight_decay=weight_decay)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                        "stiffness_on": stiffness_on, "stiffness_kind": stiffness_kind}
        super().__init__(params, defaults, grids, plain_lr, plain_betas, plain_eps, plain_weight_decay)
        for group in self.param_groups:
            if group["stiffness_on"] not in STIFFNESS_PLACEMENTS:
                raise ValueError(f"ManifoldAdamW: stiffness_on={group['stiffness_on']!r} is not valid; valid: "
                                 f"{', '.join(STIFFNESS_PLACEMENTS)}")
            if group["stiffness_kind"] not in STIFFNESS_KINDS:
                raise ValueError(f"ManifoldAdamW: stiffness_kind={group['stiffness_kind']!r} is not valid; "
                                 f"valid: {', '.join(STIFFNESS_KINDS)}")

    def stiffness_of(self, p: Tensor, kind: str | None = None) -> Tensor:
        """S(p) on p's grid at its current scale, in p's dtype."""
        grid = self.grid_of(p)
        kind = kind or self.defaults["stiffness_kind"]
        # a plain tensor view, not the Parameter: dynamo keeps Parameters static-shaped (a recompile per shape)
        return _stiffness(p.detach(), grid, kind, compiled=self.kernel == "compiled").to(p.dtype)

    def _rule_step(self, group: dict[str, Any]) -> None:
        params = self._with_grads(group)
        if not params:
            return
        for p in params:
            if not self.state[p]:
                init_adam_state(self.state[p], p)
        if self.kernel != "eager" and not torch.compiler.is_compiling():
            self._fused_rule_step(group, params)
            return
        stiff = [self.stiffness_of(p, group["stiffness_kind"]) for p in params]
        grads = [p.grad for p in params]
        beta1, beta2 = group["betas"]
        kw = {"lr": group["lr"], "beta1": beta1, "beta2": beta2, "eps": group["eps"],
              "weight_decay": group["weight_decay"]}
        if group["stiffness_on"] == "update":
            adamw_step_(params, grads, *self._adam_lists(params), stiffness=stiff, **kw)
        else:
            adamw_step_(params, torch._foreach_mul(grads, stiff), *self._adam_lists(params), **kw)

    def _fused_rule_step(self, group: dict[str, Any], params: list[Tensor]) -> None:
        """The fused path: stiffness, decay, moments and update in one in-place call per tensor, native or compiled."""
        beta1, beta2 = group["betas"]
        on_update, kind = group["stiffness_on"] == "update", group["stiffness_kind"]
        for p in params:
            hyper = self._advance_adam(p, group)
            state, grid = self.state[p], self.grid_of(p)
            args = (p.detach(), p.grad, state["exp_avg"], state["exp_avg_sq"])
            if self.kernel != "compiled" and stiff_adam_step_(*args, hyper, beta1, beta2, kind, on_update, grid):
                continue
            if self.kernel == "native":
                raise ValueError(native_refusal("ManifoldAdamW", p))
            _manifold_step(*args, grid, kind, on_update, hyper, beta1, beta2, compiled=True)


def manifold_step_(w: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, grid: Grid, kind: str,
                   on_update: bool, hyper: Tensor, beta1: float, beta2: float) -> None:
    """One tensor's ManifoldAdamW step in place: the arithmetic of ``adamw_step_`` with per-step scalars read from
    ``hyper`` (``adam.hyper_tensor``: lr, weight_decay, 1 − β1^t, √(1 − β2^t), ε; betas are per-run constants).

    The optimizer runs it compiled (``kernel="compiled"``: one pass over the tensor instead of ~8 multi-tensor
    kernels); with ``kernel="eager"`` it steps through ``adamw_step_`` instead, which is bitwise torch's AdamW
    arithmetic. The two agree up to float32 rounding (eager kernels fuse multiply-adds; ~1e-6 relative after 10 steps
    on the nano model).
    """
    lr, wd, bc1, bc2_sqrt, eps = hyper.unbind(0)
    stiff = grid_stiffness(w, grid, kind).to(w.dtype)
    if on_update:
        w.sub_(lr * wd * stiff * w)  # decoupled decay at the per-coordinate rate lr·S
    else:
        grad = grad * stiff
        w.mul_(1 - lr * wd)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = exp_avg_sq.sqrt() / bc2_sqrt + eps
    if on_update:
        denom = denom / stiff  # m̂/((√v̂+ε)/S) = S·m̂/(√v̂+ε)
    w.sub_(lr / bc1 * exp_avg / denom)


_manifold_step = fused(manifold_step_)

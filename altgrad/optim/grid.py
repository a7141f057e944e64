"""GridOptim: weights live on their format's grid; each step moves them to a neighbouring grid value, unbiased.

An inner rule (``sgd`` with momentum, or ``adam``) proposes a step.  With the lr in ULPs it is k grid points and
the weight moves ⌊k⌋ points plus one more with probability frac(k) (E[points moved] = k, so sub-ULP steps still
move, with the right probability; walks cross binade edges exactly by signed-ordinal arithmetic).  With the lr in
real units it is δ in weight units and w + δ is stochastically rounded onto the grid (E[new w] = w + δ, also where
the grid spacing halves below a binade edge).  Both saturate at ±max.  Pair it with ``quant.master=none``: there
is no fp32 master copy, the weight tensor *is* the grid value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from altgrad.optim.adam import hyper_tensor, init_adam_state
from altgrad.optim.base import QuantAwareOptimizer, check_hyper
from altgrad.optim.grid_walk import check_walkable, grid_adam_step_, grid_move_
from altgrad.optim.kernels import step_kernel
from altgrad.optim.stiffness import Grid
from altgrad.quant.compiled import fused
from altgrad.quant.rounding import draw_seed

INNER_RULES = ("sgd", "adam")
LR_UNITS = ("ulp", "real")

_grid_move = fused(grid_move_)  # scale + move in one compiled loop per tensor (uncompiled with kernel="eager")
_grid_adam_step = fused(grid_adam_step_)  # + Adam's moments, in place


class GridOptim(QuantAwareOptimizer):
    """Stochastic whole-grid-point steps proposed by an inner SGD-momentum or Adam rule.

    ``lr_unit="ulp"``: k = −lr·(d + wd·w) grid points (d: the inner direction, the momentum buffer or
    m̂/(√v̂+ε)); ``lr_unit="real"``: δ = −lr·(d + wd·w) in weight units, w + δ stochastically rounded to the grid.
    The random draws come from a torch.Generator per device seeded with ``seed`` (default: torch.initial_seed(),
    the run seed Lightning's seed_everything sets); its state is part of ``state_dict``, so a resumed run draws
    exactly what an uninterrupted one would.  ``kernel``: ``compiled`` (the per-tensor step through torch.compile)
    or ``eager`` (the same function uncompiled); None: ``compiled`` unless inside compiled.compiling(False).
    """

    keeps_weights_on_grid = True

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1.0,
        inner: str = "adam",
        lr_unit: str = "ulp",
        momentum: float = 0.9,
        dampening: float = 0.0,
        nesterov: bool = False,
        betas: tuple[float, float] = (0.9, 0.99),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        seed: int | None = None,
        grids: Mapping[Tensor, Grid] | None = None,
        plain_lr: float | None = None,
        plain_betas: tuple[float, float] | None = None,
        plain_eps: float | None = None,
        plain_weight_decay: float | None = None,
        kernel: str | None = None,
    ) -> None:
        self.kernel = step_kernel(kernel, "GridOptim")
        check_hyper("GridOptim", lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        if inner not in INNER_RULES:
            raise ValueError(f"GridOptim: inner={inner!r} is not valid; valid: {', '.join(INNER_RULES)}")
        if lr_unit not in LR_UNITS:
            raise ValueError(f"GridOptim: lr_unit={lr_unit!r} is not valid; valid: {', '.join(LR_UNITS)}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"GridOptim: momentum={momentum} is not valid; valid: [0, 1)")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("GridOptim: nesterov=True needs momentum > 0 and dampening = 0")
        if grids is not None and not any(True for _ in grids):
            raise ValueError("GridOptim needs at least one quantized weight (none has a weight quantizer): choose a "
                             "format other than fp32 and keep weights on the grid with quant.master=none")
        defaults = {"lr": lr, "inner": inner, "lr_unit": lr_unit, "momentum": momentum, "dampening": dampening,
                        "nesterov": nesterov, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults, grids, plain_lr, plain_betas, plain_eps, plain_weight_decay)
        for p in self.grids or {}:
            check_walkable(self.grids[p].spec.format)
        self.seed = int(torch.initial_seed() if seed is None else seed) & 0x7FFF_FFFF_FFFF_FFFF
        self._generators: dict[str, torch.Generator] = {}

    # -- random draws ------------------------------------------------------------------------------------------
    def _generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[key]

    def state_dict(self) -> dict[str, Any]:
        """torch's optimizer state plus the seed and each device generator's state (uint8 tensors)."""
        sd = super().state_dict()
        sd["rng"] = {"seed": self.seed, "generators": {k: g.get_state() for k, g in self._generators.items()}}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        rng = state_dict.pop("rng", None)
        super().load_state_dict(state_dict)
        if rng is not None:
            self.seed = int(rng["seed"])
            self._generators = {}
            for key, gen_state in rng["generators"].items():
                self._generator(torch.device(key)).set_state(gen_state.cpu())

    # -- the step ----------------------------------------------------------------------------------------------
    def _rule_step(self, group: dict[str, Any]) -> None:
        params = self._with_grads(group)
        if not params:
            return
        if group["inner"] == "adam":
            for p in params:
                if not self.state[p]:
                    init_adam_state(self.state[p], p)
            beta1, beta2 = group["betas"]
            for p in params:  # moments, ULP conversion and walk: one fused in-place call per tensor
                hyper = self._advance_adam(p, group)
                state = self.state[p]
                _grid_adam_step(p.detach(), p.grad, state["exp_avg"], state["exp_avg_sq"], self.grid_of(p),
                                draw_seed(p.device, self._generator(p.device)), hyper,
                                group["lr_unit"] == "real", beta1, beta2, compiled=self.kernel == "compiled")
        else:
            for p, d in zip(params, self._sgd_directions(params, group)):
                self._move(p, d, group)

    def _sgd_directions(self, params: list[Tensor], group: dict[str, Any]) -> list[Tensor]:
        """torch.optim.SGD's momentum direction (first step: the gradient itself); read-only for the caller."""
        grads = [p.grad for p in params]
        momentum = group["momentum"]
        if momentum == 0:
            return grads
        old = [p for p in params if "momentum_buffer" in self.state[p]]
        for p in params:
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = p.grad.detach().clone()
        if old:
            bufs = [self.state[p]["momentum_buffer"] for p in old]
            torch._foreach_mul_(bufs, momentum)
            torch._foreach_add_(bufs, [p.grad for p in old], alpha=1 - group["dampening"])
        bufs = [self.state[p]["momentum_buffer"] for p in params]
        if group["nesterov"]:
            return torch._foreach_add(grads, bufs, alpha=momentum)
        return bufs

    def _move(self, p: Tensor, direction: Tensor, group: dict[str, Any]) -> None:
        """p ← grid_move(p, …): direction, decay, ULP conversion and the walk in one loop per tensor (compiled
        unless ``kernel="eager"``)."""
        seed = draw_seed(p.device, self._generator(p.device))  # one draw per tensor and step
        hyper = hyper_tensor(group["lr"], group["weight_decay"], 1.0, 1.0, group["eps"], p.device)
        # p.detach(), not the Parameter: dynamo keeps Parameters static-shaped (a recompile per shape)
        _grid_move(p.detach(), direction, self.grid_of(p), seed, hyper, group["lr_unit"] == "real",
                   compiled=self.kernel == "compiled")

"""QuantAwareOptimizer: an Optimizer that knows each parameter's grid and steps grid-less parameters as AdamW.

ULP-aware rules need, per parameter, the format and current scale the forward pass uses for it (a "grid": the
parameter's weight TensorQuantizer).  Parameters without one (embeddings, LayerNorm, biases, unquantized layers)
cannot be stepped in ULPs; they go to "plain" groups that the same optimizer steps with AdamW at ``plain_lr``,
so one optimizer object (one Lightning optimizer, one LR schedule) drives the whole model.  The configs take every
plain hyper-parameter from the top-level ``baseline`` (conf/train.yaml), which the AdamW baseline uses too: the
plain groups of every arm step exactly as that baseline steps the same tensors.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from altgrad.optim.adam import adamw_step_, hyper_tensor, init_adam_state
from altgrad.optim.stiffness import Grid

class QuantAwareOptimizer(Optimizer, metaclass=abc.ABCMeta):
    """Base class: splits every param group into a rule group (has a grid) and a plain AdamW group.

    ``grids`` maps Parameter → grid (TensorQuantizer: ``.spec.format``, ``.scale_for(w)``).  It is structure, not
    state: rebuilt from the model at every construction and never saved in ``state_dict``.  ``grids=None`` means
    "no split": every parameter takes the rule, which only rules that need no grid (``needs_grid = False``) allow.
    Each group carries ``plain: bool``.  Plain groups take ``plain_lr``, ``plain_betas``, ``plain_eps`` and, when
    ``plain_weight_decay`` is given, AdamW's decay split: tensors of ≥ 2 dims decay at ``plain_weight_decay``,
    the others not at all (nanoGPT's groups); ``None`` keeps each group's own ``weight_decay``.  The plain
    hyper-parameters have no default here: they are the AdamW baseline's (conf/train.yaml ``baseline``, which the
    optimizer configs interpolate), required as soon as some parameter has no grid.
    """

    needs_grid: bool = True
    keeps_weights_on_grid: bool = False  # True: the rule writes grid values into the weight (GridOptim)

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        defaults: dict[str, Any],
        grids: Mapping[Tensor, Grid] | None,
        plain_lr: float | None = None,
        plain_betas: tuple[float, float] | None = None,
        plain_eps: float | None = None,
        plain_weight_decay: float | None = None,
    ) -> None:
        name = type(self).__name__
        if grids is None and self.needs_grid:
            raise ValueError(f"{name} needs `grids` (Parameter → TensorQuantizer) to know each weight's format and "
                             "scale; build it with altgrad.optim.build_optimizer or altgrad.quant.layers.weight_grids")
        check_hyper(name, lr=plain_lr, lr_means=" (an AdamW learning rate)", betas=plain_betas, eps=plain_eps,
                    weight_decay=plain_weight_decay, prefix="plain_")  # None: not given (see above)
        self.grids: dict[Tensor, Grid] | None = None if grids is None else dict(grids)
        groups: list[dict[str, Any]] = []
        for group in _as_groups(params):
            members = list(group["params"])
            rule = members if self.grids is None else [p for p in members if p in self.grids]
            plain = [p for p in members if self.grids is not None and p not in self.grids]
            if rule:
                groups.append({**group, "params": rule, "plain": False})
            if not plain:
                continue
            plain_hyper = {"plain": True, "lr": group.get("plain_lr", plain_lr), "betas": plain_betas,
                           "eps": plain_eps}
            missing = [f"plain_{k}" for k in ("lr", "betas", "eps") if plain_hyper[k] is None]
            if missing:
                raise ValueError(f"{name}: {len(plain)} parameter(s) have no grid and are stepped by plain AdamW, "
                                 f"which needs {', '.join(missing)}; valid: the AdamW baseline's values "
                                 "(conf/train.yaml `baseline`, as conf/optimizer/*.yaml pass them)")
            plain_hyper["betas"] = tuple(plain_betas)
            if plain_weight_decay is None:
                groups.append({**group, "params": plain, **plain_hyper})
            else:
                for part, decay in (([p for p in plain if p.dim() >= 2], plain_weight_decay),
                                        ([p for p in plain if p.dim() < 2], 0.0)):
                    if part:
                        groups.append({**group, "params": part, **plain_hyper, "weight_decay": decay})
        super().__init__(groups, defaults)

    # -- the step ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Re-evaluate the loss through ``closure`` (with grad enabled; Lightning relies on it), then update."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["plain"]:
                self._plain_step(group)
            else:
                self._rule_step(group)
        return loss

    @abc.abstractmethod
    def _rule_step(self, group: dict[str, Any]) -> None:
        """Update the parameters of one rule group (those with a grid, or all when ``grids`` is None)."""

    def _with_grads(self, group: dict[str, Any]) -> list[Tensor]:
        params = [p for p in group["params"] if p.grad is not None]
        for p in params:
            if p.grad.is_sparse:
                raise ValueError(f"{type(self).__name__} does not support sparse gradients")
        return params

    def _plain_step(self, group: dict[str, Any]) -> None:
        """AdamW with the group's (plain) hyper-parameters, bitwise equal to torch.optim.AdamW(foreach=True)."""
        params = self._with_grads(group)
        for p in params:
            if not self.state[p]:
                init_adam_state(self.state[p], p)
        beta1, beta2 = group["betas"]
        adamw_step_(params, [p.grad for p in params], *self._adam_lists(params),
                    lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"])

    def _adam_lists(self, params: list[Tensor]) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        states = [self.state[p] for p in params]
        return [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [s["step"] for s in states]

    def _advance_adam(self, p: Tensor, group: dict[str, Any]) -> Tensor:
        """Count one more Adam step for p (its state must exist) and return the per-step scalars of the fused
        steps: ``hyper_tensor(lr, weight_decay, 1 − β1^t, √(1 − β2^t), ε)`` on p's device."""
        state = self.state[p]
        state["step"] += 1
        t = state["step"].item()
        beta1, beta2 = group["betas"]
        return hyper_tensor(group["lr"], group["weight_decay"], 1 - beta1 ** t, (1 - beta2 ** t) ** 0.5,
                            group["eps"], p.device)

    def grid_of(self, p: Tensor) -> Grid:
        """The grid (weight quantizer) of a rule-group parameter."""
        if self.grids is None or p not in self.grids:
            raise ValueError(f"{type(self).__name__}: a parameter of shape {tuple(p.shape)} in a rule group has no "
                             "grid; pass it in `grids` or let it fall into the plain group")
        return self.grids[p]

    def plain_params(self) -> list[Tensor]:
        """Parameters stepped by the plain AdamW groups."""
        return [p for g in self.param_groups if g["plain"] for p in g["params"]]


def check_hyper(name: str, *, lr: float | None = None, lr_means: str = "", betas: tuple[float, float] | None = None,
                eps: float | None = None, weight_decay: float | None = None, prefix: str = "") -> None:
    """Refuse an invalid step hyper-parameter in one line naming it and what is valid; one wording for every rule,
    torch.optim.AdamW's ranges (ε = 0 allowed, as there: the exactness tests use it).  None skips a check."""
    if lr is not None and not lr > 0:
        raise ValueError(f"{name}: {prefix}lr={lr} is not valid; valid: > 0{lr_means}")
    if betas is not None and (len(tuple(betas)) != 2 or not all(0.0 <= b < 1.0 for b in betas)):
        raise ValueError(f"{name}: {prefix}betas={tuple(betas)} are not valid; valid: two values, each in [0, 1)")
    if eps is not None and not eps >= 0:
        raise ValueError(f"{name}: {prefix}eps={eps} is not valid; valid: >= 0")
    if weight_decay is not None and not weight_decay >= 0:
        raise ValueError(f"{name}: {prefix}weight_decay={weight_decay} is not valid; valid: >= 0")


def _as_groups(params: Iterable[Tensor] | Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    items = list(params)
    if not items:
        raise ValueError("optimizer got an empty parameter list")
    if all(isinstance(i, dict) for i in items):
        return [dict(i) for i in items]
    if any(isinstance(i, dict) for i in items):
        raise ValueError("params must be all tensors or all param-group dicts, not a mix")
    return [{"params": items}]

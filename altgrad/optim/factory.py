"""build_optimizer: the configured optimizer over nanoGPT's weight-decay groups, told each weight's grid.

Called by the LightningModule's ``configure_optimizers`` with ``cfg.optimizer`` (``_target_`` + ``_partial_`` +
``name`` + hyper-parameters).  The grids (Parameter → weight TensorQuantizer) are derived from the model's
QuantLinear layers unless given, so they always match what the forward pass uses.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import hydra.utils
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn
from torch.optim import Optimizer

from altgrad.optim.base import QuantAwareOptimizer
from altgrad.optim.stiffness import Grid

log = logging.getLogger(__name__)


def weight_decay_groups(model: nn.Module, weight_decay: float) -> tuple[list[dict[str, Any]], dict[Tensor, str]]:
    """nanoGPT's split: tensors with ≥ 2 dims (matmul weights, embeddings) decay, biases and norms do not.

    Returns the groups and each parameter's (first) qualified name; tied parameters appear once.
    """
    names = {p: n for n, p in model.named_parameters() if p.requires_grad}
    decay = [p for p in names if p.dim() >= 2]
    no_decay = [p for p in names if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": float(weight_decay)}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]], names


def model_grids(model: nn.Module) -> tuple[dict[Tensor, Grid], set[Tensor]]:
    """Grids of the model's quantized weights and the subset that is tied (quantized in the forward pass only)."""
    from altgrad.quant.layers import iter_quant_linears, weight_grids

    tied = {ql.weight for _, ql in iter_quant_linears(model) if ql.tied and ql.weight_q is not None}
    return weight_grids(model), tied


def build_optimizer(
    opt_cfg: DictConfig | Mapping[str, Any], model: nn.Module, grids: Mapping[Tensor, Grid] | None = None,
) -> tuple[Optimizer, dict[str, Any]]:
    """Instantiate ``opt_cfg`` over ``model``'s parameters; return the optimizer and a description for the log.

    ``grids=None`` derives them from the model's QuantLinear ``weight_q``.  Optimizers that write grid values into
    weights (GridOptim) leave tied weights (lm_head ↔ wte, quantized in the forward pass only) to the plain group.
    The info dict: ``name``, ``label``, ``target``, ``rule_params`` (updated by the optimizer's own rule),
    ``plain_params`` (plain AdamW group), ``plain_lr`` (None for torch optimizers, which have no plain group).
    """
    cfg = OmegaConf.to_container(opt_cfg, resolve=True) if isinstance(opt_cfg, DictConfig) else dict(opt_cfg)
    if "_target_" not in cfg:
        raise ValueError(f"optimizer config lacks `_target_`; got keys {sorted(cfg)}")
    name = cfg.pop("name", None) or str(cfg["_target_"]).rsplit(".", 1)[-1]
    label = cfg.pop("label", None) or name
    cfg["_partial_"] = True
    cfg["_convert_"] = "all"
    factory = hydra.utils.instantiate(cfg)
    groups, names = weight_decay_groups(model, cfg.get("weight_decay", 0.0))
    cls = factory.func
    if isinstance(cls, type) and issubclass(cls, QuantAwareOptimizer):
        tied: set[Tensor] = set()
        if grids is None:
            grids, tied = model_grids(model)
        if cls.keeps_weights_on_grid:
            grids = {p: g for p, g in grids.items() if p not in tied}
        optimizer = factory(groups, grids=grids)
        plain = set(optimizer.plain_params())
        plain_lr = next((g["lr"] for g in optimizer.param_groups if g["plain"]), cfg.get("plain_lr"))
    else:
        optimizer = factory(groups)
        plain, plain_lr = set(), None
    info = {
        "name": name,
        "label": label,
        "target": cfg["_target_"],
        "rule_params": [n for p, n in names.items() if p not in plain],
        "plain_params": [n for p, n in names.items() if p in plain],
        "plain_lr": plain_lr,
    }
    log.info("optimizer %s (%s): %d tensors by its rule, %d by plain AdamW (lr=%s): %s", label, cfg["_target_"],
             len(info["rule_params"]), len(info["plain_params"]), plain_lr, ", ".join(info["plain_params"]) or "-")
    return optimizer, info

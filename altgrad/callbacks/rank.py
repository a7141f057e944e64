"""Rank health of every Linear weight: stable rank and effective rank, absolute and relative to step 0.

The matrix measured is the weight the forward pass uses (its fake-quantized value for quantized layers).
Step-0 values are taken at train start and kept in the callback's checkpoint state, so a resumed run keeps its
reference.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from altgrad.callbacks.base import Instrument, backbone, linear_layers, metric_name, to_floats
from altgrad.diagnostics import effective_rank, stable_rank
from altgrad.quant.layers import QuantLinear


def forward_weight(module: torch.nn.Module) -> torch.Tensor:
    """The weight as the forward pass sees it: q(w·s)/s for a quantized weight (no quantizer state changes)."""
    w = module.weight.detach()
    if isinstance(module, QuantLinear) and module.weight_q is not None:
        from altgrad.quant import quantize

        q = module.weight_q
        s = q.scale_for(w).detach().float()
        return quantize(w.float() * s, q.spec.format, overflow=q.spec.overflow) / s
    return w


class RankCallback(Instrument):
    """Logs ``rank/<layer>/weight/{stable_rank,eff_rank,stable_rank_rel,eff_rank_rel}``."""

    group = "rank"
    run_state = ("_min",)

    def __init__(self, every_n_steps: int = 100) -> None:
        super().__init__(every_n_steps)
        self.reference: dict[str, tuple[float, float]] = {}
        self._min: dict[str, float] = {}

    def _measure(self, pl_module: L.LightningModule) -> dict[str, dict[str, torch.Tensor]]:
        out = {}
        for name, m in linear_layers(backbone(pl_module)):
            w = forward_weight(m)
            out[name] = {"stable_rank": stable_rank(w), "eff_rank": effective_rank(w)}
        return out

    @torch.no_grad()
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.reference:
            return  # restored from a checkpoint
        measured = self._measure(pl_module)
        flat = to_floats({f"{n}\0{k}": v for n, d in measured.items() for k, v in d.items()})
        self.reference = {n: (flat[f"{n}\0stable_rank"], flat[f"{n}\0eff_rank"]) for n in measured}

    @torch.no_grad()
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._due:
            return
        measured = self._measure(pl_module)
        flat = to_floats({metric_name(self.group, n, "weight", k): v for n, d in measured.items()
                          for k, v in d.items()})
        metrics = dict(flat)
        for name in measured:
            ref = self.reference.get(name)
            if ref is None:
                continue
            for key, r in zip(("stable_rank", "eff_rank"), ref):
                rel = flat[metric_name(self.group, name, "weight", key)] / r if r > 0 else float("nan")
                metrics[metric_name(self.group, name, "weight", f"{key}_rel")] = rel
                self._min[key] = min(self._min.get(key, float("inf")), rel)
        self.log_scalars(trainer, metrics)
        self.summarize(pl_module, min_stable_rank_rel=self._min.get("stable_rank"),
                       min_eff_rank_rel=self._min.get("eff_rank"))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "reference": {k: list(v) for k, v in self.reference.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.reference = {k: (float(v[0]), float(v[1])) for k, v in state_dict.get("reference", {}).items()}

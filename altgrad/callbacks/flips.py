"""Flips, stalls, oscillations and descent quality of every quantized weight, at every optimizer step.

Per step and tensor, vectorised and without host syncs: the weight's grid index before the step (uint8 for 8-bit
formats, on the scale in force before the step) is compared with the index after it, once FakeQuantCallback has
applied the storage policy (it runs first). The intended update is the optimizer's own change of the stored weight,
read by an optimizer step post-hook, before any snapping. Counts accumulate on the device and are logged as means
over each interval:
- ``flip_rate``: share of weights whose quantized value changed;
- ``stall_ratio``: 1 − flips / weights that received a nonzero update;
- ``oscillation_rate``: bias-corrected EMA of the share of weights whose flip reversed their previous flip
  (Nagel et al. 2022, "Overcoming Oscillations in Quantization-Aware Training");
- ``descent_cos``: cosine between the intended update and the applied change of the quantized weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

from altgrad.callbacks.base import Instrument, backbone, mean, metric_name, quantized_weights
from altgrad.diagnostics import (
    ema_debiased,
    ema_update,
    flip_step,
    grid_index,
    grid_midpoints,
    index_dtype,
    stall_ratio,
)
from altgrad.quant.layers import QuantLinear


@dataclass
class _Tracked:
    """Per-tensor state: grid, last flip direction, this step's before-state, interval accumulators."""

    name: str
    layer: QuantLinear
    grid: torch.Tensor
    midpoints: torch.Tensor
    dtype: torch.dtype
    last_direction: torch.Tensor
    acc: torch.Tensor            # [flips, updated, reversals, descent_cos sum, steps] over the interval
    osc_ema: torch.Tensor
    osc_steps: int = 0
    scale: torch.Tensor | None = None
    index_before: torch.Tensor | None = None
    weight_before: torch.Tensor | None = None
    intended: torch.Tensor | None = None


class FlipCallback(Instrument):
    """Logs ``flips/<layer>/weight/{flip_rate,stall_ratio,oscillation_rate,descent_cos}`` every interval."""

    group = "flips"

    def __init__(self, every_n_steps: int = 10, oscillation_momentum: float = 0.01) -> None:
        super().__init__(every_n_steps)
        if not 0.0 < oscillation_momentum <= 1.0:
            raise ValueError(f"oscillation_momentum={oscillation_momentum} is not valid; valid: 0 < m <= 1")
        self.momentum = float(oscillation_momentum)
        self.tracked: list[_Tracked] = []
        self._hooks: list[Any] = []
        self._pending = False
        self.latest: dict[str, dict[str, float]] = {}  # layer → last logged metrics (read by FallbackCallback)
        self._all_stall: list[float] = []
        self._all_flip: list[float] = []
        self._all_osc: list[float] = []
        self._all_cos: list[float] = []

    # -- set-up --------------------------------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.tracked = []
        for name, ql in quantized_weights(backbone(pl_module)):
            w = ql.weight
            grid = ql.weight_q.spec.format.values().to(w.device)
            self.tracked.append(_Tracked(
                name=name, layer=ql, grid=grid, midpoints=grid_midpoints(grid), dtype=index_dtype(grid.numel()),
                last_direction=torch.zeros(w.shape, dtype=torch.int8, device=w.device),
                acc=torch.zeros(5, dtype=torch.float32, device=w.device),
                osc_ema=torch.zeros((), dtype=torch.float32, device=w.device)))
        for opt in trainer.optimizers:
            self._hooks.append(opt.register_step_post_hook(self._after_optimizer_step))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def refresh(self, pl_module: L.LightningModule) -> None:
        """Re-read the layers' grids (after a format fallback swapped a quantizer's spec)."""
        by_name = dict(quantized_weights(backbone(pl_module)))
        for t in self.tracked:
            ql = by_name.get(t.name)
            if ql is None:
                continue
            grid = ql.weight_q.spec.format.values().to(t.grid.device)
            t.layer, t.grid, t.midpoints, t.dtype = ql, grid, grid_midpoints(grid), index_dtype(grid.numel())

    # -- per step ------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if trainer.sanity_checking:
            return
        for t in self.tracked:
            w = t.layer.weight.detach()
            t.scale = t.layer.weight_q.scale_for(w).detach().float()
            t.index_before = grid_index(w * t.scale, t.midpoints, t.dtype)
            t.weight_before = w.clone()
            t.intended = None
        self._pending = True

    @torch.no_grad()
    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._pending:
            return
        for t in self.tracked:
            if t.weight_before is not None:
                t.intended = t.layer.weight.detach() - t.weight_before

    @torch.no_grad()
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._pending:
            return
        self._pending = False
        for t in self.tracked:
            if t.index_before is None:
                continue
            w = t.layer.weight.detach()
            index_after = grid_index(w * t.scale, t.midpoints, t.dtype)
            intended = t.intended if t.intended is not None else w - t.weight_before
            applied = (t.grid[index_after.long()] - t.grid[t.index_before.long()]) / t.scale
            step, t.last_direction = flip_step(t.index_before, index_after, intended, applied, t.last_direction)
            t.acc += torch.stack([step.flips.float(), step.updated.float(), step.reversals.float(),
                                  step.descent_cos, torch.ones_like(step.descent_cos)])
            t.osc_ema = ema_update(t.osc_ema, step.reversals.float() / w.numel(), self.momentum)
            t.osc_steps += 1
            t.index_before = t.weight_before = t.intended = None
        if self._due:
            self._log(trainer, pl_module)

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.tracked:
            return
        # one host transfer: [flips, updated, reversals, descent_cos sum, steps, oscillation EMA] per tensor
        host = torch.stack([torch.cat([t.acc, t.osc_ema.reshape(1)]) for t in self.tracked]).cpu().tolist()
        metrics: dict[str, float] = {}
        flip_rates: list[float] = []
        for t, (flips, updated, _, cos_sum, steps, osc) in zip(self.tracked, host):
            t.acc.zero_()
            if steps == 0:
                continue
            m = {
                "flip_rate": flips / (t.layer.weight.numel() * steps),
                "stall_ratio": stall_ratio(flips, updated),
                "oscillation_rate": ema_debiased(osc, self.momentum, t.osc_steps),
                "descent_cos": cos_sum / steps,
            }
            metrics.update({metric_name(self.group, t.name, "weight", k): v for k, v in m.items()})
            self.latest[t.name] = m
            flip_rates.append(m["flip_rate"])
            self._all_stall.append(m["stall_ratio"])
            self._all_flip.append(m["flip_rate"])
            self._all_osc.append(m["oscillation_rate"])
            self._all_cos.append(m["descent_cos"])
        self.log_scalars(trainer, metrics)
        self.summarize(pl_module,
                       mean_stall_ratio=mean(self._all_stall),
                       final_flip_rate=mean(flip_rates),
                       mean_flip_rate=mean(self._all_flip),
                       mean_oscillation_rate=mean(self._all_osc),
                       mean_descent_cos=mean(self._all_cos))

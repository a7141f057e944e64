"""Flips, stalls, oscillations and descent quality of every quantized weight, at every optimizer step.

Per step and tensor, vectorised and without host syncs: the weight's quantized value before the step (on the scale
in force before the step) is compared with its quantized value after it, on the same grid, once FakeQuantCallback
has applied the storage policy (it runs first). The intended update is the optimizer's own change of the stored
weight, read by an optimizer step post-hook, before any snapping. The per-step work is one fused kernel per tensor
(under ALTGRAD_COMPILE, like the quantizers). Counts accumulate on the device and are logged as means over each
interval:
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
from altgrad.diagnostics import ema_debiased, ema_update, flip_counts, stall_ratio
from altgrad.quant import quantize_scaled
from altgrad.quant.fused import fused
from altgrad.quant.layers import QuantLinear

_flip_counts = fused(flip_counts)


@dataclass
class _Tracked:
    """Per-tensor state: last flip direction, this step's before-state, interval accumulators."""

    name: str
    layer: QuantLinear
    last_direction: torch.Tensor  # int8: −1/0/+1, direction of each weight's last flip
    acc: torch.Tensor             # [flips, updated, reversals, descent_cos sum, steps] over the interval
    osc_ema: torch.Tensor
    osc_steps: int = 0
    scale: torch.Tensor | None = None
    q_before: torch.Tensor | None = None
    delta: torch.Tensor | None = None  # the weight before the step; the intended update once the step ran
    stepped: bool = False


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
            self.tracked.append(_Tracked(
                name=name, layer=ql, last_direction=torch.zeros(w.shape, dtype=torch.int8, device=w.device),
                acc=torch.zeros(5, dtype=torch.float32, device=w.device),
                osc_ema=torch.zeros((), dtype=torch.float32, device=w.device)))
        for opt in trainer.optimizers:
            self._hooks.append(opt.register_step_post_hook(self._after_optimizer_step))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # -- per step ------------------------------------------------------------------------------------------------
    @staticmethod
    def _quantized(t: _Tracked, w: torch.Tensor) -> torch.Tensor:
        """q(w·s)/s on the grid of the scale recorded before the step (round to nearest)."""
        q = t.layer.weight_q
        return quantize_scaled(w, q.spec.format, t.scale, "nearest", q.spec.overflow)

    @torch.no_grad()
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if trainer.sanity_checking:
            return
        for t in self.tracked:
            w = t.layer.weight.detach()
            t.scale = t.layer.weight_q.scale_for(w).detach().float()
            t.q_before = self._quantized(t, w)
            t.delta = w.clone()
            t.stepped = False
        self._pending = True

    @torch.no_grad()
    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._pending:
            return
        for t in self.tracked:
            if t.delta is not None and not t.stepped:
                torch.sub(t.layer.weight.detach(), t.delta, out=t.delta)  # intended = w_after_step − w_before
                t.stepped = True

    @torch.no_grad()
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._pending:
            return
        self._pending = False
        for t in self.tracked:
            if t.q_before is None:
                continue
            w = t.layer.weight.detach()
            if not t.stepped:  # no optimizer post-hook ran (e.g. a custom loop): the stored change is the intent
                torch.sub(w, t.delta, out=t.delta)
            counts, t.last_direction = _flip_counts(t.q_before, self._quantized(t, w), t.delta, t.last_direction)
            t.acc += torch.cat([counts, counts.new_ones(1)])
            t.osc_ema = ema_update(t.osc_ema, counts[2] / w.numel(), self.momentum)
            t.osc_steps += 1
            t.q_before = t.delta = t.scale = None
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

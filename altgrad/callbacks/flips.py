"""Flips, stalls, oscillations and descent quality of every quantized weight, at every optimizer step.

Per step and tensor, vectorised and without host syncs: the weight before the step and after it (once
FakeQuantCallback has applied the storage policy; it runs first) are both quantized on the grid the step's forward
used (the scale the weight quantizer recorded; computed afresh for channel/block scaling) and compared; the intended
update is the optimizer's own change of the stored weight, read by an optimizer step post-hook before any snapping.
Each side is quantized by the quantizers' own fused kernel and the counting is one fused kernel per tensor
(under ALTGRAD_COMPILE, like the quantizers).
``max_weights_per_tensor`` tracks a fixed random sample of each tensor instead of all of it (an unbiased estimate
of the same rates at a fraction of the cost; None = every weight). Counts accumulate on the device and are logged
as means over each interval:
- ``flip_rate``: share of weights whose quantized value changed;
- ``stall_ratio``: 1 − flips / weights that received a nonzero update;
- ``oscillation_rate``: bias-corrected EMA of the share of weights whose flip reversed their previous flip
  (Nagel et al. 2022, "Overcoming Oscillations in Quantization-Aware Training");
- ``descent_cos``: cosine between the intended update and the applied change of the quantized weight.
Cross-step state is one int8 per tracked weight (the direction of its last flip).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

from altgrad.callbacks.base import Instrument, backbone, mean, metric_name, quantized_weights
from altgrad.diagnostics import ema_debiased, ema_update, flip_counts, stall_ratio
from altgrad.quant import STAT_NAMES, quantize_scaled
from altgrad.quant.fused import fused
from altgrad.quant.layers import QuantLinear

_SCALE = STAT_NAMES.index("scale")
_RECORDED_SCALE = ("tensor", "delayed")  # one scale per tensor, recorded in stats by this step's forward


_fused_counts = fused(flip_counts)


def _flip_kernel(before: torch.Tensor, after: torch.Tensor, scale: torch.Tensor, intended: torch.Tensor,
                 last_direction: torch.Tensor, fmt: Any, overflow: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Both sides on the same grid (the quantizer's own fused kernel), then the counts in one fused kernel."""
    q_before = quantize_scaled(before, fmt, scale, "nearest", overflow)
    q_after = quantize_scaled(after, fmt, scale, "nearest", overflow)
    return _fused_counts(q_before, q_after, intended, last_direction)


@dataclass
class _Tracked:
    """Per-tensor state: which weights, their last flip direction, this step's before-state, accumulators."""

    name: str
    layer: QuantLinear
    index: torch.Tensor | None    # flat indices of the tracked sample (None: every weight)
    last_direction: torch.Tensor  # int8: −1/0/+1, direction of each tracked weight's last flip
    acc: torch.Tensor             # [flips, updated, reversals, descent_cos sum, steps] over the interval
    osc_ema: torch.Tensor
    osc_steps: int = 0
    scale: torch.Tensor | None = None
    before: torch.Tensor | None = None
    intended: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.last_direction.numel()

    def select(self, t: torch.Tensor) -> torch.Tensor:
        """The tracked weights of a weight-shaped tensor (flat when sampled)."""
        return t if self.index is None else t.reshape(-1)[self.index]


class FlipCallback(Instrument):
    """Logs ``flips/<layer>/weight/{flip_rate,stall_ratio,oscillation_rate,descent_cos}`` every interval."""

    group = "flips"

    def __init__(self, every_n_steps: int = 10, oscillation_momentum: float = 0.01,
                 max_weights_per_tensor: int | None = None, seed: int = 0) -> None:
        super().__init__(every_n_steps)
        if not 0.0 < oscillation_momentum <= 1.0:
            raise ValueError(f"oscillation_momentum={oscillation_momentum} is not valid; valid: 0 < m <= 1")
        if max_weights_per_tensor is not None and int(max_weights_per_tensor) < 1:
            raise ValueError(f"max_weights_per_tensor={max_weights_per_tensor} is not valid; "
                             "valid: null (every weight) or an integer >= 1")
        self.momentum = float(oscillation_momentum)
        self.max_weights = None if max_weights_per_tensor is None else int(max_weights_per_tensor)
        self.seed = int(seed)
        self.tracked: list[_Tracked] = []
        self._hooks: list[Any] = []
        self._pending = False
        self.latest: dict[str, dict[str, float]] = {}  # layer → last logged metrics (read by FallbackCallback)
        self._all_stall: list[float] = []
        self._all_flip: list[float] = []
        self._all_osc: list[float] = []
        self._all_cos: list[float] = []

    # -- set-up --------------------------------------------------------------------------------------------------
    def _sample(self, name: str, w: torch.Tensor) -> torch.Tensor | None:
        """A fixed sorted sample of flat indices, from a private generator (the training RNG is not touched)."""
        if self.max_weights is None or w.numel() <= self.max_weights:
            return None
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + sum(map(ord, name)))
        return torch.randperm(w.numel(), generator=g)[: self.max_weights].sort().values.to(w.device)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.tracked = []
        for name, ql in quantized_weights(backbone(pl_module)):
            w = ql.weight
            index = self._sample(name, w)
            shape = w.shape if index is None else index.shape
            self.tracked.append(_Tracked(
                name=name, layer=ql, index=index,
                last_direction=torch.zeros(shape, dtype=torch.int8, device=w.device),
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
    def _forward_scale(t: _Tracked, w: torch.Tensor) -> torch.Tensor:
        """The scale of this step's forward: recorded in stats for one-scale kinds, recomputed otherwise."""
        q = t.layer.weight_q
        if q.spec.scaling.kind == "none":
            return torch.ones((), dtype=torch.float32, device=w.device)
        if q.spec.scaling.kind in _RECORDED_SCALE and q.track_stats:
            return q.stats[_SCALE].detach()
        s = q.scale_for(w).detach().float()
        if s.numel() == 1 or t.index is None:
            return s
        return torch.broadcast_to(s, w.shape).reshape(-1)[t.index]

    @torch.no_grad()
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if trainer.sanity_checking:
            return
        for t in self.tracked:
            w = t.layer.weight.detach()
            t.scale = self._forward_scale(t, w)
            t.before = w.clone() if t.index is None else t.select(w)
            t.intended = None
        self._pending = True

    @torch.no_grad()
    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._pending:
            return
        for t in self.tracked:
            if t.before is not None and t.intended is None:
                t.intended = t.select(t.layer.weight.detach()) - t.before

    @torch.no_grad()
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._pending:
            return
        self._pending = False
        for t in self.tracked:
            if t.before is None:
                continue
            after = t.select(t.layer.weight.detach())
            intended = t.intended if t.intended is not None else after - t.before  # no post-hook ran
            spec = t.layer.weight_q.spec
            counts, t.last_direction = _flip_kernel(t.before, after, t.scale, intended, t.last_direction,
                                                   spec.format, spec.overflow)
            t.acc += torch.cat([counts, counts.new_ones(1)])
            t.osc_ema = ema_update(t.osc_ema, counts[2] / t.size, self.momentum)
            t.osc_steps += 1
            t.before = t.intended = t.scale = None
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
                "flip_rate": flips / (t.size * steps),
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

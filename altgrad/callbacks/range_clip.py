"""Range-relative gradient clipping (optional): clip each layer's weight gradient to its grad format's range.

Instead of one global norm, each quantized layer's weight gradient is clamped elementwise to
max / 2^margin / s, with max that of the layer's grad format and s the scale its GradQuantizer used in this
step's backward (1 without scaling; for tensor and delayed scaling the scale the scaler kept, so no statistics are
needed; for channel and block scaling the mean scale of the statistics, which are then asked for every step):
the largest magnitude that format holds after scaling. Runs before the
optimizer step (and before Lightning's own norm clipping); clipped elements are counted on the device and logged
as ``clip/<layer>/grad/clipped`` every interval; the run total goes to ``run_summary["diagnostics"]["clip_events"]``.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from altgrad.callbacks.base import Instrument, backbone, metric_name, to_floats
from altgrad.diagnostics import clip_to_range_, range_limit
from altgrad.quant import STAT_NAMES
from altgrad.quant.fake_quant import kept_scale
from altgrad.quant.layers import QuantLinear

_SCALE = STAT_NAMES.index("scale")


class RangeClipCallback(Instrument):
    """Clamps weight gradients of quantized layers to their grad format's scaled range and counts the events."""

    group = "clip"
    run_state = ("total",)

    def __init__(self, enabled: bool = False, margin: int = 0, every_n_steps: int = 10) -> None:
        super().__init__(every_n_steps)
        self.enabled = bool(enabled)
        self.margin = int(margin)
        self._counts: dict[str, torch.Tensor] = {}
        self.total = 0.0
        self._stats_kinds: tuple[int, bool] | None = None  # (id of the backbone, some scale only in stats)

    def needs_quant_stats(self, trainer: L.Trainer) -> bool:
        """Every step when enabled and some grad quantizer's scale is not kept by its scaler (channel, block)."""
        if not self.enabled or trainer.sanity_checking:
            return False
        model = backbone(trainer.lightning_module)
        if self._stats_kinds is None or self._stats_kinds[0] != id(model):  # scaling kinds never change in a run
            self._stats_kinds = (id(model), any(
                m.grad_q is not None and kept_scale(m.grad_q) is None
                for m in model.modules() if isinstance(m, QuantLinear)))
        return self._stats_kinds[1]

    @staticmethod
    def grad_scale(q: torch.nn.Module) -> torch.Tensor:
        """The scale grad quantizer q used in this step's backward (the stats' mean scale for channel/block)."""
        s = kept_scale(q)
        return q.stats[_SCALE] if s is None else s

    @torch.no_grad()
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if not self.enabled or trainer.sanity_checking:
            return
        for name, m in backbone(pl_module).named_modules():
            if not isinstance(m, QuantLinear) or m.grad_q is None or m.weight.grad is None:
                continue
            limit = range_limit(m.grad_q.spec.format.max, self.grad_scale(m.grad_q), self.margin)
            n = clip_to_range_(m.weight.grad, limit.to(m.weight.grad.device))
            self._counts[name] = self._counts[name] + n if name in self._counts else n

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self.enabled or not self._due or not self._counts:
            return
        counts = to_floats({metric_name(self.group, n, "grad", "clipped"): c for n, c in self._counts.items()})
        self._counts = {}
        self.log_scalars(trainer, counts)
        self.total += sum(counts.values())
        self.summarize(pl_module, clip_events=self.total)

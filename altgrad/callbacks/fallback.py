"""Format fallback (optional, off by default): widen a layer's format when it keeps overflowing or stalling.

Every ``check_every_n_steps`` the stats of each quantized tensor role are read (one host transfer):
- *overflow*: NaN/Inf seen, or a saturated fraction above ``saturation_threshold``;
- *stall* (weights only): the FlipCallback's last stall ratio above ``stall_threshold``.
After ``patience`` consecutive bad checks the role switches to ``overflow_format`` (meant to have more exponent
bits) or ``stall_format`` (more mantissa bits); a target that is not wider in that sense is refused at the switch.
The quantizer object is changed in place (spec and scaler), so optimizers that hold it as the weight's grid follow.
Each event is logged (``fallback/<layer>/<role>/switched`` = 1) and appended to ``run_summary["fallbacks"]``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import lightning as L
import torch

from altgrad.callbacks.base import backbone, quantizer_roles, run_summary
from altgrad.callbacks.flips import FlipCallback
from altgrad.quant import STAT_NAMES, get_format, make_scaler
from altgrad.quant.format import FloatFormat

log = logging.getLogger(__name__)

_NONFINITE = STAT_NAMES.index("nonfinite")
_SATURATED = STAT_NAMES.index("frac_saturated")


def switch_format(quantizer: torch.nn.Module, fmt: FloatFormat) -> None:
    """Give ``quantizer`` (TensorQuantizer or GradQuantizer) format ``fmt`` in place: new spec, fresh scaler."""
    spec = dataclasses.replace(quantizer.spec, format=fmt)
    device = quantizer.stats.device
    quantizer.spec = spec
    quantizer.scaler = make_scaler(spec.scaling, fmt).to(device)


class FallbackCallback(L.Callback):
    """Switches persistently overflowing roles to ``overflow_format`` and stalling weights to ``stall_format``."""

    def __init__(self, enabled: bool = False, check_every_n_steps: int = 10, patience: int = 5,
                 overflow_format: str = "e5m2", stall_format: str = "e3m4", saturation_threshold: float = 0.01,
                 stall_threshold: float = 0.99) -> None:
        if int(check_every_n_steps) < 1:
            raise ValueError(f"fallback.check_every_n_steps={check_every_n_steps} is not valid; valid: integer >= 1")
        if int(patience) < 1:
            raise ValueError(f"fallback.patience={patience} is not valid; valid: integer >= 1")
        self.enabled = bool(enabled)
        self.check_every_n_steps = int(check_every_n_steps)
        self.patience = int(patience)
        self.overflow_format = get_format(overflow_format)
        self.stall_format = get_format(stall_format)
        self.saturation_threshold = float(saturation_threshold)
        self.stall_threshold = float(stall_threshold)
        self._counts: dict[tuple[str, str, str], int] = {}
        self._done: set[tuple[str, str, str]] = set()
        self.events: list[dict[str, Any]] = []

    def needs_quant_stats(self, trainer: L.Trainer) -> bool:
        """Statistics are read at the end of batches where ``global_step % check_every_n_steps == 0``: the batch that
        completes such a step; with gradient accumulation also the micro-batches of the step after one (their
        ``global_step`` at the end has not advanced)."""
        if not self.enabled or trainer.sanity_checking:
            return False
        step, n = trainer.global_step, self.check_every_n_steps
        return (step + 1) % n == 0 or (trainer.accumulate_grad_batches > 1 and step % n == 0)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self.enabled or trainer.sanity_checking or trainer.global_step % self.check_every_n_steps != 0:
            return
        model = backbone(pl_module)
        roles = quantizer_roles(model)
        if not roles:
            return
        stats = torch.stack([q.stats.detach().float() for _, _, q in roles]).cpu()
        flips = next((cb for cb in trainer.callbacks if isinstance(cb, FlipCallback)), None)
        for (layer, role, q), s in zip(roles, stats):
            overflow = bool(s[_NONFINITE] > 0) or float(s[_SATURATED]) > self.saturation_threshold
            stall_ratio = flips.latest.get(layer, {}).get("stall_ratio") if flips and role == "weight" else None
            stall = stall_ratio is not None and stall_ratio > self.stall_threshold
            for reason, bad in (("overflow", overflow), ("stall", stall)):
                key = (layer, role, reason)
                self._counts[key] = self._counts.get(key, 0) + 1 if bad else 0
                if self._counts[key] >= self.patience and key not in self._done:
                    self._done.add(key)
                    self._switch(trainer, pl_module, layer, role, q, reason)

    def _switch(self, trainer: L.Trainer, pl_module: L.LightningModule, layer: str, role: str,
                q: torch.nn.Module, reason: str) -> None:
        old = q.spec.format
        new = self.overflow_format if reason == "overflow" else self.stall_format
        wider = new.ebits > old.ebits if reason == "overflow" else new.mbits > old.mbits
        if not wider:
            log.warning("fallback for %s/%s (%s) refused: %s is not wider than %s", layer, role, reason,
                        new.name, old.name)
            return
        switch_format(q, new)
        event = {"step": trainer.global_step, "layer": layer, "role": role, "reason": reason,
                 "from": old.name, "to": new.name}
        self.events.append(event)
        run_summary(pl_module).setdefault("fallbacks", []).append(event)
        for logger in trainer.loggers:
            logger.log_metrics({f"fallback/{layer}/{role}/switched": 1.0}, step=trainer.global_step)
        log.warning("fallback at step %d: %s/%s %s → %s (%s)", trainer.global_step, layer, role, old.name,
                    new.name, reason)

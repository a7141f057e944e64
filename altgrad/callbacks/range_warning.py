"""A console warning, once per role and kind, when a format flushes most of a role to zero or saturates most of it.

The per-run maxima are in summary.json (`stability`); this says it while the run goes, naming the layer. It reads
the quantizers' `stats` only on steps where they were gathered anyway (their shared `stats_record` moved), so the
quantized step costs what it did; with `quant.stats=always` (no step marker) it looks every `every_n_steps` steps.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch

from altgrad.callbacks.base import backbone, quantizer_roles
from altgrad.quant import STAT_NAMES

log = logging.getLogger(__name__)
KINDS = {"frac_zero": "flushes to zero", "frac_saturated": "saturates"}


class RangeWarning(L.Callback):
    """Warns once per (role, kind) when more than `threshold` of a quantized role is flushed to zero or saturated."""

    def __init__(self, threshold: float = 0.5, every_n_steps: int = 50) -> None:
        self.threshold = float(threshold)
        self.every_n_steps = int(every_n_steps)
        self.warned: set[tuple[str, str]] = set()
        self._seen_step: Any = object()
        self._index = {k: STAT_NAMES.index(k) for k in KINDS}
        self._record: Any = None  # the quantizers' shared StatsRecord, once seen (one per run)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # the shared record says whether this step gathered statistics without walking the model's modules
        if self._record is not None and (self._record.step is None or self._record.step == self._seen_step):
            return
        roles = quantizer_roles(backbone(pl_module))
        if not roles or len(self.warned) == 2 * len({role for _, role, _ in roles}):
            return
        record = self._record = getattr(roles[0][2], "stats_record", None)
        if record is None:  # quant.stats=always: every call writes them
            if trainer.global_step % self.every_n_steps != 0:
                return
        elif record.step is None or record.step == self._seen_step:
            return  # no fresh statistics in this step: nothing to read
        else:
            self._seen_step = record.step
        stats = torch.stack([q.stats.detach().float() for _, _, q in roles]).cpu()  # one sync, on a stats step
        for kind, verb in KINDS.items():
            column = stats[:, self._index[kind]]
            by_role: dict[str, list[tuple[float, str, Any]]] = {}
            for (layer, role, q), value in zip(roles, column.tolist()):
                if value > self.threshold and (role, kind) not in self.warned:
                    by_role.setdefault(role, []).append((value, layer, q))
            for role, hits in by_role.items():
                self.warned.add((role, kind))
                value, layer, q = max(hits, key=lambda h: h[0])
                spec = getattr(q, "spec", None)
                fmt = getattr(getattr(spec, "format", None), "name", None) or "its format"
                scaling = getattr(getattr(spec, "scaling", None), "kind", "?")
                more = f" (and {len(hits) - 1} more layers)" if len(hits) > 1 else ""
                log.warning("%s %s %.0f%% of %s's %s%s at step %d (scaling: %s); warned once per role",
                            fmt, verb, 100 * value, layer, role, more, trainer.global_step, scaling)

"""Numerical stability per quantized tensor role: saturation, flush-to-zero, subnormals, NaN/Inf, amax, scale.

Reads the ``stats`` buffer every TensorQuantizer/GradQuantizer refreshes on each call with ``track_stats`` on (no
hooks, no syncs in the step; ``needs_quant_stats`` asks for them on the due steps only); adds dynamic-range use of
each quantized weight: the octaves its magnitudes span over the format's octaves.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from altgrad.callbacks.base import (Instrument, backbone, metric_name, quantized_weights, quantizer_roles,
                                    rows_to_floats)
from altgrad.diagnostics.range_use import range_uses
from altgrad.quant import STAT_NAMES, changes


class StabilityCallback(Instrument):
    """Logs ``stability/<layer>/<role>/<stat>`` for every stat in STAT_NAMES, and ``.../weight/range_use``."""

    group = "stability"
    run_state = ("_max",)

    def __init__(self, every_n_steps: int = 10, range_use: bool = True) -> None:
        super().__init__(every_n_steps)
        self.range_use = range_use
        self._max: dict[str, float] = {}
        self._layout_key: tuple | None = None
        self._layout_cache: tuple[list[str], list[str], list[torch.Tensor], list[Any]] = ([], [], [], [])

    def needs_quant_stats(self, trainer: L.Trainer) -> bool:
        """Statistics are read on the due steps (what ``_due`` will be for the batch that starts now)."""
        return not trainer.sanity_checking and self.due_at(trainer.global_step + 1)

    def _layout(self, model: torch.nn.Module) -> tuple[list[str], list[str], list[torch.Tensor], list[Any]]:
        """(metric names, each one's stat, the quantizers' stats rows, the quantized weights' layers), kept while the
        model's structure stays (``changes.STRUCTURE``): the rows are views of the stats buffers, which every call
        writes in place."""
        key = (id(model), changes.STRUCTURE[0], self.range_use)
        if self._layout_key != key:
            names: list[str] = []
            rows: list[torch.Tensor] = []
            for layer, role, q in quantizer_roles(model):
                names.extend(metric_name(self.group, layer, role, stat) for stat in STAT_NAMES)
                rows.append(q.stats.detach().view(-1))  # a view: every call writes the buffer in place
            weights = []
            if self.range_use:
                for layer, ql in quantized_weights(model):
                    names.append(metric_name(self.group, layer, "weight", "range_use"))
                    weights.append(ql)
            stats = [name.rsplit("/", 1)[1] for name in names]
            self._layout_cache, self._layout_key = (names, stats, rows, weights), key
        return self._layout_cache

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._due:
            return
        names, stats, rows, weights = self._layout(backbone(pl_module))
        # every value of every role in one host transfer: a row per quantizer (its stats buffer, STAT_NAMES order)
        # and one for the weights' range use (a few hundred device tensors a step on a GPU model otherwise)
        if self.range_use and weights:
            rows = [*rows, range_uses([ql.weight for ql in weights], [ql.weight_q.spec.format for ql in weights],
                                      [ql.weight_q.call_kernel for ql in weights])]
        if not names:
            return
        values = rows_to_floats(rows)
        metrics = dict(zip(names, values, strict=True))
        self.log_scalars(trainer, metrics)
        top = self._max
        for stat, v in zip(stats, values):
            top[stat] = max(top.get(stat, float("-inf")), v)
        self.summarize(pl_module,
                       max_frac_saturated=self._max.get("frac_saturated"),
                       max_frac_zero=self._max.get("frac_zero"),
                       max_frac_subnormal=self._max.get("frac_subnormal"),
                       max_nonfinite=self._max.get("nonfinite"),
                       max_range_use=self._max.get("range_use"))

"""FakeQuantCallback: model surgery (nn.Linear → QuantLinear per the LayerMap), the weight-storage policy, and when
the quantizers compute their statistics.

Surgery happens in ``setup``, which Lightning calls before checkpoint weights are restored, before
``configure_optimizers`` and before any ``torch.compile`` of the backbone, so all of them see the quantized model.

Statistics on demand (``stats="demand"``, the default; ``quant.stats`` in the run config): the per-call statistics
of every TensorQuantizer/GradQuantizer (saturated, flushed, subnormal fractions, NaN/Inf count, amax, scale) are
further passes over every quantized tensor, and most steps nobody reads them. At every ``on_train_batch_start``
(before the forward) this callback asks every callback of the trainer that has a ``needs_quant_stats(trainer) ->
bool`` method whether it reads them in the step that starts now, and turns ``track_stats`` of every quantizer of the
backbone on iff one does (the flags are only written when that answer changes). Validation and the sanity check run
with them off (no consumer reads validation statistics; the buffers keep the last training step's). After training
they are on again, the quantizers' default. ``stats_step`` of every quantizer (a shared StatsRecord) names the
training step the buffers are from. A torch.compiled backbone gets one graph per setting (two; dynamo guards on the
flag). ``stats="always"`` never touches the flags (every call records, as without this callback). This callback
comes first (train() puts it there), so the other callbacks' ``on_train_batch_start`` already sees the step's flags.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn

from altgrad.atomic import write_json
from altgrad.callbacks.base import quant_linears
from altgrad.config import QuantSchema
from altgrad.errors import ConfigError
from altgrad.quant.fake_quant import GradQuantizer, StatsRecord, TensorQuantizer, set_track_stats
from altgrad.quant.layer_map import LayerMap, ResolvedLayer
from altgrad.quant.layers import iter_quant_linears, quantize_linears

log = logging.getLogger(__name__)

def needs_quant_stats(trainer: L.Trainer) -> bool:
    """Whether any callback of ``trainer`` reads quantizer statistics in the training step that starts now.

    The protocol: a callback that reads ``stats`` (or ``stat_dict()``) of the quantizers during a training step
    defines ``needs_quant_stats(trainer) -> bool``, answered at ``on_train_batch_start`` before its own hooks of that
    batch ran (``trainer.global_step`` = optimizer steps done so far; the batch completes step global_step + 1).
    """
    for cb in trainer.callbacks:
        fn = getattr(cb, "needs_quant_stats", None)
        if callable(fn) and fn(trainer):
            return True
    return False


def precision_table(resolved: Mapping[str, ResolvedLayer], roads: Mapping[str, str] | None = None) -> str:
    """A fixed-width table of module → weight/input/grad formats, scaling and (given ``roads``, module → road) the
    kernel its quantizer calls take, for the run log."""

    def cell(spec: Any) -> str:
        if spec is None:
            return "fp32"
        name = spec.format.name or f"e{spec.format.ebits}m{spec.format.mbits}b{spec.format.bias}"
        return name if spec.rounding == "nearest" else f"{name}/{spec.rounding[:5]}"

    rows = [("module", "weight", "input", "grad", "scaling") + (("kernel",) if roads is not None else ())]
    for name, r in resolved.items():
        any_spec = r.weight or r.input or r.grad
        scaling = "-" if any_spec is None else any_spec.scaling.kind + ("/pow2" if any_spec.scaling.pow2 else "")
        row = (name + (" (tied)" if r.tied else ""), cell(r.weight), cell(r.input), cell(r.grad), scaling)
        rows.append(row + ((roads.get(name, "-"),) if roads is not None else ()))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


class FakeQuantCallback(L.Callback):
    """Applies the layer map to ``pl_module.model`` and keeps weights on their grid when ``master='none'``."""

    def __init__(
        self,
        format_cfg: Mapping[str, Any],
        layer_map_cfg: Mapping[str, Any],
        master: str = "fp32",
        storage_rounding: str = "nearest",
        seed: int = 0,
        run_dir: str | os.PathLike | None = None,
        stats: str = "demand",
        kernel: str = "auto",
    ) -> None:
        QuantSchema(master, storage_rounding, stats, kernel)  # ConfigError (a ValueError) naming a bad choice
        self.layer_map = LayerMap.from_config(layer_map_cfg, format_cfg)
        self.master = master
        self.storage_rounding = storage_rounding
        self.seed = int(seed)
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.resolved: dict[str, ResolvedLayer] = {}
        self.stats = stats
        self.kernel = kernel  # quant.kernel: resolved per quantizer for the trainer's device in setup
        self.record = StatsRecord()
        self._quantizers: list[nn.Module] | None = None
        self._stats_on: bool | None = None  # the flags as this callback last set them (None: not yet)
        self._before_validation: bool | None = None

    # -- surgery -------------------------------------------------------------------------------------------------
    def apply(self, model: nn.Module) -> dict[str, ResolvedLayer]:
        """Resolve and apply the layer map to a plain-PyTorch model (usable without a Trainer)."""
        if any(True for _ in iter_quant_linears(model)):
            return self.resolved  # already applied (e.g. setup called for another stage)
        self.resolved = self.layer_map.resolve(model)
        quantize_linears(model, self.resolved, kernel=self.kernel)
        return self.resolved

    def resolve_kernel(self, model: nn.Module, device: torch.device | str | None) -> dict[str, str]:
        """``quant.kernel`` resolved once for every quantizer of ``model`` on ``device``: layer → its road(s)."""
        roads = {}
        for name, ql in iter_quant_linears(model):
            found = {role: q.use_kernel(self.kernel, device) for role, q in ql.quantizers()}
            roads[name] = "/".join(dict.fromkeys(found.values()))
        return roads

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        first = not any(True for _ in iter_quant_linears(pl_module.model))
        resolved = self.apply(pl_module.model)
        if not first:
            return
        try:
            roads = self.resolve_kernel(pl_module.model, trainer.strategy.root_device)
        except ValueError as err:  # quant.kernel=native where it cannot serve: one line, before any step
            raise ConfigError(str(err)) from None
        table = precision_table(resolved, roads)
        if trainer.is_global_zero:
            log.info("resolved layer precision (master=%s, storage_rounding=%s, quant.kernel=%s):\n%s",
                     self.master, self.storage_rounding, self.kernel, table)
            if not (log.isEnabledFor(logging.INFO) and logging.getLogger().handlers):
                # no logging set up (a Trainer outside Hydra's entry point): the table must still be seen once
                print(f"Layer precision (master={self.master}, storage={self.storage_rounding}, "
                      f"quant.kernel={self.kernel}):\n{table}", flush=True)
            self._save_json(trainer, resolved)

    def _save_json(self, trainer: L.Trainer, resolved: Mapping[str, ResolvedLayer]) -> None:
        run_dir = self.run_dir or Path(trainer.default_root_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        payload = {name: r.to_dict() for name, r in resolved.items()}
        write_json(run_dir / "layer_map.json", payload, indent=2)

    # -- weight storage policy -----------------------------------------------------------------------------------
    @torch.no_grad()
    def project_weights(self, model: nn.Module, step: int, rounding: str | None = None) -> None:
        """Put every quantized, untied weight exactly on its grid (master='none').

        Stochastic storage rounding draws from a seed derived from (run seed, step, layer index), so a resumed
        run repeats the same draws.
        """
        rounding = rounding or self.storage_rounding
        for index, (_, ql) in enumerate(quant_linears(model)):
            if ql.weight_q is None or ql.tied:
                continue  # tied weights (lm_head ↔ wte) are quantized in the forward pass only
            seed = (self.seed * 1_000_003 + step * 7919 + index) & 0x7FFFFFFF
            ql.weight_q.project_(ql.weight, rounding, seed=seed)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.master == "none":
            self.project_weights(pl_module.model, trainer.global_step)

    # -- statistics on demand ------------------------------------------------------------------------------------
    def _collect(self, pl_module: L.LightningModule) -> list[nn.Module]:
        if self._quantizers is None:
            self._quantizers = [m for m in pl_module.model.modules() if isinstance(m, (TensorQuantizer, GradQuantizer))]
            self._stats_on = None  # written (with the shared record) at the next set_stats
        return self._quantizers

    def set_stats(self, pl_module: L.LightningModule, on: bool) -> None:
        """Every quantizer's ``track_stats`` = on (written only when it differs from what this callback last set)."""
        quantizers = self._collect(pl_module)
        if self._stats_on is None:
            set_track_stats(quantizers, on, self.record)
        elif on != self._stats_on:
            set_track_stats(quantizers, on)
        self._stats_on = self.record.on = on

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._quantizers = None  # the backbone's quantizers, collected again for this fit
        if self.master == "none":
            # initial weights onto the grid; idempotent for weights already there (resume)
            self.project_weights(pl_module.model, trainer.global_step, rounding="nearest")

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.stats != "demand" or not self._collect(pl_module):
            return
        on = needs_quant_stats(trainer)
        self.set_stats(pl_module, on)
        if on:
            self.record.step = trainer.global_step

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.stats != "demand":
            return
        self._before_validation = self._stats_on
        self.set_stats(pl_module, False)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.stats != "demand":
            return
        before, self._before_validation = self._before_validation, None
        self.set_stats(pl_module, True if before is None else before)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.stats == "demand" and self._quantizers is not None:
            self.set_stats(pl_module, True)  # the quantizers' default again, for whatever uses the model next

"""Shared plumbing of the diagnostics callbacks: intervals, metric names, logging, and where the layers are.

Scalars go to every logger (CSV and W&B) as ``group/layer/role/metric``; histograms and tables go to W&B only and
are skipped silently when no WandbLogger is attached. Values are gathered as device tensors and moved to the host
in one transfer per logging interval, so instruments add no host syncs between intervals.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import lightning as L
import torch
from torch import nn

from altgrad.callbacks.wandb_values import no_pandas_probe
from altgrad.quant import changes
from altgrad.quant.layers import QuantLinear, iter_quant_linears


def metric_name(group: str, layer: str, role: str, metric: str) -> str:
    """The stable metric name ``group/layer/role/metric`` (layer relative to the GPT, e.g. transformer.h.0.mlp.c_fc)."""
    return f"{group}/{layer}/{role}/{metric}"


def backbone(pl_module: L.LightningModule) -> nn.Module:
    """The GPT the module trains (``pl_module.model``), unwrapped from torch.compile so probes run eagerly."""
    model = getattr(pl_module, "model", None)
    if not isinstance(model, nn.Module):
        raise ValueError(f"{type(pl_module).__name__} has no `model` backbone; diagnostics need pl_module.model")
    return getattr(model, "_orig_mod", model)


_WALKS: dict[tuple[str, int], tuple[weakref.ref, int, list]] = {}


def _walked(kind: str, model: nn.Module, walk: Callable[[nn.Module], list]) -> list:
    """``walk(model)``, kept until a quantizer or the layer surgery changes (``changes.STRUCTURE``: not the statistics
    switched on for a logging step, which moves ``changes.COUNT``) or the model is another object: walking the module
    tree costs ≈ 0.5 ms, and several instruments do it on every logging step. A copy, so a caller may change its
    list."""
    key = (kind, id(model))
    hit = _WALKS.get(key)
    if hit is None or hit[0]() is not model or hit[1] != changes.STRUCTURE[0]:
        def forget(ref: weakref.ref, key: tuple[str, int] = key) -> None:  # the model is gone: so is its entry
            if _WALKS.get(key, (None,))[0] is ref:
                del _WALKS[key]
        hit = (weakref.ref(model, forget), changes.STRUCTURE[0], walk(model))
        _WALKS[key] = hit
    return list(hit[2])


def linear_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every Linear of the model, quantized (QuantLinear) or not, with its qualified name, in module order."""
    return _walked("linear", model, lambda model: [(n, m) for n, m in model.named_modules()
                                                   if isinstance(m, (QuantLinear, nn.Linear))])


def quant_linears(model: nn.Module) -> list[tuple[str, QuantLinear]]:
    """Every QuantLinear of the model with its qualified name, in module order (layers.iter_quant_linears, kept)."""
    return _walked("quant_linears", model, lambda model: list(iter_quant_linears(model)))


def quantized_weights(model: nn.Module) -> list[tuple[str, QuantLinear]]:
    """QuantLinears whose weight is quantized (they have a grid for flips, bits and stiffness)."""
    return _walked("weights", model, lambda model: [(n, m) for n, m in model.named_modules()
                                                    if isinstance(m, QuantLinear) and m.weight_q is not None])


def quantizer_roles(model: nn.Module) -> list[tuple[str, str, nn.Module]]:
    """(layer, role, quantizer) for every quantized tensor role, in module order."""
    return _walked("roles", model, lambda model: [(n, role, q) for n, m in model.named_modules()
                                                  if isinstance(m, QuantLinear) for role, q in m.quantizers()])


def run_summary(pl_module: L.LightningModule) -> dict[str, Any]:
    """``pl_module.run_summary`` (created if the module has none), with its ``diagnostics`` dict present."""
    summary = getattr(pl_module, "run_summary", None)
    if summary is None:
        summary = {}
        pl_module.run_summary = summary
    summary.setdefault("diagnostics", {})
    return summary


def to_floats(values: Mapping[str, torch.Tensor | float]) -> dict[str, float]:
    """Device scalars (and Python numbers) → Python floats in one host transfer."""
    tensors = [v for v in values.values() if isinstance(v, torch.Tensor)]
    if not tensors:
        return {k: float(v) for k, v in values.items()}
    device = tensors[0].device
    rows = [v.detach().reshape(1) if isinstance(v, torch.Tensor) else torch.tensor([float(v)], device=device)
            for v in values.values()]
    return dict(zip(values, rows_to_floats(rows), strict=True))


def rows_to_floats(rows: Sequence[torch.Tensor]) -> list[float]:
    """The elements of 1-D device tensors, in order, as Python floats (float32 values) in one host transfer."""
    device = rows[0].device
    return torch.cat([r.to(device, torch.float32) for r in rows]).cpu().tolist()


def finite(values: Iterable[float | None]) -> list[float]:
    """The finite values (drops None, NaN and ±inf)."""
    return [v for v in values if v is not None and math.isfinite(v)]


def mean(values: Iterable[float | None]) -> float | None:
    """Mean of the finite values; None when there are none."""
    kept = finite(values)
    return sum(kept) / len(kept) if kept else None


def _plain(value: Any) -> Any:
    """A copy of an accumulator that a checkpoint holds and torch.load(weights_only=True) reads (tensors on the CPU)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class Instrument(L.Callback):
    """A diagnostics callback with its own interval: due on the batches that complete step n·every_n_steps.

    Its run-level accumulators (``run_state``) travel in the checkpoint, so a resumed run's summary aggregates cover
    the whole run, not only the steps after the resume."""

    group: ClassVar[str] = "diag"
    run_state: ClassVar[tuple[str, ...]] = ()  # attributes that accumulate over the run (lists, numbers, dicts)

    def __init__(self, every_n_steps: int = 50) -> None:
        if int(every_n_steps) < 1:
            raise ValueError(f"{type(self).__name__}.every_n_steps={every_n_steps} is not valid; valid: integer >= 1")
        self.every_n_steps = int(every_n_steps)
        self._due = False

    # -- resume --------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"run_state": {name: _plain(getattr(self, name)) for name in self.run_state}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for name, value in state_dict.get("run_state", {}).items():
            if name in self.run_state:
                setattr(self, name, value)

    # -- interval ------------------------------------------------------------------------------------------------
    def due_at(self, step: int) -> bool:
        """True when optimizer step number ``step`` (1-based: the step this batch completes) is measured."""
        return step % self.every_n_steps == 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._due = not trainer.sanity_checking and self.due_at(trainer.global_step + 1)

    # -- logging -------------------------------------------------------------------------------------------------
    @staticmethod
    def log_scalars(trainer: L.Trainer, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Log scalars to every attached logger at ``step`` (default: the trainer's global step)."""
        if not metrics:
            return
        step = trainer.global_step if step is None else step
        for logger in trainer.loggers:
            logger.log_metrics(dict(metrics), step=step)

    @staticmethod
    def wandb_logger(trainer: L.Trainer) -> Any | None:
        """The attached WandbLogger, or None (histograms and tables are then skipped)."""
        try:
            from lightning.pytorch.loggers import WandbLogger
        except ImportError:  # pragma: no cover - wandb is a project dependency
            return None
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                return logger
        return None

    def log_histograms(self, trainer: L.Trainer, histograms: Mapping[str, tuple[Sequence[float], Sequence[float]]],
                       step: int | None = None) -> None:
        """W&B histograms from (counts, bin_edges) pairs, one ``log`` call; skipped without a WandbLogger."""
        logger = self.wandb_logger(trainer)
        if logger is None or not histograms or not trainer.is_global_zero:
            return
        import wandb

        payload: dict[str, Any] = {name: wandb.Histogram(np_histogram=(list(c), list(e)))
                                   for name, (c, e) in histograms.items()}
        with no_pandas_probe():
            logger.log_metrics(payload, step=trainer.global_step if step is None else step)

    def log_table(self, trainer: L.Trainer, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        """A W&B table; skipped without a WandbLogger."""
        logger = self.wandb_logger(trainer)
        if logger is None or not rows or not trainer.is_global_zero:
            return
        with no_pandas_probe():
            logger.log_table(key=key, columns=columns, data=rows, step=trainer.global_step)

    @staticmethod
    def summarize(pl_module: L.LightningModule, **aggregates: float | None) -> None:
        """Write per-run aggregates into ``pl_module.run_summary['diagnostics']`` (NaN/inf → None)."""
        diag = run_summary(pl_module)["diagnostics"]
        for key, value in aggregates.items():
            diag[key] = None if value is None or not math.isfinite(value) else float(value)

"""Activations on a probe of the current batch: kurtosis, dynamic-range use and dead MLP units.

Every interval, the eager backbone runs the first ``max_sequences`` sequences of the batch (eval mode, no grad,
training precision; quantizer state and RNG restored afterwards) with temporary forward hooks:
- ``act/transformer.h.<i>/output/kurtosis``: each block's residual-stream output;
- ``act/<layer>/input/kurtosis`` for every Linear's input, and ``act/<layer>/input/range_use`` for quantized ones
  (octaves of |x| over the input format's octaves);
- ``act/<block>.mlp.c_fc/output/dead_frac``: MLP units whose pre-activation is ≤ 0 for every probe token.
A kurtosis above ``warn_kurtosis`` (10 by default) is warned about once per tensor: outliers that large squeeze
the rest of an 8-bit tensor onto a few codes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from torch.utils.hooks import RemovableHandle

from altgrad.callbacks.base import backbone, linear_layers, metric_name
from altgrad.callbacks.probe import ProbeInstrument
from altgrad.diagnostics import KURTOSIS_WARNING, kurtosis, range_use
from altgrad.quant.layers import QuantLinear


class ActivationCallback(ProbeInstrument):
    """Kurtosis of block outputs and Linear inputs, input range use, and dead MLP units, on a probe batch."""

    group = "act"
    run_state = ("_max_kurtosis", "_max_dead")

    def __init__(self, every_n_steps: int = 50, max_sequences: int = 4,
                 warn_kurtosis: float = KURTOSIS_WARNING) -> None:
        super().__init__(every_n_steps, max_sequences)
        self.warn_kurtosis = float(warn_kurtosis)
        self._warned: set[str] = set()
        self._max_kurtosis = float("-inf")
        self._max_dead = float("-inf")

    def measure(self, trainer: L.Trainer | None, pl_module: L.LightningModule, batch: Any) -> dict[str, float]:
        """Run the probe and return the metrics (also usable outside training, e.g. in tests)."""
        model = backbone(pl_module)

        def hooks(values: dict[str, torch.Tensor]) -> Iterator[RemovableHandle]:
            def block_hook(name: str):
                def hook(_m, _inp, out):
                    values[metric_name(self.group, name, "output", "kurtosis")] = kurtosis(out)
                return hook

            def input_hook(name: str, module: torch.nn.Module):
                def hook(_m, args):
                    x = args[0]
                    values[metric_name(self.group, name, "input", "kurtosis")] = kurtosis(x)
                    if isinstance(module, QuantLinear) and module.input_q is not None:
                        values[metric_name(self.group, name, "input", "range_use")] = range_use(
                            x, module.input_q.spec.format, module.input_q.call_kernel)
                return hook

            def fc_hook(name: str):
                def hook(_m, _inp, out):
                    active = (out.detach().reshape(-1, out.shape[-1]) > 0).any(dim=0)
                    values[metric_name(self.group, name, "output", "dead_frac")] = 1.0 - active.float().mean()
                return hook

            blocks = getattr(getattr(model, "transformer", None), "h", None)
            for i, block in enumerate(blocks if blocks is not None else ()):
                yield block.register_forward_hook(block_hook(f"transformer.h.{i}"))
            for name, m in linear_layers(model):
                yield m.register_forward_pre_hook(input_hook(name, m))
                if name.endswith("mlp.c_fc"):
                    yield m.register_forward_hook(fc_hook(name))

        return self.probe_with_hooks(trainer, model, batch, hooks)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._due:
            return
        metrics = self.measure(trainer, pl_module, batch)
        self.log_scalars(trainer, metrics)
        for name, v in metrics.items():
            if name.endswith("/kurtosis"):
                self._max_kurtosis = max(self._max_kurtosis, v)
                if v > self.warn_kurtosis and name not in self._warned:
                    self._warned.add(name)
                    rank_zero_warn(f"{name} = {v:.1f} at step {trainer.global_step} (> {self.warn_kurtosis:g}): "
                                   "heavy-tailed activations; 8-bit formats lose resolution on the bulk")
            elif name.endswith("/dead_frac"):
                self._max_dead = max(self._max_dead, v)
        self.summarize(pl_module, max_kurtosis=self._max_kurtosis, max_dead_frac=self._max_dead)

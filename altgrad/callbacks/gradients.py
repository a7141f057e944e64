"""Gradients per Linear layer: norm, zero-update fraction, and gradient fidelity against a shadow pass.

- ``grads/<layer>/weight/norm``: ‖∂L/∂W‖ of the step's (quantized-backward) gradient, before clipping;
- ``grads/<layer>/weight/zero_update_frac``: share of weights the step (and the storage policy) left unchanged;
- ``gradfid/<layer>/grad/{cosine,snr_db}`` every ``fidelity_every_n_steps``: the same batch is run again with every
  TensorQuantizer/GradQuantizer switched off (eager backbone, same precision context, same RNG state as the
  training step, so dropout masks match when nothing else draws random numbers; a compiled model runs eagerly
  and is not recompiled), and each layer's weight gradient
  from the training step is compared with the unquantized one. The shadow gradients come from
  ``torch.autograd.grad``, so ``.grad``, the optimizer, the data stream, the RNG streams and quantizer state are
  left exactly as they were.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from altgrad.callbacks.base import Instrument, backbone, finite, linear_layers, mean, metric_name, to_floats
from altgrad.callbacks.probe import (
    capture_rng,
    eager,
    forward_context,
    preserved_quantizer_state,
    preserved_rng,
    quantization_disabled,
    restore_rng,
    split_batch,
)
from altgrad.diagnostics import cosine, snr_db


def lm_loss(pl_module: L.LightningModule, model: nn.Module, batch: Any) -> torch.Tensor:
    """The training loss of ``batch``: the module's own ``loss(batch)`` (AltGradModule has one), else next-token
    cross-entropy of ``model``'s logits."""
    loss_fn = getattr(pl_module, "loss", None)
    if callable(loss_fn):
        return loss_fn(batch)
    x, y = split_batch(batch)
    if y is None:
        raise ValueError("gradient fidelity needs (inputs, targets) batches; got a batch without targets")
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))


def shadow_gradients(trainer: L.Trainer | None, pl_module: L.LightningModule, batch: Any,
                     params: list[torch.Tensor], rng_state: Any | None = None) -> list[torch.Tensor | None]:
    """∂L/∂p for ``params`` on ``batch`` with quantization off; nothing of the training state changes."""
    model = backbone(pl_module)
    device = next(model.parameters()).device
    with eager(), preserved_rng(device), preserved_quantizer_state(model), quantization_disabled(model):
        if rng_state is not None:
            restore_rng(rng_state, device)
        with torch.enable_grad(), forward_context(trainer):
            loss = lm_loss(pl_module, model, batch)
        return list(torch.autograd.grad(loss, params, allow_unused=True))


class GradientCallback(Instrument):
    """Per-layer gradient norms and zero-update fractions every interval; shadow-pass fidelity every N steps."""

    group = "grads"
    run_state = ("_cosines", "_snrs", "_zero")

    def __init__(self, every_n_steps: int = 10, fidelity_every_n_steps: int = 0, zero_update: bool = True) -> None:
        super().__init__(every_n_steps)
        if int(fidelity_every_n_steps) < 0:
            raise ValueError(f"fidelity_every_n_steps={fidelity_every_n_steps} is not valid; "
                             "valid: 0 (off) or an integer >= 1")
        self.fidelity_every_n_steps = int(fidelity_every_n_steps)
        self.zero_update = zero_update
        self._fidelity_due = False
        self._batch: Any = None
        self._rng: Any = None
        self._before: dict[str, torch.Tensor] = {}
        self._pending: dict[str, torch.Tensor] = {}
        self._cosines: list[float] = []
        self._snrs: list[float] = []
        self._zero: list[float] = []
        self._warned = False

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        n = self.fidelity_every_n_steps
        self._fidelity_due = n > 0 and not trainer.sanity_checking and (trainer.global_step + 1) % n == 0
        if self._fidelity_due and trainer.accumulate_grad_batches > 1:
            if not self._warned:
                rank_zero_warn("gradient fidelity is skipped with accumulate_grad_batches > 1 (the step's gradient "
                               "sums several batches; the shadow pass sees one)")
                self._warned = True
            self._fidelity_due = False
        if self._fidelity_due:
            self._batch = batch
            self._rng = capture_rng(next(backbone(pl_module).parameters()).device)

    @torch.no_grad()
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if not (self._due or self._fidelity_due):
            return
        layers = [(n, m) for n, m in linear_layers(backbone(pl_module)) if m.weight.grad is not None]
        values: dict[str, torch.Tensor] = {}
        if self._due:
            for name, m in layers:
                values[metric_name(self.group, name, "weight", "norm")] = torch.linalg.vector_norm(m.weight.grad)
                if self.zero_update:
                    self._before[name] = m.weight.detach().clone()
        if self._fidelity_due and self._batch is not None:
            params = [m.weight for _, m in layers]
            shadow = shadow_gradients(trainer, pl_module, self._batch, params, self._rng)
            for (name, m), g_ref in zip(layers, shadow):
                if g_ref is None:
                    continue
                values[metric_name("gradfid", name, "grad", "cosine")] = cosine(m.weight.grad, g_ref)
                values[metric_name("gradfid", name, "grad", "snr_db")] = snr_db(g_ref, m.weight.grad)
        self._batch = self._rng = None
        self._pending = values

    @torch.no_grad()
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        values, self._pending = self._pending, {}
        if self._before:
            modules = dict(linear_layers(backbone(pl_module)))
            for name, before in self._before.items():
                values[metric_name(self.group, name, "weight", "zero_update_frac")] = (
                    modules[name].weight.detach() == before).float().mean()
            self._before = {}
        if not values:
            return
        metrics = to_floats(values)
        self.log_scalars(trainer, metrics)
        self._cosines += [v for k, v in metrics.items() if k.endswith("/cosine")]
        self._snrs += [v for k, v in metrics.items() if k.endswith("/snr_db")]
        self._zero += [v for k, v in metrics.items() if k.endswith("/zero_update_frac")]
        self.summarize(pl_module,
                       min_grad_cosine=min(finite(self._cosines), default=None),
                       min_grad_snr_db=min(finite(self._snrs), default=None),
                       mean_zero_update_frac=mean(self._zero))

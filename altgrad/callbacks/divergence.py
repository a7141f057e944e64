"""Divergence handling: stop a run cleanly when the loss goes non-finite or blows up, and say where it started.

Every step (``check_every_n_steps``), with one host sync each:
- before the optimizer step, a non-finite gradient norm means this step would write NaN/Inf into the weights:
  the step is skipped (every ``.grad`` set to None, which torch optimizers skip) and the run is marked diverged;
- after the step, the loss feeds a DivergenceDetector (non-finite, or > factor × running minimum for patience steps).
On divergence: ``trainer.should_stop = True``; ``pl_module.run_summary`` gets status "diverged", diverged_at_step and
divergence_cause (the first layer/role, in execution order, whose stability stats showed NaN/Inf, else the most
saturated one, else the Linear nearest the loss with a non-finite weight gradient, else the loss itself).
Checkpoints: the weights never take a NaN/Inf step, so what the run's checkpoint callback writes when it stops
(train()'s LastCheckpoint saves at train end) holds finite, loadable weights; a Lightning ModelCheckpoint, if one is
configured, is also kept from saving at the divergence step, so its last.ckpt stays the last periodic one.
The process then ends normally (exit code 0), so a sweep continues: a diverged run is a result.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from altgrad.callbacks.base import backbone, linear_layers, quantizer_roles, run_summary
from altgrad.diagnostics import DivergenceDetector
from altgrad.quant import STAT_NAMES

log = logging.getLogger(__name__)

_NONFINITE = STAT_NAMES.index("nonfinite")
_SATURATED = STAT_NAMES.index("frac_saturated")


def step_loss(outputs: Any) -> torch.Tensor | None:
    """The loss tensor of a training_step output (a tensor, or a dict with "loss")."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, dict) and isinstance(outputs.get("loss"), torch.Tensor):
        return outputs["loss"]
    return None


def locate_cause(model: torch.nn.Module) -> str | None:
    """The first quantized layer/role, in execution order, whose stats show NaN/Inf; else the most saturated one.

    Execution order: weights and inputs in forward (module) order, then gradients in backward (reverse) order.
    One host transfer; called only once a divergence is detected.
    """
    roles = quantizer_roles(model)
    if not roles:
        return None
    forward = [(layer, role, q) for layer, role, q in roles if role != "grad"]
    backward = [(layer, role, q) for layer, role, q in reversed(roles) if role == "grad"]
    ordered = forward + backward
    stats = torch.stack([q.stats.detach().float() for _, _, q in ordered]).cpu()
    for (layer, role, _), s in zip(ordered, stats):
        if s[_NONFINITE] > 0 or not torch.isfinite(s).all():
            return f"{layer}/{role}: non-finite values ({int(s[_NONFINITE])} NaN/Inf)"
    sat = stats[:, _SATURATED]
    i = int(torch.argmax(sat))
    if sat[i] > 0:
        layer, role, _ = ordered[i]
        return f"{layer}/{role}: saturated ({100 * float(sat[i]):.3g}% of values at ±max)"
    return None


def locate_nonfinite_grad(model: torch.nn.Module) -> str | None:
    """The Linear closest to the loss (backward order) whose weight gradient holds NaN/Inf (one host transfer)."""
    layers = [(n, m) for n, m in reversed(linear_layers(model)) if m.weight.grad is not None]
    if not layers:
        return None
    bad = torch.stack([~torch.isfinite(m.weight.grad).all() for _, m in layers]).cpu()
    for (name, _), b in zip(layers, bad):
        if b:
            return f"{name}/grad: non-finite weight gradient"
    return None


class DivergenceCallback(L.Callback):
    """Stops diverged runs cleanly (status "diverged" in summary.json, exit code 0, last good checkpoint kept)."""

    def __init__(self, factor: float = 3.0, patience: int = 20, check_every_n_steps: int = 1,
                 skip_nonfinite_steps: bool = True) -> None:
        if int(check_every_n_steps) < 1:
            raise ValueError(f"check_every_n_steps={check_every_n_steps} is not valid; valid: integer >= 1")
        self.detector = DivergenceDetector(factor, patience)
        self.check_every_n_steps = int(check_every_n_steps)
        self.skip_nonfinite_steps = skip_nonfinite_steps
        self._step = 0
        self._grad_reason: str | None = None
        self._cause: str | None = None
        self.diverged_at_step: int | None = None

    def _checking(self, trainer: L.Trainer) -> bool:
        return not trainer.sanity_checking and self._step % self.check_every_n_steps == 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._step = trainer.global_step

    @torch.no_grad()
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if not self.skip_nonfinite_steps or not self._checking(trainer):
            return
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            return  # fp16 AMP: the GradScaler skips inf/NaN steps itself while it calibrates the loss scale
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], error_if_nonfinite=False)
        if bool(torch.isfinite(norm)):
            return
        # locate before anything else touches the stats; then drop the gradients so the step leaves weights as they are
        model = backbone(pl_module)
        self._cause = self._cause or locate_cause(model) or locate_nonfinite_grad(model)
        self._grad_reason = self._grad_reason or f"non-finite gradient norm ({float(norm)})"
        for p in params:
            p.grad = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.diverged_at_step is not None or not self._checking(trainer):
            return
        reason = self._grad_reason
        loss = step_loss(outputs)
        if loss is not None:
            reason = self.detector.update(float(loss.detach().float())) or reason
        if reason is None:
            return
        self._stop(trainer, pl_module, reason)

    def _stop(self, trainer: L.Trainer, pl_module: L.LightningModule, reason: str) -> None:
        cause = self._cause or locate_cause(backbone(pl_module))
        cause = f"{cause} (trigger: {reason})" if cause else reason
        self.diverged_at_step = self._step
        summary = run_summary(pl_module)
        summary.update(status="diverged", diverged_at_step=self._step, divergence_cause=cause)
        trainer.should_stop = True
        # Keep the last good checkpoint: ModelCheckpoint skips any save at a step it believes it already saved,
        # and checkpoint callbacks run after this one in the same hook.
        for cb in trainer.checkpoint_callbacks:
            if isinstance(cb, ModelCheckpoint) and hasattr(cb, "_last_global_step_saved"):
                cb._last_global_step_saved = trainer.global_step
        message = f"run diverged at step {self._step}: {cause}; stopping (last good checkpoint kept)"
        log.warning(message)
        if trainer.is_global_zero:
            print(message, flush=True)

    def state_dict(self) -> dict[str, Any]:
        return {"detector": self.detector.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.detector.load_state_dict(state_dict["detector"])

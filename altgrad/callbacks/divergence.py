"""Divergence handling: stop a run cleanly when the loss goes non-finite or blows up, and say where it started.

Every step (``check_every_n_steps``), with one host sync each:
- before the optimizer step, a non-finite gradient norm means this step would write NaN/Inf into the weights:
  the step is skipped (every ``.grad`` set to None, which torch optimizers skip) and the run is marked diverged;
- after the step, the loss feeds a DivergenceDetector (non-finite, or > factor × running minimum for patience steps).
On divergence: ``trainer.should_stop = True``; ``pl_module.run_summary`` gets status "diverged", diverged_at_step and
divergence_cause (the first layer/role, in execution order, whose stability stats showed NaN/Inf, else the most
saturated one, else the Linear nearest the loss with a non-finite weight gradient, else the loss itself).
The cause is read from the statistics of the diverged step. Quantizers record them only on steps where a callback
asks for them (FakeQuantCallback, ``quant.stats=demand``), so on any other step this callback replays the step's
batch through forward and backward with statistics on (``replay_with_stats``: the step's RNG state and scaler state,
gradients by ``torch.autograd.grad`` so ``.grad`` is untouched; flags, scaler state and RNG restored afterwards).
It does so before the optimizer step, with the weights the step's forward used: for a non-finite gradient norm, and
for a loss that the detector is about to flag (the loss is taken in ``on_before_backward`` and read together with
the norm, one host transfer). Only when that was not possible (a micro-batch of gradient accumulation that does not
step, or fp16 loss scaling, whose ``on_before_backward`` loss is scaled) is the replay done after the step.
Checkpoints: the weights never take a NaN/Inf step, so what the run's checkpoint callback writes when it stops
(train()'s LastCheckpoint saves at train end) holds finite, loadable weights; a Lightning ModelCheckpoint, if one is
configured, is also kept from saving at the divergence step, so its last.ckpt stays the last periodic one.
The process then ends normally (exit code 0), so a sweep continues: a diverged run is a result.
A run that never learns is a failure too: with ``learn_within_steps`` set, a run whose lowest training loss by that
step is not at least ``min_relative_drop`` below its first loss stops the same way, with the cause "never learned"
(a flat loss at ln(vocab) would otherwise count as a completed run with a merely poor final loss).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from altgrad.callbacks.base import backbone, linear_layers, quantizer_roles, run_summary
from altgrad.callbacks.gradients import lm_loss
from altgrad.callbacks.probe import capture_rng, forward_context, preserved_rng, quantizers, restore_rng
from altgrad.diagnostics import DivergenceDetector
from altgrad.grad_norm import StepGradNorm, optimizer_params, step_grads
from altgrad.quant import STAT_NAMES
from altgrad.quant.fake_quant import set_track_stats

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


def replay_with_stats(trainer: L.Trainer | None, pl_module: L.LightningModule, batch: Any,
                      rng: tuple[torch.Tensor, torch.Tensor | None] | None = None,
                      scaler_state: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
                      step: int | None = None) -> None:
    """Run ``batch`` through forward and backward again with every quantizer's ``track_stats`` on, so that ``stats``
    hold this batch's statistics; scaler state, ``track_stats`` flags, RNG streams and every ``.grad`` are as they
    were afterwards (only the ``stats`` buffers change).

    The loss is the module's own (``lm_loss``) through the backbone's ``__call__`` in its current (training) mode
    and the training precision: a torch.compiled backbone runs its graph with statistics, compiled once if no step
    recorded statistics before. Gradients come from ``torch.autograd.grad``, so ``.grad`` is not touched.
    ``rng``: the RNG state the step started from (same dropout masks and stochastic-rounding seeds);
    ``scaler_state``: (buffer, value at the start of the step) for scalers that the step's own passes moved (delayed
    scaling's amax history), so the replay scales as the step did. ``step`` goes to the quantizers' StatsRecord.
    """
    model = backbone(pl_module)
    qs = quantizers(model)
    if not qs:
        return
    device = next(model.parameters()).device
    flags = [q.track_stats for q in qs]
    now = [(b, b.detach().clone()) for q in qs for b in q.scaler.buffers()]
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        with preserved_rng(device):
            with torch.no_grad():
                for buf, value in scaler_state or ():
                    buf.copy_(value)
            if rng is not None:
                restore_rng(rng, device)
            set_track_stats(qs, True)
            with torch.enable_grad():
                with forward_context(trainer):
                    loss = lm_loss(pl_module, model, batch)
                torch.autograd.grad(loss, params, allow_unused=True)
    finally:
        with torch.no_grad():
            for buf, value in now:
                buf.copy_(value)
        for q, flag in zip(qs, flags):
            q.track_stats = flag
    record = getattr(qs[0], "stats_record", None)
    if record is not None and step is not None:
        record.step = step


class DivergenceCallback(L.Callback):
    """Stops diverged runs cleanly (status "diverged" in summary.json, exit code 0, last good checkpoint kept)."""

    def __init__(self, factor: float = 3.0, patience: int = 20, check_every_n_steps: int = 1,
                 skip_nonfinite_steps: bool = True, learn_within_steps: int | None = None,
                 min_relative_drop: float = 0.05) -> None:
        if int(check_every_n_steps) < 1:
            raise ValueError(f"check_every_n_steps={check_every_n_steps} is not valid; valid: integer >= 1")
        if learn_within_steps is not None and int(learn_within_steps) < 1:
            raise ValueError(f"learn_within_steps={learn_within_steps} is not valid; valid: null (off) or an "
                             "integer >= 1")
        if not 0.0 < min_relative_drop < 1.0:
            raise ValueError(f"min_relative_drop={min_relative_drop} is not valid; valid: 0 < drop < 1")
        self.learn_within_steps = None if learn_within_steps is None else int(learn_within_steps)
        self.min_relative_drop = float(min_relative_drop)
        self.first_loss: float | None = None
        self.lowest_loss = math.inf
        self._learning_checked = False
        self.detector = DivergenceDetector(factor, patience)
        self.check_every_n_steps = int(check_every_n_steps)
        self.skip_nonfinite_steps = skip_nonfinite_steps
        self._step = 0
        self._grad_reason: str | None = None
        self._cause: str | None = None
        self._located = False  # the cause of this step was looked for (self._cause, None if none was found)
        self.diverged_at_step: int | None = None
        self.replays = 0  # steps replayed to read their statistics
        # what a replay of this batch needs (kept only on checked batches)
        self._batch: Any = None
        self._rng: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self._scaler_state: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._loss: torch.Tensor | None = None  # this batch's loss, from on_before_backward
        self._loss_value: float | None = None  # ... read before the optimizer step
        self._model_id: int | None = None
        self._quantizers: list[torch.nn.Module] = []
        self._delayed: list[torch.nn.Module] = []
        self._snapshot: list[torch.Tensor] = []

    def _checking(self, trainer: L.Trainer) -> bool:
        return not trainer.sanity_checking and self._step % self.check_every_n_steps == 0

    def _collect(self, model: torch.nn.Module) -> None:
        if self._model_id != id(model):
            self._model_id = id(model)
            self._quantizers = quantizers(model)
            self._delayed = [q for q in self._quantizers if q.spec.scaling.kind == "delayed"]

    def _stats_recorded(self) -> bool:
        """Whether this step's passes write the statistics (every quantizer's ``track_stats`` on): the switch's
        StatsRecord says so without a loop over the quantizers; without a switch the flags are read."""
        record = self._quantizers[0].stats_record if self._quantizers else None
        if record is not None and record.on is not None:
            return record.on
        return all(q.track_stats for q in self._quantizers)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._step = trainer.global_step
        self._cause = self._loss = self._loss_value = self._batch = self._rng = None
        self._located = False
        self._scaler_state = []
        if self.diverged_at_step is not None or not self._checking(trainer):
            return
        model = backbone(pl_module)
        self._collect(model)
        if not self._quantizers:
            return
        # A replay needs the batch and the RNG state the step starts from (cheap references / a small copy), and,
        # when this step's passes do not record statistics, the delayed scalers' state before they move it.
        self._batch = batch
        self._rng = capture_rng(next(model.parameters()).device)
        if self._delayed and not self._stats_recorded():
            buffers = [b for q in self._delayed for b in q.scaler.state()]
            if len(self._snapshot) != len(buffers) or any(a.shape != b.shape for a, b in zip(self._snapshot, buffers)):
                self._snapshot = [torch.empty_like(b) for b in buffers]
            torch._foreach_copy_(self._snapshot, buffers)
            self._scaler_state = list(zip(buffers, self._snapshot))

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        if self.diverged_at_step is None and self._checking(trainer):
            self._loss = loss.detach()

    def locate(self, trainer: L.Trainer, pl_module: L.LightningModule) -> str | None:
        """``locate_cause`` on this step's statistics: as recorded, or from a replay of the step's batch (None when
        they could not be had: the statistics in the buffers are from an earlier step and are not used)."""
        model = backbone(pl_module)
        self._collect(model)
        if self._quantizers and not self._stats_recorded():
            if self._batch is None:
                log.warning("divergence at step %d: no statistics were recorded and the batch was not kept; "
                            "cause not read from the quantizers", self._step)
                return None
            try:
                replay_with_stats(trainer, pl_module, self._batch, self._rng, self._scaler_state, step=self._step)
            except Exception as err:  # noqa: BLE001 - naming a cause must never crash the run it describes
                log.warning("divergence at step %d: replaying the step for its statistics failed (%s: %s); cause "
                            "not read from the quantizers", self._step, type(err).__name__, err)
                return None
            self.replays += 1
        return locate_cause(model)

    @torch.no_grad()
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if not self._checking(trainer):
            return
        # fp16 AMP: the GradScaler skips inf/NaN steps itself while it calibrates the loss scale, and the loss seen in
        # on_before_backward is scaled, so neither is read here
        amp = getattr(trainer.precision_plugin, "scaler", None) is not None
        params = [p for p in optimizer_params(optimizer) if p.grad is not None]  # clipping's order (grad_norm)
        check_grads = self.skip_nonfinite_steps and not amp and bool(params)
        values = []
        if check_grads:
            # kept on the module (AltGradModule.grad_norm) for clipping to reuse this step: one norm, not two
            cache = getattr(pl_module, "grad_norm", None)
            grads = step_grads(params)
            values.append(cache.compute(grads, trainer.global_step) if isinstance(cache, StepGradNorm)
                          else torch.nn.utils.get_total_norm(grads, error_if_nonfinite=False))
        loss = None if amp or self.diverged_at_step is not None else self._loss
        if loss is not None:
            values.append(loss)
        if not values:
            return
        host = torch.stack([v.detach().float().reshape(()) for v in values]).cpu().tolist()  # one host transfer
        if loss is not None:
            self._loss_value = host[-1]
        bad_grads = check_grads and not math.isfinite(host[0])
        diverging = bad_grads or (self._loss_value is not None and self.detector.would_diverge(self._loss_value))
        if diverging and self.diverged_at_step is None and not self._located:
            # name the cause now, before the step changes the weights (locate before anything else touches the stats)
            self._cause = self.locate(trainer, pl_module)
            if bad_grads:
                self._cause = self._cause or locate_nonfinite_grad(backbone(pl_module))
            self._located = True
        if bad_grads:
            # drop the gradients so the step leaves the weights as they are
            self._grad_reason = self._grad_reason or f"non-finite gradient norm ({host[0]})"
            for p in params:
                p.grad = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.diverged_at_step is not None or not self._checking(trainer):
            return
        reason = self._grad_reason
        value = self._loss_value
        if value is None:
            loss = step_loss(outputs)
            value = None if loss is None else float(loss.detach().float())
        if value is not None:
            reason = self.detector.update(value) or reason
            if reason is None and self.learn_within_steps is not None:
                never = self.never_learned(value)
                if never is not None:
                    self._cause, self._located = None, True  # no layer to blame: nothing went non-finite
                    reason = never
        if reason is None:
            self._batch = self._rng = None
            self._scaler_state = []
            return
        self._stop(trainer, pl_module, reason)

    def never_learned(self, loss: float) -> str | None:
        """Fed each checked step's finite loss; the reason once ``learn_within_steps`` have passed without the
        lowest loss dropping ``min_relative_drop`` below the first one (checked once)."""
        if not math.isfinite(loss):
            return None
        if self.first_loss is None:
            self.first_loss = loss
        self.lowest_loss = min(self.lowest_loss, loss)
        if self._learning_checked or self.learn_within_steps is None or self._step + 1 < self.learn_within_steps:
            return None
        self._learning_checked = True
        if self.lowest_loss > (1.0 - self.min_relative_drop) * self.first_loss:
            return (f"never learned: lowest training loss {self.lowest_loss:.4g} after {self._step + 1} steps is "
                    f"not {100 * self.min_relative_drop:g}% below the first ({self.first_loss:.4g})")
        return None

    def _stop(self, trainer: L.Trainer, pl_module: L.LightningModule, reason: str) -> None:
        cause = self._cause if self._located else self.locate(trainer, pl_module)
        self._batch = self._rng = None
        self._scaler_state = []
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
        return {"detector": self.detector.state_dict(),
                "learning": {"first": self.first_loss, "lowest": self.lowest_loss, "checked": self._learning_checked}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.detector.load_state_dict(state_dict["detector"])
        learning = state_dict.get("learning")  # absent in checkpoints written before the never-learned rule
        if learning is not None:
            self.first_loss = learning["first"]
            self.lowest_loss = float(learning["lowest"])
            self._learning_checked = bool(learning["checked"])

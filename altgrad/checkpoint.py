"""`checkpoints/last.ckpt`: written every N optimizer steps, at the end and on an interrupt, atomically.

A crash mid-write leaves the previous last.ckpt intact, so `ckpt_path=<run dir>` can always resume. Each checkpoint
records the run's resolved configuration (so a resume can tell whether it continues the same experiment:
`altgrad.resume_check`) and how many metrics.csv rows were written by then (`altgrad.metrics_csv`). A signal noted
by `altgrad.interrupts.GUARD` makes the run save after the step it has reached and stop before the next one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from altgrad.atomic import write_stream
from altgrad.interrupts import GUARD, InterruptGuard, RunInterrupted
from altgrad.resume_check import RECORD, ResumePlan, adapt_checkpoint

LAST = "last.ckpt"


class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save into a temporary file in the same folder (opened and closed here, so a failed write releases its
    space), then os.replace onto the target name."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None
                        ) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_stream(target, lambda f: torch.save(checkpoint, f))


class LastCheckpoint(L.Callback):
    """Saves `<dirpath>/last.ckpt` after every `every_n_steps`-th optimizer step, after the last one, at the end, and
    after the step at which an interrupt (`guard`) arrived.

    An interrupted run stops before its next batch: step k's metrics are logged and its validation (if due) has run,
    exactly as in an uninterrupted run, so a resume in place continues the same records.
    """

    def __init__(self, dirpath: str | os.PathLike, every_n_steps: int, config: dict[str, Any] | None = None,
                 guard: InterruptGuard = GUARD, resume: ResumePlan | None = None) -> None:
        self.path = Path(dirpath) / LAST
        self.every_n_steps = int(every_n_steps)
        self.config = config
        self.guard = guard
        self.resume = resume
        self._saved_at = -1
        self._checked_at = 0
        self._stop = False
        self._metrics_rows: int | None = None

    @property
    def saved_at(self) -> int:
        """The step of the last checkpoint this run wrote (-1: none)."""
        return self._saved_at

    def _save(self, trainer: L.Trainer) -> None:
        from altgrad.metrics_csv import flush_and_count

        self._metrics_rows = flush_and_count(trainer.loggers, self.path.parent.parent)
        trainer.save_checkpoint(self.path, weights_only=False)  # the full training state, for exact resume
        self._saved_at = trainer.global_step

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
                           ) -> None:
        if self.config is not None:
            checkpoint[RECORD] = {"config": self.config, "metrics_rows": self._metrics_rows}

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
                           ) -> None:
        if self.resume is not None:
            adapt_checkpoint(checkpoint, self.resume)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # From here a signal waits for the step boundary; Lightning's own SIGTERM handler (installed just before)
        # would raise in the middle of a validation instead, so ours take the signals back.
        self.guard.install()
        self.guard.deferring = True
        self._checked_at = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # global_step only moves at an optimizer step; the guards skip the micro-batches of gradient accumulation.
        step = trainer.global_step
        if step != self._saved_at and step != 0 and (step % self.every_n_steps == 0 or step >= trainer.max_steps):
            self._save(trainer)
        if step != self._checked_at:
            self._checked_at = step
            # One decision for all ranks (a no-op on one device), so every rank saves and stops at the same step.
            if trainer.strategy.reduce_boolean_decision(self.guard.requested, all=False):
                if step != self._saved_at:
                    self._save(trainer)
                self._stop = True

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
                             ) -> None:
        if self._stop:
            self.guard.deferring = False
            raise RunInterrupted(self.guard.signum if self.guard.signum is not None else 15)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.guard.deferring = False
        if trainer.global_step != self._saved_at:  # the last step, or stopped early (e.g. divergence)
            self._save(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.guard.deferring = False

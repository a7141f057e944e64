"""`checkpoints/last.ckpt`: written every N optimizer steps and at the end, atomically (temp file + rename).

A crash mid-write leaves the previous last.ckpt intact, so `ckpt_path=<run dir>` can always resume.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

LAST = "last.ckpt"


class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save to a temporary file in the same folder, then os.replace onto the target name."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None
                        ) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        try:
            torch.save(checkpoint, tmp)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)


class LastCheckpoint(L.Callback):
    """Saves `<dirpath>/last.ckpt` after every `every_n_steps`-th optimizer step, after the last one, and at the end."""

    def __init__(self, dirpath: str | os.PathLike, every_n_steps: int) -> None:
        self.path = Path(dirpath) / LAST
        self.every_n_steps = int(every_n_steps)
        self._saved_at = -1

    def _save(self, trainer: L.Trainer) -> None:
        trainer.save_checkpoint(self.path, weights_only=False)  # the full training state, for exact resume
        self._saved_at = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # global_step only moves at an optimizer step; the guard skips the micro-batches of gradient accumulation.
        step = trainer.global_step
        if step == self._saved_at or step == 0:
            return
        if step % self.every_n_steps == 0 or step >= trainer.max_steps:
            self._save(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step != self._saved_at:  # stopped early (e.g. divergence) between two saves
            self._save(trainer)

"""FingerprintCallback: hashes of the initial weights and of the first batches, recorded in summary.json.

A fair ablation changes one thing: two runs with the same seed that differ only in format (or optimizer) must start
from the same weights and see the same token stream. The hashes make that checkable from the run folders alone.
"""

from __future__ import annotations

import hashlib
from typing import Any

import lightning as L
import torch


def tensor_digest(tensors: list[tuple[str, torch.Tensor]]) -> str:
    """sha256 over names, dtypes, shapes and raw bytes of the tensors, in the given order."""
    h = hashlib.sha256()
    for name, t in tensors:
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class FingerprintCallback(L.Callback):
    """Records ``fingerprint.init_params`` (before any step) and ``fingerprint.batches`` (first ``n_batches``)."""

    def __init__(self, n_batches: int = 4) -> None:
        self.n_batches = n_batches
        self._batches = hashlib.sha256()
        self._seen = 0

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # taken before on_train_start, i.e. before master='none' snaps weights onto a format's grid
        if trainer.global_step == 0:
            # parameters only: quantizer buffers (scales, statistics) differ by format by design
            weights = list(pl_module.model.named_parameters())
            pl_module.run_summary.setdefault("fingerprint", {})["init_params"] = tensor_digest(weights)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if trainer.global_step >= self.n_batches or self._seen >= self.n_batches:
            return
        tensors = batch if isinstance(batch, (list, tuple)) else [batch]
        self._batches.update(tensor_digest([(str(i), t) for i, t in enumerate(tensors)]).encode())
        self._seen += 1
        if self._seen == self.n_batches:
            pl_module.run_summary.setdefault("fingerprint", {})["batches"] = self._batches.hexdigest()


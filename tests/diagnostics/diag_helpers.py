"""Test helpers: a tiny GPT in a tiny LightningModule, a recording logger, and a fake trainer."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader, TensorDataset

from altgrad.callbacks.fake_quant import FakeQuantCallback
from altgrad.model import GPT, GPTConfig

E4M3 = {"name": "e4m3", "grad": "e5m2", "rounding": "nearest", "overflow": "saturate",
        "scaling": {"kind": "tensor", "pow2": True}}


class RecordingLogger(Logger):
    """Keeps every log_metrics call as (step, metrics)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[int | None, dict[str, Any]]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        self.records.append((step, dict(metrics)))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def last(self) -> dict[str, Any]:
        """Every metric's latest value."""
        out: dict[str, Any] = {}
        for _, m in self.records:
            out.update(m)
        return out

    def series(self, name: str) -> list[tuple[int | None, Any]]:
        return [(s, m[name]) for s, m in self.records if name in m]


def tiny_config(**kw: Any) -> GPTConfig:
    cfg = dict(block_size=8, vocab_size=32, n_layer=2, n_head=2, n_embd=16, dropout=0.0, bias=False)
    cfg.update(kw)
    return GPTConfig(**cfg)


def tiny_gpt(seed: int = 0, fmt: dict | None = E4M3, **kw: Any) -> GPT:
    torch.manual_seed(seed)
    model = GPT(tiny_config(**kw))
    if fmt is not None:
        FakeQuantCallback(fmt, {"base_rules": []}).apply(model)
    return model


class TinyLM(L.LightningModule):
    """Next-token cross-entropy on a GPT, AdamW; ``hook(module, step)`` may tamper with the loss in tests."""

    def __init__(self, model: torch.nn.Module, lr: float = 1e-2, hook: Any = None) -> None:
        super().__init__()
        self.model = model
        self.lr = lr
        self.hook = hook
        self.run_summary: dict[str, Any] = {}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        if self.hook is not None:
            loss = self.hook(self, loss)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.parameters(), lr=self.lr)


def token_loader(n: int = 64, batch: int = 4, block: int = 8, vocab: int = 32, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab, (n, block + 1), generator=g)
    return DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=batch, shuffle=False)


def fit(module: L.LightningModule, callbacks: list, steps: int, tmp_path, logger: Logger | None = None,
        **trainer_kw: Any) -> L.Trainer:
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=logger or RecordingLogger(),
                        callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=trainer_kw.pop("enable_checkpointing", False),
                        limit_val_batches=0, log_every_n_steps=1, default_root_dir=str(tmp_path), **trainer_kw)
    trainer.fit(module, train_dataloaders=token_loader())
    return trainer


def fake_trainer(logger: RecordingLogger, step: int = 0, optimizers: list | None = None) -> SimpleNamespace:
    """The few Trainer attributes the instruments read, for known-answer tests without a training loop."""
    return SimpleNamespace(loggers=[logger], global_step=step, sanity_checking=False, is_global_zero=True,
                           optimizers=optimizers or [], callbacks=[], accumulate_grad_batches=1,
                           checkpoint_callbacks=[], should_stop=False, precision_plugin=None)

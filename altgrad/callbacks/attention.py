"""Attention entropy per head, on a probe of the current batch.

The GPT computes attention with fused ``F.scaled_dot_product_attention``, which never materialises the map, so
the probe hooks each block's ``attn.c_attn`` (the fused q, k, v projection) and recomputes softmax(q·kᵀ/√d)
with the causal mask from its output: ``attn/transformer.h.<i>.attn/head<k>/entropy`` in nats (ln T = uniform
over T keys, 0 = one key). The model file is not touched; the probe runs outside the compiled step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lightning as L
import torch

from torch.utils.hooks import RemovableHandle

from altgrad.callbacks.base import backbone, mean
from altgrad.callbacks.probe import ProbeInstrument
from altgrad.diagnostics import attention_entropy, attention_probs


def attention_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, attention module) for every module with a fused ``c_attn`` projection and an ``n_head``."""
    return [(n, m) for n, m in model.named_modules() if hasattr(m, "c_attn") and hasattr(m, "n_head")]


class AttentionCallback(ProbeInstrument):
    """Logs ``attn/<block>.attn/head<k>/entropy`` for every head of every block."""

    group = "attn"
    run_state = ("_entropies", "_final")

    def __init__(self, every_n_steps: int = 50, max_sequences: int = 4) -> None:
        super().__init__(every_n_steps, max_sequences)
        self._entropies: list[float] = []
        self._final: list[float] = []

    def measure(self, trainer: L.Trainer | None, pl_module: L.LightningModule, batch: Any) -> dict[str, float]:
        """Run the probe and return ``attn/...`` entropies."""
        model = backbone(pl_module)

        def hooks(values: dict[str, torch.Tensor]) -> Iterator[RemovableHandle]:
            def make_hook(name: str, n_head: int):
                def hook(_m, _inp, out):
                    ent = attention_entropy(attention_probs(out, n_head))
                    for k, e in enumerate(ent.unbind()):
                        values[f"{self.group}/{name}/head{k}/entropy"] = e
                return hook

            for name, attn in attention_modules(model):
                yield attn.c_attn.register_forward_hook(make_hook(name, int(attn.n_head)))

        return self.probe_with_hooks(trainer, model, batch, hooks)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._due:
            return
        metrics = self.measure(trainer, pl_module, batch)
        self.log_scalars(trainer, metrics)
        self._final = list(metrics.values())
        self._entropies.extend(self._final)
        self.summarize(pl_module, min_attn_entropy=min(self._entropies, default=None),
                       final_mean_attn_entropy=mean(self._final))

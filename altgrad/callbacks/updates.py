"""UpdateCallback: how large the optimizer's updates are in ULPs of each weight's grid, recorded per run.

On every ``every_n_steps``-th optimizer step only (sparse, so its cost is negligible): the weights of every quantized
Linear are read before the step, and the optimizer's own change is read by an optimizer step post-hook, before any
storage rounding. For a fixed random sample of each tensor (``max_weights_per_tensor``), on the device and without
host syncs: |Δw|/S(w) (S: the weight's spacing on the grid and scale the step's forward used), |Δw|/|w| and the |w|
decile. At the end of training the samples are moved to the host once and reduced into
``summary.json["diagnostics"]`` (altgrad/diagnostics/ulp_updates.py): ulp_update_q10/q50/q90, sub_half_ulp_share
and rel_update_d1 … d10. The samples live in memory only: after a resume the aggregates cover the steps run since.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

from altgrad.callbacks.base import Instrument, backbone, quantized_weights, run_summary
from altgrad.diagnostics.ulp_updates import decile_index, summarize_updates, ulp_ratio
from altgrad.quant.fake_quant import kept_scale
from altgrad.quant.layers import QuantLinear


@dataclass
class _Sampled:
    name: str
    layer: QuantLinear
    index: torch.Tensor | None  # flat indices of the sample (None: every weight)
    before: torch.Tensor | None = None
    scale: torch.Tensor | None = None

    def select(self, w: torch.Tensor) -> torch.Tensor:
        flat = w.detach().reshape(-1)
        return flat if self.index is None else flat[self.index]


class UpdateCallback(Instrument):
    """Per-run update sizes in ULPs, on sampled steps; aggregates in summary.json["diagnostics"]."""

    group = "updates"
    run_state = ("_ratios", "_relative", "_deciles", "steps_sampled")

    def __init__(self, every_n_steps: int = 50, max_weights_per_tensor: int | None = 4096, seed: int = 0) -> None:
        super().__init__(every_n_steps)
        if max_weights_per_tensor is not None and int(max_weights_per_tensor) < 1:
            raise ValueError(f"max_weights_per_tensor={max_weights_per_tensor} is not valid; "
                             "valid: null (every weight) or an integer >= 1")
        self.max_weights = None if max_weights_per_tensor is None else int(max_weights_per_tensor)
        self.seed = int(seed)
        self.tracked: list[_Sampled] = []
        self._hooks: list[Any] = []
        self._pending = False
        self._ratios: list[torch.Tensor] = []
        self._relative: list[torch.Tensor] = []
        self._deciles: list[torch.Tensor] = []
        self.steps_sampled = 0

    def _sample(self, name: str, w: torch.Tensor) -> torch.Tensor | None:
        """A fixed sample of flat indices from a private generator (the training RNG is not touched)."""
        if self.max_weights is None or w.numel() <= self.max_weights:
            return None
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + sum(map(ord, name)))
        return torch.randperm(w.numel(), generator=g)[: self.max_weights].sort().values.to(w.device)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.tracked = [_Sampled(n, m, self._sample(n, m.weight)) for n, m in quantized_weights(backbone(pl_module))]
        if self.tracked:
            for opt in trainer.optimizers:
                self._hooks.append(opt.register_step_post_hook(self._after_optimizer_step))

    @staticmethod
    def _scale(t: _Sampled, w: torch.Tensor) -> torch.Tensor:
        """The scale of this step's forward for each sampled weight (kept by the scaler for one-scale kinds)."""
        q = t.layer.weight_q
        s = kept_scale(q)
        s = q.scale_for(w).detach().float() if s is None else s.detach().float().to(w.device)
        return s.reshape(()) if s.numel() == 1 else t.select(torch.broadcast_to(s, w.shape))

    @torch.no_grad()
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if not self._due or not self.tracked:
            return
        for t in self.tracked:
            w = t.layer.weight.detach()
            t.before = t.select(w).float().clone()
            t.scale = self._scale(t, w)
        self._pending = True

    @torch.no_grad()
    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._pending:
            return
        self._pending = False
        ratios, moved, relative, nonzero, deciles = [], [], [], [], []
        for t in self.tracked:
            if t.before is None:
                continue
            before, delta = t.before, t.select(t.layer.weight).float() - t.before
            moved.append(delta != 0)
            ratios.append(ulp_ratio(delta, before, t.layer.weight_q.spec.format, t.scale))
            nonzero.append(before != 0)
            relative.append(delta.abs() / before.abs())
            deciles.append(decile_index(before.abs()).to(torch.int8))
            t.before = t.scale = None
        if ratios:
            # one boolean index per quantity for the whole model (each one waits for the device): the same elements
            # in the same order as masking tensor by tensor
            moved_all, nonzero_all = torch.cat(moved), torch.cat(nonzero)
            self._ratios.append(torch.cat(ratios)[moved_all])
            self._relative.append(torch.cat(relative)[nonzero_all])
            self._deciles.append(torch.cat(deciles)[nonzero_all])
        self.steps_sampled += 1

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if not self._ratios and not self._relative:
            return
        device = (self._ratios or self._relative)[-1].device  # a resumed run's earlier samples come back on the CPU
        aggregates = summarize_updates(*(torch.cat([t.to(device) for t in parts])
                                         for parts in (self._ratios, self._relative, self._deciles)))
        diag = run_summary(pl_module)["diagnostics"]
        diag.update(aggregates)
        diag["update_steps_sampled"] = float(self.steps_sampled)
        self._ratios, self._relative, self._deciles = [], [], []

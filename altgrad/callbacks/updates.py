"""UpdateCallback: how large the optimizer's updates are in ULPs of each weight's grid, recorded per run.

On every ``every_n_steps``-th optimizer step only (sparse, so its cost is negligible): the weights of every quantized
Linear are read before the step, and the optimizer's own change is read by an optimizer step post-hook, before any
storage rounding. For a fixed random sample of each tensor (``max_weights_per_tensor``), on the device and without
host syncs: |Δw|/S(w) (S: the weight's spacing on the grid and scale the step's forward used), |Δw|/|w| and the |w|
decile. At the end of training the samples are moved to the host once and reduced into
``summary.json["diagnostics"]`` (altgrad/diagnostics/ulp_updates.py): ulp_update_q10/q50/q90, sub_half_ulp_share
and rel_update_d1 … d10. The values kept travel in the checkpoint, so a resumed run's aggregates cover the whole run.

What is kept is bounded (``max_values`` per quantity): past it every kept value is dropped with probability ½ and
each later value is kept with probability 2^−k after the k-th such halving, so the values kept stay a uniform
sample of every value seen (from a private generator whose state is checkpointed), and memory and checkpoints stop
growing with the run's length (a 100 K-step run of `model=gpt_50m` would otherwise keep ≈ 270 M values a quantity).
Below the bound every value is kept, as before; past it the summary says what share was kept
(``update_values_kept_share``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

from altgrad.callbacks.base import Instrument, backbone, quantized_weights, run_summary
from altgrad.diagnostics.ulp_updates import decile_indices, summarize_updates, ulp_ratio
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
    run_state = ("_ratios", "_relative", "_deciles", "steps_sampled", "keep_level", "_thin_state")

    def __init__(self, every_n_steps: int = 50, max_weights_per_tensor: int | None = 4096, seed: int = 0,
                 max_values: int | None = 2**22) -> None:
        super().__init__(every_n_steps)
        if max_weights_per_tensor is not None and int(max_weights_per_tensor) < 1:
            raise ValueError(f"max_weights_per_tensor={max_weights_per_tensor} is not valid; "
                             "valid: null (every weight) or an integer >= 1")
        if max_values is not None and int(max_values) < 1:
            raise ValueError(f"max_values={max_values} is not valid; valid: null (keep every value) or an integer >= 1")
        self.max_weights = None if max_weights_per_tensor is None else int(max_weights_per_tensor)
        self.max_values = None if max_values is None else int(max_values)
        self.seed = int(seed)
        self.keep_level = 0  # values sampled now are kept with probability 2^-keep_level
        self._thin_state: torch.Tensor | None = None  # the thinning generator's state once it has drawn
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
        ratios, moved, relative, nonzero, magnitudes = [], [], [], [], []
        for t in self.tracked:
            if t.before is None:
                continue
            before, delta = t.before, t.select(t.layer.weight).float() - t.before
            moved.append(delta != 0)
            ratios.append(ulp_ratio(delta, before, t.layer.weight_q.spec.format, t.scale))
            nonzero.append(before != 0)
            magnitudes.append(before.abs())
            relative.append(delta.abs() / magnitudes[-1])
            t.before = t.scale = None
        # the tensors' samples are mostly of one size: their deciles in one sort
        deciles = [d.to(torch.int8) for d in decile_indices(magnitudes)]
        if ratios:
            # one boolean index per quantity for the whole model (each one waits for the device): the same elements
            # in the same order as masking tensor by tensor
            moved_all, nonzero_all = torch.cat(moved), torch.cat(nonzero)
            self.keep(torch.cat(ratios)[moved_all], torch.cat(relative)[nonzero_all],
                      torch.cat(deciles)[nonzero_all])
        self.steps_sampled += 1

    def keep(self, ratios: torch.Tensor, relative: torch.Tensor, deciles: torch.Tensor) -> None:
        """Add one sampled step's values (|Δw|/S of the weights that moved; |Δw|/|w| and the |w| decile of the
        nonzero weights), each kept with probability 2^-keep_level, then hold the bound."""
        if self.keep_level:
            ratios, = self._thin((ratios,), 2.0 ** -self.keep_level)
            relative, deciles = self._thin((relative, deciles), 2.0 ** -self.keep_level)
        self._ratios.append(ratios)
        self._relative.append(relative)
        self._deciles.append(deciles)
        self._bound()

    def _thin(self, paired: tuple[torch.Tensor, ...], keep: float) -> tuple[torch.Tensor, ...]:
        """Each element (the same one of every tensor in ``paired``) kept with probability ``keep``."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + 17)
        if self._thin_state is not None:
            g.set_state(self._thin_state)
        mask = torch.rand(paired[0].numel(), generator=g) < keep
        self._thin_state = g.get_state()
        mask = mask.to(paired[0].device)
        return tuple(t[mask] for t in paired)

    def _bound(self) -> None:
        """Halve what is kept while a quantity holds more than ``max_values`` values (see the module docstring)."""
        if self.max_values is None:
            return
        while max(sum(t.numel() for t in self._ratios), sum(t.numel() for t in self._relative)) > self.max_values:
            self.keep_level += 1
            ratios, = self._thin((_joined(self._ratios),), 0.5)
            relative, deciles = self._thin((_joined(self._relative), _joined(self._deciles)), 0.5)
            self._ratios, self._relative, self._deciles = [ratios], [relative], [deciles]

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
        if self.keep_level:
            diag["update_values_kept_share"] = 2.0 ** -self.keep_level
        self._ratios, self._relative, self._deciles = [], [], []
        self.keep_level, self._thin_state = 0, None


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """The parts end to end on the newest part's device (a resumed run's earlier parts come back on the CPU)."""
    device = parts[-1].device
    return torch.cat([t.to(device) for t in parts])

"""Flips, stalls, oscillations and descent quality of every quantized weight, at every optimizer step.

Per step and tensor, vectorised and without host syncs: the weight before the step and after it (once
FakeQuantCallback has applied the storage policy; it runs first) are both quantized on the grid the step's forward
used (the scale the weight quantizer's scaler kept, so no statistics are needed; computed afresh for channel/block
scaling) and compared; the intended update is the optimizer's own change of the stored weight, read by an optimizer
step post-hook before any snapping.
Tensors that share a format are handled together: their tracked weights are concatenated, each side is quantized
by the quantizers' own kernel with a per-element scale, and the per-tensor counting is one pass (the native kernel
for float32 CPU weights, else one compiled function): a handful of kernels per step for the whole model.
``max_weights_per_tensor`` tracks a fixed random sample of each tensor instead of all of it (an unbiased estimate
of the same rates at a fraction of the cost; None = every weight). Counts accumulate on the device and are logged
as means over each interval:
- ``flip_rate``: share of weights whose quantized value changed;
- ``stall_ratio``: 1 − flips / weights that received a nonzero update;
- ``oscillation_rate``: bias-corrected EMA of the share of weights whose flip reversed their previous flip
  (Nagel et al. 2022, "Overcoming Oscillations in Quantization-Aware Training");
- ``descent_cos``: cosine between the intended update and the applied change of the quantized weight.
Cross-step state is one int8 per tracked weight (the direction of its last flip).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch

from altgrad.callbacks.base import Instrument, backbone, mean, metric_name, quantized_weights
from altgrad.diagnostics import ema_debiased, ema_update, segment_flip_counts, stall_ratio
from altgrad.diagnostics.flip_counts import counts_from_sums, ema_updates
from altgrad.quant import changes, native, quantize_scaled
from altgrad.quant.compiled import fused
from altgrad.quant.fake_quant import kept_scale
from altgrad.quant.layers import QuantLinear

_fused_counts = fused(segment_flip_counts)
FOLD_AT = 256
"""Steps whose sums wait unread at most (a long logging interval folds them on the way: the same bits)."""


@dataclass
class _Tracked:
    """One weight tensor: which of its weights are tracked (None: all, flattened)."""

    name: str
    layer: QuantLinear
    index: torch.Tensor | None

    @property
    def size(self) -> int:
        return self.layer.weight.numel() if self.index is None else self.index.numel()

    def select(self, w: torch.Tensor) -> torch.Tensor:
        """The tracked weights of a weight-shaped tensor, flat (``index_select``: one op, where ``[index]`` goes
        through Python's indexing machinery at several times its cost on these small tensors)."""
        flat = w.reshape(-1)
        return flat if self.index is None else torch.index_select(flat, 0, self.index)

    def one_scale(self) -> torch.Tensor | None:
        """The single scale of this step's forward as a 0-dim tensor (the scaler's own buffer), or None for many."""
        s = kept_scale(self.layer.weight_q)
        if s is None or s.numel() != 1:
            return None
        return s if s.dim() == 0 else s.reshape(())

    def scale(self, w: torch.Tensor) -> torch.Tensor:
        """The scale of this step's forward for each tracked weight (kept by the scaler for one-scale kinds)."""
        q = self.layer.weight_q
        s = kept_scale(q)
        if s is None:
            s = q.scale_for(w).detach().float()
        else:
            s = s.detach().to(w.device)
        if s.numel() == 1:
            return s.reshape(1).expand(self.size)
        return self.select(torch.broadcast_to(s, w.shape))


@dataclass
class _Group:
    """Tracked tensors of one format: concatenated state, per-tensor accumulators."""

    members: list[_Tracked]
    segments: torch.Tensor        # tensor number of each tracked weight
    starts: torch.Tensor          # int64: where each tensor's tracked weights begin, and their total at the end
    sizes: torch.Tensor           # tracked weights per tensor (float32)
    last_direction: torch.Tensor  # int8: −1/0/+1, direction of each tracked weight's last flip
    acc: torch.Tensor             # (tensors, 5): flips, updated, reversals, descent_cos sum, steps
    osc_ema: torch.Tensor         # (tensors,)
    before: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    intended: torch.Tensor | None = None
    after: torch.Tensor | None = None  # the tracked weights read after the last step: the next step's "before"
    stepped: torch.Tensor | None = None  # the tracked weights read right after the optimizer step ...
    stepped_key: tuple | None = None     # ... and their weights' (version counter, storage) then
    spec_key: Any = field(default=None)
    pow2: bool = False  # every member's scales are powers of two (the unscaling is then one exact multiply)
    ones: list[torch.Tensor | None] | None = None  # each member's one-scale buffer, as of quantizer change count ...
    ones_count: int = -1                            # ... this (in-place updates keep the buffers; changes.STRUCTURE)
    kept_scales: torch.Tensor | None = None  # CPU: the last step's per-tensor scales (int32 bits) ...
    kept_scale: torch.Tensor | None = None   # ... and the per-weight scale spread from them
    scale_kept: bool = False                 # this step's scales are the last step's, bit for bit
    q_after: torch.Tensor | None = None      # ``after`` on the grid of the step that read it
    q_before: torch.Tensor | None = None     # this step's quantized "before", where the last step's q_after is it

    plan: native.GatherPlan | None = None  # the native gather's pointer tables for the storages in plan_ptrs
    plan_ptrs: tuple | None = None
    unfolded: list[torch.Tensor] = field(default_factory=list)  # the native sums of steps not yet in acc/osc_ema

    def fold(self, momentum: float) -> None:
        """Add the steps whose sums wait in ``unfolded`` to ``acc`` and ``osc_ema``, oldest first: the bits of
        doing it step by step (every op below is elementwise, or the same in-order adds), in a few ops for all of
        them instead of some twenty small ones a step."""
        if not self.unfolded:
            return
        k, n = len(self.unfolded), len(self.members)
        counts = counts_from_sums(torch.stack(self.unfolded).reshape(k * n, 6)).reshape(k, n, 4)
        self.unfolded = []
        for row in torch.cat([counts, counts.new_ones(k, n, 1)], dim=2).unbind(0):
            self.acc += row
        self.osc_ema = ema_updates(self.osc_ema, counts[:, :, 2] / self.sizes, momentum)

    def gather(self, key: tuple | None = None) -> torch.Tensor:
        """The tracked weights end to end (``key``: this moment's ``weights_key``, where the caller has it)."""
        return self.gather_less(None, key)[0]

    def gather_less(self, before: torch.Tensor | None, key: tuple | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the tracked weights end to end, and their difference from ``before``, or None without one): one native
        call where the kernel serves these weights (the same values as ``index_select`` and ``cat``, then ``-``)."""
        k = self._native_plan(key)
        if k is not None:
            return self.plan(k, before)
        after = torch.cat([m.select(m.layer.weight.detach()) for m in self.members])
        return after, None if before is None else after - before

    def _native_plan(self, key: tuple | None) -> Any:
        """The native kernel with this group's gather plan ready, or None where the torch ops serve (a GPU, another
        dtype, a non-contiguous weight, ``quant.kernel=eager``, no kernel built)."""
        k = native.serving(self.members[0].layer.weight_q.call_kernel)
        if k is None:
            return None
        ptrs = tuple(p for _, p in (key if key is not None else self.weights_key()))
        if ptrs != self.plan_ptrs:
            weights = [m.layer.weight.detach() for m in self.members]
            ok = all(native.native_contiguous(w) for w in weights)
            self.plan = native.GatherPlan(weights, [m.index for m in self.members]) if ok else None
            self.plan_ptrs = ptrs
        return k if self.plan is not None else None

    def weights_key(self) -> tuple:
        """What changes when a weight is written in place (its version counter) or replaced (its storage)."""
        return tuple((m.layer.weight._version, m.layer.weight.data_ptr()) for m in self.members)

    def scales(self) -> torch.Tensor:
        """Each tracked weight's scale: one scale per tensor spread over its weights in one op (the common case),
        else tensor by tensor (channel and block scaling)."""
        if self.ones_count != changes.STRUCTURE[0]:  # a buffer replaced or a spec changed moves the count
            self.ones, self.ones_count = [m.one_scale() for m in self.members], changes.STRUCTURE[0]
        ones = self.ones
        self.scale_kept = False
        if all(s is not None for s in ones):
            per_tensor = torch.stack(ones).to(self.sizes.device, torch.float32)  # one op for every tensor's scale
            if per_tensor.device.type == "cpu":  # (the comparison reads the values: a host sync on a GPU)
                bits = per_tensor.view(torch.int32)
                if self.kept_scales is not None and torch.equal(bits, self.kept_scales):
                    self.scale_kept = True  # scales move rarely (powers of two): the last spread is this one
                    return self.kept_scale
                self.kept_scales = bits.clone()
            # each weight's tensor number picks its scale: repeat_interleave(per_tensor, sizes)'s values,
            # without the output size it needs from the device (a host sync per step on a GPU)
            self.kept_scale = torch.index_select(per_tensor, 0, self.segments)
            return self.kept_scale
        self.kept_scales = self.kept_scale = None
        return torch.cat([m.scale(m.layer.weight.detach()) for m in self.members])


class FlipCallback(Instrument):
    """Logs ``flips/<layer>/weight/{flip_rate,stall_ratio,oscillation_rate,descent_cos}`` every interval."""

    group = "flips"
    run_state = ("_all_stall", "_all_flip", "_all_osc", "_all_cos", "osc_steps")

    def __init__(self, every_n_steps: int = 10, oscillation_momentum: float = 0.01,
                 max_weights_per_tensor: int | None = None, seed: int = 0) -> None:
        super().__init__(every_n_steps)
        if not 0.0 < oscillation_momentum <= 1.0:
            raise ValueError(f"oscillation_momentum={oscillation_momentum} is not valid; valid: 0 < m <= 1")
        if max_weights_per_tensor is not None and int(max_weights_per_tensor) < 1:
            raise ValueError(f"max_weights_per_tensor={max_weights_per_tensor} is not valid; "
                             "valid: null (every weight) or an integer >= 1")
        self.momentum = float(oscillation_momentum)
        self.max_weights = None if max_weights_per_tensor is None else int(max_weights_per_tensor)
        self.seed = int(seed)
        self.groups: list[_Group] = []
        self.osc_steps = 0
        self._restored: dict[str, Any] = {}  # per-layer history from a checkpoint, applied once the groups exist
        self._hooks: list[Any] = []
        self._pending = False
        self._seen_count = -1  # changes.STRUCTURE when _stale last found every format as grouped
        self.latest: dict[str, dict[str, float]] = {}  # layer → last logged metrics (read by FallbackCallback)
        self._all_stall: list[float] = []
        self._all_flip: list[float] = []
        self._all_osc: list[float] = []
        self._all_cos: list[float] = []

    @property
    def tracked(self) -> list[_Tracked]:
        return [m for g in self.groups for m in g.members]

    # -- set-up --------------------------------------------------------------------------------------------------
    def _sample(self, name: str, w: torch.Tensor) -> torch.Tensor | None:
        """A fixed sorted sample of flat indices, from a private generator (the training RNG is not touched)."""
        if self.max_weights is None or w.numel() <= self.max_weights:
            return None
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + sum(map(ord, name)))
        return torch.randperm(w.numel(), generator=g)[: self.max_weights].sort().values.to(w.device)

    def _build_groups(self, pl_module: L.LightningModule) -> None:
        by_key: dict[Any, list[_Tracked]] = {}
        for name, ql in quantized_weights(backbone(pl_module)):
            spec = ql.weight_q.spec
            key = (spec.format, spec.overflow, ql.weight.device)
            by_key.setdefault(key, []).append(_Tracked(name, ql, self._sample(name, ql.weight)))
        self.groups = []
        for key, members in by_key.items():
            device = key[2]
            sizes = torch.tensor([m.size for m in members], device=device)
            n = len(members)
            self.groups.append(_Group(
                members=members, spec_key=key,
                pow2=all(m.layer.weight_q.spec.scaling.powers_of_two for m in members),
                segments=torch.repeat_interleave(torch.arange(n, device=device), sizes),
                starts=torch.cat([sizes.new_zeros(1), sizes.cumsum(0)]).cpu(),
                sizes=sizes.float(),
                last_direction=torch.zeros(int(sizes.sum()), dtype=torch.int8, device=device),
                acc=torch.zeros(n, 5, dtype=torch.float32, device=device),
                osc_ema=torch.zeros(n, dtype=torch.float32, device=device)))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._build_groups(pl_module)
        restored, self._restored = self._restored, {}
        if restored:  # a resumed run: each layer's flip history, interval counts and oscillation EMA as saved
            self._apply_history(restored)
        for opt in trainer.optimizers:
            self._hooks.append(opt.register_step_post_hook(self._after_optimizer_step))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _stale(self) -> bool:
        """True when a layer's weight format changed (e.g. a format fallback) since the groups were built; looked at
        only when a quantizer changed since the last look (a new spec moves changes.STRUCTURE)."""
        if self._seen_count == changes.STRUCTURE[0]:
            return False
        stale = any(g.spec_key[:2] != (m.layer.weight_q.spec.format, m.layer.weight_q.spec.overflow)
                    for g in self.groups for m in g.members)
        self._seen_count = -1 if stale else changes.STRUCTURE[0]
        return stale

    # -- per step ------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if trainer.sanity_checking:
            return
        if self._stale():
            self._regroup(pl_module)
        for g in self.groups:
            # nothing writes the weights between a step's end (storage policy applied) and the next optimizer step,
            # so the weights read then are this step's "before" (a group rebuilt after a format change has none)
            g.before = g.after if g.after is not None else g.gather()
            g.scale = g.scales()
            # the same weights on the same grid as the last step's q_after: quantizing them again gives its values
            g.q_before = g.q_after if g.after is not None and g.scale_kept else None
            g.after = g.q_after = None
            g.intended = g.stepped = g.stepped_key = None
        self._pending = True

    def _history(self) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Each layer's flip directions, interval accumulators and oscillation EMA."""
        history = {}
        for g in self.groups:
            g.fold(self.momentum)
            for i, m in enumerate(g.members):
                start = int(g.sizes[:i].sum())
                history[m.name] = (g.last_direction[start:start + int(g.sizes[i])], g.acc[i], g.osc_ema[i])
        return history

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["layers"] = {name: [t.detach().cpu().clone() for t in h] for name, h in self._history().items()}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._restored = dict(state_dict.get("layers", {}))

    def _regroup(self, pl_module: L.LightningModule) -> None:
        """Rebuild the groups after a format change, keeping each layer's flip history and accumulators."""
        history = self._history()
        self._build_groups(pl_module)
        self._apply_history(history)

    def _apply_history(self, history: dict[str, Any]) -> None:
        for g in self.groups:
            offset = 0
            for i, m in enumerate(g.members):
                if m.name in history and history[m.name][0].numel() == m.size:
                    direction, acc, osc = history[m.name]
                    g.last_direction[offset:offset + m.size] = direction
                    g.acc[i], g.osc_ema[i] = acc, osc
                offset += m.size

    @torch.no_grad()
    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._pending:
            return
        for g in self.groups:
            if g.before is not None and g.intended is None:
                g.stepped_key = g.weights_key()
                g.stepped, g.intended = g.gather_less(g.before, g.stepped_key)

    @torch.no_grad()
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._pending:
            return
        self._pending = False
        for g in self.groups:
            if g.before is None:
                continue
            # the weights as read after the optimizer step, unless something wrote them since (the storage policy);
            # a write through ``.data`` keeps the version counter and goes unseen: nothing here writes that way
            key = g.weights_key()
            unchanged = g.stepped is not None and g.stepped_key == key
            after = g.stepped if unchanged else g.gather(key)
            g.stepped = g.stepped_key = None
            intended = g.intended if g.intended is not None else after - g.before  # no post-hook ran
            fmt, overflow, _ = g.spec_key
            kernel = g.members[0].layer.weight_q.call_kernel  # the road quant.kernel resolved for these weights
            q_before = g.q_before
            if q_before is None:
                q_before = quantize_scaled(g.before, fmt, g.scale, "nearest", overflow, kernel=kernel,
                                           scale_pow2=g.pow2)
            q_after = quantize_scaled(after, fmt, g.scale, "nearest", overflow, kernel=kernel, scale_pow2=g.pow2)
            k = native.serving(kernel)
            if k is not None and all(native.takes(t) for t in (q_before, q_after, intended)):
                # the native kernel: the eager function's sums (same order, float32), no per-process compile; the
                # cosine stays torch's (its float32 sqrt is not the correctly rounded one a C++ sqrtf gives), taken
                # with the accumulators' updates for all the steps since the last read (``fold``)
                sums, g.last_direction = native.flip_sums(k, q_before, q_after, intended, g.last_direction, g.starts)
                g.unfolded.append(sums)
                if len(g.unfolded) >= FOLD_AT:
                    g.fold(self.momentum)
            else:
                counts, g.last_direction = _fused_counts(q_before, q_after, intended, g.last_direction, g.segments,
                                                         len(g.members), compiled=kernel != "eager")
                g.fold(self.momentum)  # the steps before this one first
                g.acc += torch.cat([counts, counts.new_ones(counts.shape[0], 1)], dim=1)
                g.osc_ema = ema_update(g.osc_ema, counts[:, 2] / g.sizes, self.momentum)
            g.before = g.intended = g.scale = g.q_before = None
            g.after, g.q_after = after, q_after
        self.osc_steps += 1
        if self._due:
            self._log(trainer, pl_module)

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.groups:
            return
        for g in self.groups:
            g.fold(self.momentum)
        # one host transfer: [flips, updated, reversals, descent_cos sum, steps, oscillation EMA] per tensor
        host = torch.cat([torch.cat([g.acc, g.osc_ema.unsqueeze(1)], dim=1) for g in self.groups]).cpu().tolist()
        for g in self.groups:
            g.acc.zero_()
        metrics: dict[str, float] = {}
        flip_rates: list[float] = []
        for m, (flips, updated, _, cos_sum, steps, osc) in zip(self.tracked, host):
            if steps == 0:
                continue
            values = {
                "flip_rate": flips / (m.size * steps),
                "stall_ratio": stall_ratio(flips, updated),
                "oscillation_rate": ema_debiased(osc, self.momentum, self.osc_steps),
                "descent_cos": cos_sum / steps,
            }
            metrics.update({metric_name(self.group, m.name, "weight", k): v for k, v in values.items()})
            self.latest[m.name] = values
            flip_rates.append(values["flip_rate"])
            self._all_stall.append(values["stall_ratio"])
            self._all_flip.append(values["flip_rate"])
            self._all_osc.append(values["oscillation_rate"])
            self._all_cos.append(values["descent_cos"])
        self.log_scalars(trainer, metrics)
        self.summarize(pl_module,
                       mean_stall_ratio=mean(self._all_stall),
                       final_flip_rate=mean(flip_rates),
                       mean_flip_rate=mean(self._all_flip),
                       mean_oscillation_rate=mean(self._all_osc),
                       mean_descent_cos=mean(self._all_cos))

"""Format utilization, bit positions and the stiffness field of every quantized weight.

At each interval, before the optimizer step (weights and gradients of the same step):
- ``bits/<layer>/weight/effective_bits``: Shannon entropy (bits) of the histogram of grid codes the tensor uses,
  out of the format's width; the histogram itself goes to W&B (``.../codes``);
- ``bits/<layer>/weight/log2_stiffness_{mean,std,min,max}``: the distribution of log2 S, S = ulp(w·s)/s as the
  ULP-aware optimizers compute it (histogram to W&B), and ``grad_stiffness_corr`` = Pearson corr(|g|, S);
- code-index trajectories: a fixed random sample of ``samples_per_tensor`` weights per tensor, their grid index
  (the latent integer state) at every interval, sent to W&B as the table ``bits/code_trajectories`` at the end
  (and written to ``csv_path`` when set).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import lightning as L
import torch

from altgrad.atomic import write_with
from altgrad.callbacks.base import Instrument, backbone, mean, metric_name, quantized_weights, to_floats
from altgrad.diagnostics import code_index, entropy_bits, log2_stiffness, pearson
from altgrad.diagnostics.flip_counts import top_rank
from altgrad.quant import native, quantize

TRAJECTORY_COLUMNS = ["step", "layer", "sample", "element", "code_index", "value"]
PASS_ELEMENTS = 2**24
"""The most weights one elementwise pass of a bits step lays end to end (≈ 30 bytes of temporaries each)."""


class BitsCallback(Instrument):
    """Effective bits, stiffness field and sampled code trajectories of each quantized weight."""

    group = "bits"
    run_state = ("_bits", "_final_bits")

    def __init__(self, every_n_steps: int = 50, samples_per_tensor: int = 16, seed: int = 0,
                 histograms: bool = True, csv_path: str | None = None) -> None:
        super().__init__(every_n_steps)
        if int(samples_per_tensor) < 0:
            raise ValueError(f"samples_per_tensor={samples_per_tensor} is not valid; valid: integer >= 0")
        self.samples_per_tensor = int(samples_per_tensor)
        self.seed = int(seed)
        self.histograms = histograms
        self.csv_path = csv_path
        self._samples: dict[str, torch.Tensor] = {}
        self._sizes: dict[Any, int] = {}
        self._offset_cache: dict[tuple, torch.Tensor] = {}
        self.trajectories: list[list[Any]] = []
        self._bits: list[float] = []
        self._final_bits: list[float] = []
        self._pending: tuple[dict[str, torch.Tensor], dict[str, Any], list[Any]] | None = None

    def _offsets(self, sizes: list[int], size: int, device: torch.device) -> torch.Tensor:
        """Each weight's first histogram bin when tensors of ``sizes`` lie end to end, tensor k's codes in bins
        [k·size, (k+1)·size) (int32; built once per layout: the sizes repeat every bits step)."""
        key = (tuple(sizes), size, device)
        if key not in self._offset_cache:
            self._offset_cache[key] = torch.repeat_interleave(
                torch.arange(0, len(sizes) * size, size, dtype=torch.int32, device=device),
                torch.tensor(sizes, device=device), output_size=sum(sizes))
        return self._offset_cache[key]

    def _grid_size(self, fmt: Any) -> int:
        """Number of finite values of the format (cached: values() enumerates every code)."""
        if fmt not in self._sizes:
            self._sizes[fmt] = fmt.values().numel()
        return self._sizes[fmt]

    def _sample(self, name: str, w: torch.Tensor) -> torch.Tensor:
        """Fixed element indices per tensor, drawn from a private generator (the training RNG is not touched)."""
        if name not in self._samples:
            g = torch.Generator().manual_seed(self.seed + sum(map(ord, name)))
            k = min(self.samples_per_tensor, w.numel())
            self._samples[name] = torch.randperm(w.numel(), generator=g)[:k].sort().values.to(w.device)
        return self._samples[name]

    @torch.no_grad()
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if not self._due:
            return
        step = trainer.global_step + 1
        layers = quantized_weights(backbone(pl_module))
        # the elementwise work (rounding, grid index, stiffness) runs once per format over every tensor of that
        # format laid end to end, each weight with its own tensor's scale: the same values as tensor by tensor, in
        # a few kernels instead of a few hundred; per-tensor reductions then read their tensor's slice
        groups: dict[Any, list[int]] = {}
        for i, (_, ql) in enumerate(layers):
            spec = ql.weight_q.spec
            groups.setdefault((spec.format, spec.overflow, ql.weight.device), []).append(i)
        per_layer: list[tuple[Any, ...]] = [()] * len(layers)
        # a part holds at most PASS_ELEMENTS weights (or one larger tensor): the pass's temporaries stay bounded
        parts = [(key, part) for key, members in groups.items()
                 for part in _parts(members, [layers[i][1].weight.numel() for i in members], PASS_ELEMENTS)]
        for (fmt, overflow, _), members in parts:
            ws = [layers[i][1].weight.detach() for i in members]
            scales = [forward_scale(layers[i][1].weight_q, w) for i, w in zip(members, ws)]
            w_all = torch.cat([w.reshape(-1) for w in ws])
            s_all = torch.cat([torch.broadcast_to(s, w.shape).reshape(-1) for s, w in zip(scales, ws)])
            q_all = quantize(w_all.float() * s_all, fmt, overflow=overflow)  # on the grid, unscaled
            pow2 = all(layers[i][1].weight_q.spec.scaling.powers_of_two for i in members)
            idx_all, log2s_all = _index_and_stiffness(w_all, s_all, q_all, fmt, pow2,
                                                      layers[members[0]][1].weight_q.call_kernel)
            size = self._grid_size(fmt)
            sizes = [w.numel() for w in ws]
            # one histogram for the whole group: tensor k's codes counted in bins [k·size, (k+1)·size); an index
            # off the grid (a non-finite weight) goes to one spare bin past the end, dropped as before
            bins = len(ws) * size
            offset = self._offsets(sizes, size, w_all.device)
            on_grid = (idx_all >= 0) & (idx_all < size)
            slot = torch.where(on_grid, idx_all + offset, bins)
            counts_all = torch.bincount(slot, minlength=bins + 1)[:bins].view(len(ws), size)
            grads = [layers[i][1].weight.grad for i in members]
            stiff_all = torch.exp2(log2s_all) if any(g is not None for g in grads) else None
            start = 0
            for k, (i, n) in enumerate(zip(members, sizes)):
                part = slice(start, start + n)
                per_layer[i] = (fmt, size, counts_all[k], log2s_all[part], q_all[part], s_all[part], idx_all[part],
                                None if grads[k] is None or stiff_all is None else (grads[k], stiff_all[part]))
                start += n
        values: dict[str, torch.Tensor] = {}
        hists: dict[str, Any] = {}
        traj: list[Any] = []
        for (name, ql), (fmt, size, counts, log2s, q, s, idx, grad) in zip(layers, per_layer):
            values[metric_name(self.group, name, "weight", "effective_bits")] = entropy_bits(counts)
            for stat, v in (("mean", log2s.mean()), ("std", log2s.std()), ("min", log2s.min()),
                            ("max", log2s.max())):
                values[metric_name(self.group, name, "weight", f"log2_stiffness_{stat}")] = v
            if grad is not None:
                values[metric_name(self.group, name, "weight", "grad_stiffness_corr")] = pearson(grad[0].abs(),
                                                                                               grad[1])
            if self.histograms:
                hists[metric_name(self.group, name, "weight", "codes")] = (counts, size)
                hists[metric_name(self.group, name, "weight", "log2_stiffness")] = log2s
            if self.samples_per_tensor:
                sample = self._sample(name, ql.weight)
                traj.append((step, name, sample, idx[sample].long(), q[sample] / s[sample]))
        self._pending = (values, hists, traj)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._pending is None:
            return
        values, hists, traj = self._pending
        self._pending = None
        metrics = to_floats(values)
        self.log_scalars(trainer, metrics)
        bits = [v for k, v in metrics.items() if k.endswith("/effective_bits")]
        self._bits.extend(bits)
        self._final_bits = bits
        self.summarize(pl_module, mean_effective_bits=mean(self._bits), final_effective_bits=mean(self._final_bits))
        for step, name, sample, sidx, value in traj:
            for j, (element, code, v) in enumerate(zip(sample.tolist(), sidx.tolist(), value.tolist())):
                self.trajectories.append([step, name, j, element, code, v])
        if hists and self.wandb_logger(trainer) is not None:
            self.log_histograms(trainer, np_histograms(hists))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.log_table(trainer, "bits/code_trajectories", TRAJECTORY_COLUMNS, self.trajectories)
        if self.csv_path and self.trajectories and trainer.is_global_zero:
            path = Path(self.csv_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_with(path, self._write_trajectories)

    def _write_trajectories(self, path: Path) -> None:
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(TRAJECTORY_COLUMNS)
            writer.writerows(self.trajectories)


def np_histograms(hists: dict[str, Any]) -> dict[str, tuple[list[float], list[float]]]:
    """(counts, edges) for W&B per entry: code counts ``(counts, n)`` over integer bins, or 64 bins between the least
    and the greatest finite value of a tensor (one bin [v, v + 1] when they are equal; [0, 1] with no finite value).
    The values cross to the host in three transfers for the whole dict (ranges, bin counts, code counts; a fourth
    where a field holds NaN or ±inf), not a few per tensor: each transfer waits for a GPU."""
    codes = {k: v for k, v in hists.items() if isinstance(v, tuple)}
    fields = {k: v.detach().float().reshape(-1) for k, v in hists.items() if not isinstance(v, tuple)}
    out: dict[str, tuple[list[float], list[float]]] = {}
    if fields:
        # the least and greatest values, in one pass each (aminmax); where both are finite the field holds no NaN
        # (it would propagate) and no ±inf, so they are its finite values' ends; fields where they are not are read
        # again with the non-finite values masked (a second transfer, only then)
        host = torch.stack([torch.stack(torch.aminmax(x)) for x in fields.values()]).cpu().tolist()
        bad = [i for i, (lo, hi) in enumerate(host) if not (math.isfinite(lo) and math.isfinite(hi))]
        if bad:
            inf = float("inf")
            xs = list(fields.values())
            masked = torch.stack([torch.stack([torch.where(torch.isfinite(xs[i]), xs[i], inf).amin(),
                                               torch.where(torch.isfinite(xs[i]), xs[i], -inf).amax()])
                                  for i in bad]).cpu().tolist()
            for i, ends in zip(bad, masked):
                host[i] = ends
        # each field's bin range: [lo, hi] of its finite values, [v, v + 1] for one value, None for none
        spans = [None if lo > hi else (lo, hi if hi > lo else lo + 1.0) for lo, hi in host]
        # histc leaves out NaN and whatever lies outside [lo, hi] (±inf here): the finite values' counts
        binned = [torch.histc(x, bins=64, min=span[0], max=span[1]) for x, span in zip(fields.values(), spans)
                  if span is not None]
        rows = iter(torch.stack(binned).cpu().tolist() if binned else [])
        for name, span in zip(fields, spans):
            out[name] = ([0.0], [0.0, 1.0]) if span is None else (next(rows), torch.linspace(*span, 65).tolist())
    if codes:
        host = torch.cat([c.reshape(-1) for c, _ in codes.values()]).cpu().float().tolist()
        start = 0
        for name, (c, n) in codes.items():
            out[name] = (host[start:start + c.numel()], [i - 0.5 for i in range(n + 1)])
            start += c.numel()
    return {k: out[k] for k in hists}


def forward_scale(q: Any, w: torch.Tensor) -> torch.Tensor:
    """The scale ``q.scale_for(w)`` gives (float32), read from the scaler where it is that value without a pass over
    ``w``: a tensor scaler keeps the scale of its last training call, and between the forward and the optimizer step
    the weights it was computed from have not changed (its fallback for a 0/Inf/NaN amax, the scale it kept, is the
    same both ways). Other kinds (delayed: the scale of the history, not of ``w`` alone) compute it."""
    if q.spec.scaling.kind == "tensor" and q.training:
        return q.scaler.scale.detach().float()
    return q.scale_for(w).detach().float()


def _index_and_stiffness(w: torch.Tensor, s: torch.Tensor, q: torch.Tensor, fmt: Any, pow2: bool, kernel: str
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(code_index(q), log2_stiffness(w, s)): one native pass where every scale is a power of two and the kernel
    serves these float32 CPU weights (``quant.kernel`` auto or native), else torch's ops; the same values."""
    k = native.serving(kernel) if pow2 and all(native.takes(t) for t in (w, s, q)) else None
    if k is not None:
        return native.bits_pass(k, w, s, q, fmt, top_rank(fmt))
    return code_index(q, fmt), log2_stiffness(w, fmt, s)


def _parts(members: list[int], sizes: list[int], limit: int) -> list[list[int]]:
    """``members`` in order, cut into runs whose sizes sum to at most ``limit`` (a larger member alone)."""
    parts: list[list[int]] = []
    total = 0
    for member, size in zip(members, sizes):
        if parts and total + size <= limit:
            parts[-1].append(member)
            total += size
        else:
            parts.append([member])
            total = size
    return parts

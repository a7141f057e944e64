"""AltGradModule: next-token training of the GPT backbone — loss, validation perplexity, optimizer and LR schedule.

The backbone lives at `self.model` (a `GPT`); quantization callbacks swap its Linears in `setup`, before
`configure_model` compiles it and before `configure_optimizers` sees its parameters. Callbacks report into
`self.run_summary`, which `train()` merges into summary.json.
"""

from __future__ import annotations

import gc
import math
import os
import random
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.plugins.precision import Precision
import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import LambdaLR
from torchmetrics import MeanMetric

from altgrad.grad_norm import StepGradNorm, optimizer_params, step_grads
from altgrad.model import GPT, GPTConfig
from altgrad.optim import build_optimizer


def process_start_unix() -> float | None:
    """When this process started (Unix time, 10 ms resolution) from /proc; None where there is no /proc (not Linux).

    A job's warm-up counts from here: interpreter start-up and imports are part of what a job pays."""
    try:
        stat = Path("/proc/self/stat").read_text()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        ticks = float(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime (fields 3.. follow the ")")
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return None


class JobClock:
    """Where a job's time goes, in wall seconds: start-up (process start → fit start), warm-up (process start →
    first optimizer step done), the first step alone (compiles), steps, validation, and fit end; plus the steady
    throughput over the second half of the steps (after the compiles and the first intervals' one-off work), how
    those steps' times spread (a mean moved by a few slow steps, or every step slower), and the time Python's
    garbage collector paused the process during fit.

    Unix times from the process's own clock, so a bench can add what it sees outside (its launch, the exit)."""

    def __init__(self) -> None:
        self.process_start = process_start_unix()
        self.fit_start: float | None = None
        self.first_step_done: float | None = None
        self.first_step_seconds: float | None = None
        self.validation_seconds = 0.0
        self.steps: list[tuple[float, int]] = []  # (seconds, tokens) of every step of this process
        self.validation_started: float | None = None
        self.gc_seconds = 0.0
        self.gc_collections = [0, 0, 0]  # per generation
        self._gc_started: float | None = None
        self.step_gc: list[float] = []  # GC seconds within each step of ``steps`` (where recorded by ``step_done``)
        self._gc_at_step = 0.0

    def step_done(self, seconds: float, tokens: int) -> None:
        """Record a step: its wall seconds, its tokens, and the GC pauses since the previous one."""
        self.steps.append((seconds, tokens))
        self.step_gc.append(self.gc_seconds - self._gc_at_step)
        self._gc_at_step = self.gc_seconds

    def steady_gc_seconds(self) -> float | None:
        """GC pauses within the second half's steps (None where steps were not recorded with ``step_done``)."""
        if len(self.step_gc) != len(self.steps) or len(self.steps) < 2:
            return None
        return sum(self.step_gc[len(self.steps) // 2:])

    def gc_phase(self, phase: str, info: Mapping[str, Any]) -> None:
        """A ``gc.callbacks`` entry: adds each collection's pause to ``gc_seconds``."""
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            self.gc_seconds += time.perf_counter() - self._gc_started
            self.gc_collections[int(info.get("generation", 0))] += 1
            self._gc_started = None

    def steady_step_seconds(self) -> dict[str, float] | None:
        """Median, 90th percentile and maximum of the second half's step times (None with fewer than 2 steps)."""
        if len(self.steps) < 2:
            return None
        half = sorted(s for s, _ in self.steps[len(self.steps) // 2:])
        return {"median": statistics.median(half), "p90": half[min(len(half) - 1, math.ceil(0.9 * len(half)) - 1)],
                "max": half[-1]}

    def steady_tokens_per_second(self) -> float | None:
        """Tokens / seconds over the second half of this process's steps (None with fewer than 2 steps)."""
        half = self.steps[len(self.steps) // 2:]
        seconds = sum(s for s, _ in half)
        return sum(n for _, n in half) / seconds if len(self.steps) >= 2 and seconds > 0 else None

    def summary(self, fit_end: float) -> dict[str, float | None]:
        """The ``timing`` entry of summary.json (seconds; ``*_unix``: Unix times)."""
        t0 = self.process_start

        def since_start(t: float | None) -> float | None:
            return None if t is None or t0 is None else t - t0

        return {"process_start_unix": t0, "first_step_unix": self.first_step_done, "fit_end_unix": fit_end,
                "startup_seconds": since_start(self.fit_start),
                "warmup_seconds": since_start(self.first_step_done),
                "first_step_seconds": self.first_step_seconds,
                "steps_seconds": sum(s for s, _ in self.steps),
                "validation_seconds": self.validation_seconds,
                "fit_end_seconds": since_start(fit_end),
                "steady_tokens_per_second": self.steady_tokens_per_second(),
                "steady_step_seconds": self.steady_step_seconds(),
                "gc_seconds": self.gc_seconds, "gc_collections": list(self.gc_collections),
                "steady_gc_seconds": self.steady_gc_seconds()}


class WarmupCosine:
    """nanoGPT's schedule as an LR multiplier: linear warm-up, cosine decay to min_ratio, then flat.

    A plain class (not a closure) so the scheduler's state_dict holds only numbers.
    """

    def __init__(self, warmup_steps: int, decay_steps: int, min_ratio: float) -> None:
        self.warmup_steps, self.decay_steps, self.min_ratio = int(warmup_steps), int(decay_steps), float(min_ratio)

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        if step >= self.decay_steps:
            return self.min_ratio
        progress = (step - self.warmup_steps) / max(1, self.decay_steps - self.warmup_steps)
        return self.min_ratio + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - self.min_ratio)


class AltGradModule(L.LightningModule):
    """Cross-entropy language modelling on `self.model`, with val loss/perplexity and throughput logging."""

    def __init__(
        self,
        model_config: GPTConfig,
        optimizer: Mapping[str, Any],
        schedule: WarmupCosine,
        compile: bool = False,
        peak_flops: float | None = None,
        compile_mode: str = "default",
    ) -> None:
        super().__init__()
        self.model = GPT(model_config)
        self.optimizer_cfg = dict(optimizer)
        self.schedule = schedule
        self.compile_model = compile
        self.compile_mode = compile_mode
        self.peak_flops = peak_flops
        self.val_loss = MeanMetric(nan_strategy="disable")  # a NaN loss must show, not be dropped
        self.run_summary: dict[str, Any] = {"diagnostics": {}, "fallbacks": []}
        self.tokens_seen = 0
        self.train_seconds = 0.0
        self._clock: float | None = None
        self.job_clock = JobClock()
        self._rng_to_restore: dict[str, Any] | None = None
        self.grad_norm = StepGradNorm()  # the divergence check's norm of this step, reused by clipping

    # -- model ------------------------------------------------------------------------------------------------------
    def configure_model(self) -> None:
        # Lightning calls this after every callback's setup (so after Linear → QuantLinear surgery).
        # nn.Module.compile compiles in place: parameter names and module paths stay as in the plain model.
        if self.compile_model and getattr(self.model, "_compiled_call_impl", None) is None:
            self.model.compile(mode=None if self.compile_mode == "default" else self.compile_mode)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        logits = self.model(x)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))

    # -- training ---------------------------------------------------------------------------------------------------
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        if self._logs_now():
            self.log("train/loss", loss, prog_bar=True)
            self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def _logs_now(self) -> bool:
        """Whether Lightning writes this batch's step metrics to the loggers (every ``trainer.log_every_n_steps``).
        The per-step values are handed to ``self.log`` only then: each call costs ≈ 1 ms of Lightning bookkeeping,
        a few % of a small CPU step, and between logging steps the loggers would drop them anyway (the progress bar
        refreshes at the same interval by default)."""
        trainer = self._trainer
        if trainer is None:
            return True
        return bool(trainer._logger_connector.should_update_logs)

    def on_fit_start(self) -> None:
        self.job_clock.fit_start = time.time()
        # one clock listens at a time (a fit that raised never reached on_fit_end to remove its own)
        gc.callbacks[:] = [c for c in gc.callbacks if not isinstance(getattr(c, "__self__", None), JobClock)]
        gc.callbacks.append(self.job_clock.gc_phase)

    def on_train_start(self) -> None:
        self._restore_rng()
        self._clock = time.perf_counter()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        tokens = batch[0].numel()
        if self._clock is not None:
            dt = now - self._clock
            self.train_seconds += dt
            self.tokens_seen += tokens
            clock = self.job_clock
            if clock.first_step_done is None:
                clock.first_step_done, clock.first_step_seconds = time.time(), dt
            clock.step_done(dt, tokens)
            if self._logs_now():
                self.log("train/tokens_per_s", tokens / dt, prog_bar=True)
                if self.peak_flops:
                    self.log("train/mfu", self.model.estimate_mfu(tokens / dt, self.peak_flops))
        self._clock = now

    def on_train_end(self) -> None:
        tps = self.tokens_seen / self.train_seconds if self.train_seconds > 0 else None
        self.run_summary["tokens_per_second"] = tps
        self.run_summary["tokens_seen"] = self.tokens_seen
        if tps is not None and self.peak_flops:
            self.run_summary["mfu"] = self.model.estimate_mfu(tps, self.peak_flops)

    def on_fit_end(self) -> None:
        if self.job_clock.gc_phase in gc.callbacks:
            gc.callbacks.remove(self.job_clock.gc_phase)
        timing = self.job_clock.summary(fit_end=time.time())
        self.run_summary["timing"] = timing
        steady = timing["steady_tokens_per_second"]
        if steady is not None and self.peak_flops:
            # `mfu` averages over every step (compiles included); this one is the steady second half's
            self.run_summary["steady_mfu"] = self.model.estimate_mfu(steady, self.peak_flops)

    # -- validation -------------------------------------------------------------------------------------------------
    def on_validation_start(self) -> None:
        self.job_clock.validation_started = time.perf_counter()

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.val_loss.update(self.loss(batch))

    def on_validation_epoch_end(self) -> None:
        loss = self.val_loss.compute()
        self.val_loss.reset()
        value = float(loss)
        ppl = math.exp(value) if value < 700 else math.inf
        if self.trainer.sanity_checking:
            # The pre-training pass over the full validation set: the starting loss (≈ ln vocab), logged at step 0.
            if self.trainer.global_step == 0:
                self.run_summary["initial_val_loss"] = value
                for logger in self.loggers:
                    logger.log_metrics({"val/loss": value, "val/ppl": ppl}, step=0)
            return
        self.log("val/loss", loss, prog_bar=True)
        self.log("val/ppl", ppl)
        self.run_summary["final_val_loss"] = value
        self.run_summary["final_val_step"] = int(self.trainer.global_step)
        best = self.run_summary.get("best_val_loss")
        if math.isfinite(value) and (best is None or value < best):
            self.run_summary["best_val_loss"] = value

    def on_validation_end(self) -> None:
        self._clock = time.perf_counter()  # throughput counts training time only
        if self.job_clock.validation_started is not None:
            self.job_clock.validation_seconds += self._clock - self.job_clock.validation_started

    # -- optimization -----------------------------------------------------------------------------------------------
    def configure_optimizers(self) -> dict[str, Any]:
        # altgrad.optim.build_optimizer: nanoGPT's weight-decay groups, each quantized weight told its grid (the
        # forward pass's format and scale), unquantized tensors in a plain AdamW group; what went where is logged.
        optimizer, info = build_optimizer(self.optimizer_cfg, self.model)
        self.run_summary["optimizer_groups"] = {"rule_tensors": len(info["rule_params"]),
                                                "plain_params": info["plain_params"], "plain_lr": info["plain_lr"]}
        scheduler = LambdaLR(optimizer, self.schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Lightning's clipping, with the global norm the divergence check computed this step where it still holds
        (the same bits as ``clip_grad_norm_``: its two halves); otherwise, and for any plugin that clips its own
        way, Lightning's path as is."""
        plugin = self.trainer.precision_plugin
        params = optimizer_params(optimizer)
        norm = self.grad_norm.take(step_grads(params), self.trainer.global_step)
        if (norm is not None and gradient_clip_val is not None and gradient_clip_val > 0
                and (gradient_clip_algorithm or "norm") == "norm"
                and type(plugin).clip_grad_by_norm is Precision.clip_grad_by_norm
                and type(plugin).main_params is Precision.main_params):
            torch.nn.utils.clip_grads_with_norm_(params, gradient_clip_val, norm)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    # -- exact resume -----------------------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Plain containers only (tensors, ints, lists) so the checkpoint loads with torch.load(weights_only=True).
        version, state, gauss = random.getstate()
        checkpoint["rng_states"] = {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "python": [version, list(state), gauss],
        }
        # the diagnostics' run aggregates so far too: a resumed run rewrites only those its callbacks update again
        checkpoint["run_summary"] = {
            k: v for k, v in self.run_summary.items() if k in ("initial_val_loss", "best_val_loss", "diagnostics")
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Applied in on_train_start: Lightning re-seeds the global RNGs after its sanity-check validation.
        self._rng_to_restore = checkpoint.get("rng_states")
        self.run_summary.update(checkpoint.get("run_summary", {}))

    def _restore_rng(self) -> None:
        rng, self._rng_to_restore = self._rng_to_restore, None
        if not rng:
            return
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        version, state, gauss = rng["python"]
        random.setstate((version, tuple(state), gauss))

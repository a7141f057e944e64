"""Where a training step's time goes: torch.profiler over a window of steady steps, every hook a named range.

Add it to any run as a callback (``+callbacks.step_profile._target_=altgrad.bench.step_profile.StepProfile``,
``+callbacks.step_profile.start=100``); it profiles steps [start, start + steps) and writes, in the run dir's
``step-profile/``:

- ``step-profile.json``: wall ms per step (synchronised at both ends), kernel launches, kernels' device-busy ms,
  host syncs and copies per step, and each hook's host (CPU) ms per step;
- ``hooks.txt``: torch's table sorted by CPU total (hooks, compiled graphs, the optimizer step);
- ``host_ops.txt`` / ``kernels.txt``: sorted by self CPU time / self device time (kernels: CUDA runs only).

Compared with ``trainer.profiler=pytorch`` (Lightning's profiler, one table): per-step counts that tell a
host-bound step (launches, syncs) from a device-bound one, and no ProfilerStep bookkeeping inside the window.
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any

import lightning as L
import torch
from torch.profiler import ProfilerActivity, profile, record_function

HOOKS = ("on_train_batch_start", "on_train_batch_end", "on_before_optimizer_step", "on_before_backward",
         "on_after_backward", "on_before_zero_grad")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")
COUNTED = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync",
           "aten::_local_scalar_dense", "aten::nonzero")
"""Per-step counts: host waits for the device (syncs, a scalar read, a data-dependent size) and copies."""


def _ranged(obj: Any, name: str, label: str) -> tuple[Any, str, Any]:
    """Wrap ``obj.name`` (a bound method) in a record_function range called ``label``; returns what ``_unranged``
    needs to undo it."""
    before = obj.__dict__.get(name)
    method = getattr(obj, name)

    @functools.wraps(method)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with record_function(label):
            return method(*args, **kwargs)

    setattr(obj, name, wrapped)
    return obj, name, before


def _unranged(obj: Any, name: str, before: Any) -> None:
    if before is None:
        delattr(obj, name)  # the class's method again
    else:
        setattr(obj, name, before)


class StepProfile(L.Callback):
    """Profiles training steps [start, start + steps) (global steps) and writes the tables above."""

    def __init__(self, start: int = 100, steps: int = 20, out: str | None = None) -> None:
        if start < 1 or steps < 1:
            raise ValueError(f"step_profile start={start}, steps={steps} is not valid; valid: start >= 1 (after "
                             "the first step's compiles), steps >= 1")
        self.start, self.steps, self.out = int(start), int(steps), out
        self._prof: profile | None = None
        self._t0 = 0.0
        self._wrapped: list[tuple[Any, str, Any]] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for cb in trainer.callbacks:
            if cb is self:
                continue
            for hook in HOOKS:  # the hooks a callback class overrides (Callback's own are empty)
                if any(hook in c.__dict__ for c in type(cb).__mro__ if c not in (L.Callback, object)):
                    self._wrapped.append(_ranged(cb, hook, f"hook:{type(cb).__name__}.{hook}"))
        self._wrapped += [_ranged(pl_module, "training_step", "hook:module.training_step (forward)"),
                          _ranged(pl_module, "configure_gradient_clipping", "hook:module.configure_gradient_clipping"),
                          _ranged(trainer.strategy, "backward", "hook:strategy.backward")]

    @staticmethod
    def _sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        step = trainer.global_step
        if step == self.start and self._prof is None:
            activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * torch.cuda.is_available()
            self._sync()
            self._prof = profile(activities=activities)
            self._prof.__enter__()
            self._t0 = time.perf_counter()
        elif step == self.start + self.steps and self._prof is not None:
            self._finish(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._prof is not None:  # the run ended inside the window: what was profiled
            self._finish(trainer)

    def _finish(self, trainer: L.Trainer) -> None:
        self._sync()
        wall = time.perf_counter() - self._t0
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        for wrapped in reversed(self._wrapped):  # the rest of the run without the ranges
            _unranged(*wrapped)
        self._wrapped = []
        steps = max(trainer.global_step - self.start, 1)
        out = self.out or os.path.join(trainer.default_root_dir, "step-profile")
        os.makedirs(out, exist_ok=True)
        summary = profile_summary(prof, steps, wall)
        with open(os.path.join(out, "step-profile.json"), "w") as f:
            json.dump(summary, f, indent=1)
        averages = prof.key_averages()
        tables = {"hooks.txt": "cpu_time_total", "host_ops.txt": "self_cpu_time_total"}
        if torch.cuda.is_available():
            tables["kernels.txt"] = "self_device_time_total"
        for name, key in tables.items():
            with open(os.path.join(out, name), "w") as f:
                f.write(averages.table(sort_by=key, row_limit=70, max_name_column_width=90))
        print("step profile:", json.dumps({k: v for k, v in summary.items() if k != "hooks"}), flush=True)


def profile_summary(prof: profile, steps: int, wall: float) -> dict[str, Any]:
    """Per-step figures of a finished profile over ``steps`` steps that took ``wall`` seconds."""
    events = prof.events()
    on_device = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")
                 and not getattr(e, "is_user_annotation", False)]
    hooks: dict[str, dict[str, float]] = {}
    for e in prof.key_averages():
        # a range shows twice when CUDA is profiled (its host span and its device annotation): keep both sides
        if e.key.startswith("hook:"):
            h = hooks.setdefault(e.key, {"host_ms_per_step": 0.0, "calls_per_step": 0.0})
            h["host_ms_per_step"] = max(h["host_ms_per_step"], e.cpu_time_total / 1e3 / steps)
            h["calls_per_step"] = max(h["calls_per_step"], e.count / steps)
    return {
        "steps": steps,
        "wall_ms_per_step": wall * 1e3 / steps,
        "kernel_launches_per_step": sum(e.name in LAUNCHES for e in events) / steps,
        "kernels_busy_ms_per_step": sum(e.device_time_total for e in on_device) / 1e3 / steps,
        "per_step": {name: sum(e.name == name for e in events) / steps for name in COUNTED},
        "hooks": dict(sorted(hooks.items(), key=lambda kv: -kv[1]["host_ms_per_step"])),
    }

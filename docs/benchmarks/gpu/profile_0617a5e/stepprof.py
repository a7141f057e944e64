"""Where a training step's time goes: torch.profiler over N steady steps, every hook a named range (issue 31)."""
import functools
import json
import os
import time
import lightning as L
import torch
from torch.profiler import ProfilerActivity, profile, record_function

HOOKS = ("on_train_batch_start", "on_train_batch_end", "on_before_optimizer_step", "on_before_backward",
         "on_after_backward", "on_before_zero_grad")


def _wrap(obj, name, label):
    f = getattr(obj, name)

    @functools.wraps(f)
    def g(*a, **k):
        with record_function(label):
            return f(*a, **k)
    setattr(obj, name, g)


class StepProfile(L.Callback):
    def __init__(self, start: int = 200, steps: int = 20, out: str = "/tmp/stepprof") -> None:
        self.start, self.steps, self.out, self.prof = start, steps, out, None

    def on_train_start(self, trainer, pl_module):
        for cb in trainer.callbacks:
            if cb is self:
                continue
            for h in HOOKS:
                if any(h in c.__dict__ for c in type(cb).__mro__ if c not in (L.Callback, object)):
                    _wrap(cb, h, f"hook:{type(cb).__name__}.{h}")
        _wrap(pl_module, "training_step", "hook:module.training_step")
        _wrap(pl_module, "optimizer_step", "hook:module.optimizer_step(all of fwd+bwd+opt)")
        _wrap(pl_module, "configure_gradient_clipping", "hook:module.configure_gradient_clipping")
        _wrap(trainer.strategy, "backward", "hook:strategy.backward")

    def _sync(self):
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step = trainer.global_step
        if step == self.start:
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self._sync()
            self.prof = profile(activities=acts)
            self.prof.__enter__()
            self.t0 = time.perf_counter()
        elif step == self.start + self.steps and self.prof is not None:
            self._sync()
            wall = time.perf_counter() - self.t0
            self.prof.__exit__(None, None, None)
            self._write(wall)
            self.prof = None

    def _write(self, wall):
        os.makedirs(self.out, exist_ok=True)
        n = self.steps
        ka = self.prof.key_averages()
        events = self.prof.events()
        cuda = torch.cuda.is_available()
        dev = [e for e in events if getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA")]
        launches = sum(1 for e in events if e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                                                        "cudaLaunchKernelExC"))
        syncs = {name: sum(1 for e in events if e.name == name) / n for name in (
            "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaEventSynchronize",
            "aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::repeat_interleave")}
        dev_us = sum(e.device_time_total for e in events if e.device_type is not None
                     and str(e.device_type).endswith("CUDA")) if cuda else 0.0
        hooks = {e.key: {"cpu_ms_per_step": e.cpu_time_total / 1e3 / n, "calls_per_step": e.count / n,
                         "device_ms_per_step": getattr(e, "device_time_total", 0.0) / 1e3 / n}
                 for e in ka if e.key.startswith("hook:")}
        summary = {"steps": n, "wall_ms_per_step": wall * 1e3 / n, "kernel_launches_per_step": launches / n,
                   "device_events_per_step": len(dev) / n, "device_busy_ms_per_step": dev_us / 1e3 / n,
                   "per_step_counts": syncs,
                   "hooks": dict(sorted(hooks.items(), key=lambda kv: -kv[1]["cpu_ms_per_step"]))}
        with open(os.path.join(self.out, "stepprof.json"), "w") as f:
            json.dump(summary, f, indent=1)
        with open(os.path.join(self.out, "host_ops.txt"), "w") as f:
            f.write(ka.table(sort_by="self_cpu_time_total", row_limit=70, max_name_column_width=90))
        with open(os.path.join(self.out, "hooks.txt"), "w") as f:
            f.write(ka.table(sort_by="cpu_time_total", row_limit=60, max_name_column_width=90))
        if cuda:
            with open(os.path.join(self.out, "kernels.txt"), "w") as f:
                f.write(ka.table(sort_by="self_device_time_total", row_limit=70, max_name_column_width=90))
        print("stepprof:", json.dumps({k: v for k, v in summary.items() if k != "hooks"}))

"""Helpers of the fault tests: run the real entry point, signal it mid-run, compare runs bit for bit."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

REPO = Path(__file__).resolve().parents[2]

# A model and data small enough that a run is dominated by Python start-up; a fixed decay length, so the lr schedule
# does not depend on max_steps and a run stopped early, resumed and extended matches a straight one.
MODEL = [
    "model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
    "data.batch_size=4", "data.val_batches=2",
    "trainer.val_check_interval=2", "trainer.log_every_n_steps=1", "trainer.sample_tokens=0",
    "trainer.progress_refresh=1", "schedule.warmup_steps=2", "schedule.decay_steps=1000", "logger=csv",
]
TINY = [*MODEL, "data.corpus_chars=200000"]  # the embedded corpus, cut short
PROGRESS = re.compile(r"Epoch 0:.*?\| +(\d+)/")


def run_train(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m altgrad.train ARGS` from the repo root, to the end."""
    return subprocess.run([sys.executable, "-m", "altgrad.train", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def signal_mid_run(args: list[str], env: dict[str, str], signum: int, log: Path, after_steps: int = 3,
                   timeout: float = 300) -> tuple[int, str]:
    """Start a run, send `signum` once the progress bar shows `after_steps` steps, and return (exit code, output)."""
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "altgrad.train", *args], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                steps = [int(m) for m in PROGRESS.findall(log.read_text(errors="replace"))]
                if steps and max(steps) >= after_steps:
                    proc.send_signal(signum)
                    break
                time.sleep(0.1)
            code = proc.wait(timeout=max(deadline - time.monotonic(), 1))
        finally:
            if proc.poll() is None:
                proc.kill()
    return code, log.read_text(errors="replace")


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def metric_rows(run_dir: Path) -> list[dict[str, str]]:
    """metrics.csv rows without throughput columns (wall-clock dependent) and empty cells."""
    with (run_dir / "metrics.csv").open(newline="") as f:
        return [{k: v for k, v in row.items() if v != "" and "tokens_per_s" not in k} for row in csv.DictReader(f)]


SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT, "SIGUSR1": signal.SIGUSR1}
HERE = Path(__file__).resolve().parent


def helper_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with this folder importable, so a run can take `SignalAt` as one of its callbacks."""
    path = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(HERE)) if p)
    return {**env, "PYTHONPATH": path}


def signal_at(hook: str, signum: int, once: Path, step: int | None = None) -> list[str]:
    """Overrides that make a run signal itself (`signum`; 9 is SIGKILL) at a Lightning hook (at `step`), the first
    time only: `once` is created when it fires, so the same command run again goes through."""
    args = ["+callbacks.signal_at._target_=fault_helpers.SignalAt", f"+callbacks.signal_at.hook={hook}",
            f"+callbacks.signal_at.signum={int(signum)}", f"+callbacks.signal_at.once={once}"]
    return args + ([f"+callbacks.signal_at.step={step}"] if step is not None else [])


class SignalAt(L.Callback):
    """Sends its own process a signal where a scheduler's could land: at `hook` (a Lightning callback hook), at
    optimizer step `step` if given; only while the file `once` does not exist (it creates it)."""

    HOOKS = ("on_sanity_check_start", "on_train_start", "on_train_batch_end", "on_validation_start",
             "on_validation_end", "on_train_end")

    def __init__(self, hook: str, signum: int, once: str, step: int | None = None) -> None:
        if hook not in self.HOOKS:
            raise ValueError(f"hook={hook!r}; valid: {', '.join(self.HOOKS)}")
        self.hook, self.signum, self.once, self.step = hook, int(signum), Path(once), step

    def _fire(self, hook: str, trainer: L.Trainer) -> None:
        if hook == self.hook and (self.step is None or trainer.global_step == self.step) and not self.once.exists():
            self.once.write_text(f"{hook} at step {trainer.global_step}\n")
            os.kill(os.getpid(), self.signum)

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fire("on_sanity_check_start", trainer)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fire("on_train_start", trainer)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._fire("on_train_batch_end", trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fire("on_validation_start", trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fire("on_validation_end", trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fire("on_train_end", trainer)

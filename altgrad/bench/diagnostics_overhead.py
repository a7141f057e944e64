"""Cost of the diagnostics: training-step time of the nano model with callbacks=default and =full vs. =none.

    python -m altgrad.bench callbacks [--format e4m3] [--steps 50] [--warmup 5] [--rounds 3] [--threads 1]
                                      [--set KEY=VALUE ...] [--variants none,default,full]

Each variant is built as a run would be (Hydra compose of conf/train.yaml with ``callbacks=<option>``, the same
seed, FakeQuantCallback first, a CSV logger) and trained on random tokens in the same process. Variants alternate
in rounds so drift on a shared machine hits them alike. A step is the interval between consecutive
``on_train_batch_start`` calls, so it includes every hook of the step and, over a window that is a multiple of the
instruments' intervals, their amortised interval work. Two clocks: wall time, and the process's CPU time, which
other processes on a shared machine barely disturb (with one torch thread it is the work done). Targets:
default ≤ 1.05 × none, full ≤ 1.30 × none.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

from altgrad.host_memory import keep_freed_memory

CONF = Path(__file__).resolve().parents[2] / "conf"
TARGETS = {"default": 1.05, "full": 1.30}
FAKE_QUANT = "altgrad.callbacks.fake_quant"


class StepTimer(L.Callback):
    """Records (wall, process CPU) times at every on_train_batch_start and at train end (placed first)."""

    def __init__(self) -> None:
        self.stamps: list[tuple[float, float]] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self.stamps.append((time.perf_counter(), time.process_time()))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.stamps.append((time.perf_counter(), time.process_time()))


HOOKS = ("on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end", "_after_optimizer_step")


class HookClock:
    """Process CPU time spent inside the diagnostics callbacks' per-step hooks, over the timed steps only, in all
    and per callback class.

    The direct cost of the instruments, measured where it is spent (the step-time ratio also carries noise
    from the rest of the machine).
    """

    def __init__(self, timer: StepTimer, warmup: int) -> None:
        self.timer, self.warmup, self.seconds = timer, warmup, 0.0
        self.by_callback: dict[str, float] = {}

    def wrap(self, callback: Any) -> None:
        for name in HOOKS:
            method = getattr(callback, name, None)
            if method is not None and getattr(type(callback), name, None) is not getattr(L.Callback, name, None):
                setattr(callback, name, self._timed(method, type(callback).__name__))

    def _timed(self, method: Any, owner: str) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return method(*args, **kwargs)
            finally:
                if len(self.timer.stamps) > self.warmup:
                    spent = time.process_time() - start
                    self.seconds += spent
                    self.by_callback[owner] = self.by_callback.get(owner, 0.0) + spent

        return timed


def compose(option: str, fmt: str, steps: int, run_dir: Path, extra: tuple[str, ...] = ()) -> Any:
    """The run config for ``callbacks=<option>`` (interpolations such as ${trainer.log_every_n_steps} resolved),
    with ``extra`` overrides (e.g. the small recipe's ``model.block_size=64 data.batch_size=12``)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    overrides = [f"callbacks={option}", f"format={fmt}", f"trainer.max_steps={steps}", "logger=csv",
                 f"paths.output_dir={run_dir}", *extra]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose("train", overrides=overrides)


def build(option: str, fmt: str, steps: int, run_dir: Path, extra: tuple[str, ...] = ()
          ) -> tuple[Any, list[Any], Any]:
    """(module, callbacks, batch size) of one variant, as train() would build them."""
    from altgrad.callbacks.fake_quant import FakeQuantCallback
    from altgrad.config import validate
    from altgrad.train import _instantiate_mapping, build_fake_quant, build_module

    run = validate(compose(option, fmt, steps, run_dir, extra))
    if run.trainer.keep_freed_memory:  # the process's malloc as train() sets it
        keep_freed_memory()
    torch.manual_seed(run.seed)
    module = build_module(run, vocab_size=257)
    callbacks = _instantiate_mapping(run.composed.get("callbacks"))
    if not any(isinstance(c, FakeQuantCallback) for c in callbacks):
        callbacks.insert(0, build_fake_quant(run, run_dir))
    return module, callbacks, run.data.batch_size


def time_variant(option: str, fmt: str, steps: int, warmup: int, work: Path, extra: tuple[str, ...] = ()
                 ) -> tuple[list[tuple[float, float]], HookClock]:
    """Per-step (wall, CPU) seconds after warm-up of one fresh run with ``callbacks=<option>``, and the clock of
    the CPU seconds spent inside the diagnostics hooks over those steps."""
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader, TensorDataset

    run_dir = Path(tempfile.mkdtemp(prefix=f"{option}-", dir=work))
    module, callbacks, batch = build(option, fmt, warmup + steps, run_dir, extra)
    block, vocab = module.model.config.block_size, module.model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, vocab, ((warmup + steps + 1) * batch, block + 1), generator=g)
    loader = DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=batch)
    timer = StepTimer()
    clock = HookClock(timer, warmup)
    for cb in callbacks:
        if type(cb).__module__.startswith("altgrad.callbacks.") and type(cb).__module__ != FAKE_QUANT:
            clock.wrap(cb)
    trainer = L.Trainer(max_steps=warmup + steps, accelerator="auto", devices=1, logger=CSVLogger(str(run_dir)),
                        callbacks=[timer, *callbacks], enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, limit_val_batches=0, log_every_n_steps=10,
                        default_root_dir=str(run_dir))
    trainer.fit(module, train_dataloaders=loader)
    stamps = timer.stamps
    return [(b[0] - a[0], b[1] - a[1]) for a, b in zip(stamps[warmup:-1], stamps[warmup + 1:])], clock


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m altgrad.bench callbacks", description=__doc__.splitlines()[0])
    parser.add_argument("--format", default="e4m3", help="format preset (diagnostics of quantized layers need one)")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per run (a multiple of the intervals)")
    # 11: the warm-up includes the first step at the log interval (10), where the quantizers' statistics are first
    # computed (quant.stats=demand) and their graphs compile; a one-off cost, not a per-step one
    parser.add_argument("--warmup", type=int, default=11)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of every variant")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every variant (repeatable), e.g. model.block_size=64")
    parser.add_argument("--variants", default="none,default,full",
                        help="comma-separated callbacks options, the first the reference (default: none,default,full)")
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants:
        raise SystemExit("error: --variants names no callbacks option; valid: e.g. none,default,full")
    bad = [o for o in args.set if "=" not in o or o.startswith("=")]
    if bad:
        raise SystemExit(f"error: --set {bad[0]!r} is not KEY=VALUE; valid: e.g. --set model.block_size=64")
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        raise SystemExit("error: --steps and --rounds must be >= 1 and --warmup >= 0")
    if args.threads < 0:
        raise SystemExit("error: --threads must be >= 0 (0 = torch's default)")
    if args.threads:
        torch.set_num_threads(args.threads)

    import logging
    import warnings

    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")  # Lightning's advice about workers, loggers, ... (noise in a benchmark)
    warnings.filterwarnings("default", message="altgrad")  # but a kernel falling back to eager must show
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    hooks = {v: 0.0 for v in variants}
    by_callback: dict[str, dict[str, float]] = {v: {} for v in variants}
    with tempfile.TemporaryDirectory(prefix="altgrad-bench-callbacks-") as tmp:
        for r in range(args.rounds):
            for option in variants:
                steps, clock = time_variant(option, args.format, args.steps, args.warmup, Path(tmp),
                                            tuple(args.set))
                times[option].extend(steps)
                hooks[option] += clock.seconds
                for name, seconds in clock.by_callback.items():
                    by_callback[option][name] = by_callback[option].get(name, 0.0) + seconds
            print_table(times, hooks, args, rounds_done=r + 1)
            print_callbacks(times, by_callback)


def print_table(times: dict[str, list[tuple[float, float]]], hooks: dict[str, float], args: argparse.Namespace,
                rounds_done: int) -> None:
    """The ratio table over the rounds measured so far (printed after every round: long runs show progress)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    reference = next(iter(times))
    extra = f", overrides: {' '.join(args.set)}" if args.set else ""
    print(f"\nDiagnostics overhead: nano model, format={args.format}, {rounds_done}/{args.rounds} rounds x "
          f"{args.steps} steps (+{args.warmup} warm-up), device={device}, torch threads={torch.get_num_threads()}"
          f"{extra}")
    print(f"{'callbacks':<10} {'wall ms/step':>13} {'wall ratio':>11} {'CPU ms/step':>12} {'CPU ratio':>10} "
          f"{'in hooks ms/step':>17} {'1 + hooks/' + reference:>15} {'target':>8}")
    wall0 = statistics.fmean(w for w, _ in times[reference])
    cpu0 = statistics.fmean(c for _, c in times[reference])
    for option, samples in times.items():
        wall = statistics.fmean(w for w, _ in samples)
        cpu = statistics.fmean(c for _, c in samples)
        in_hooks = hooks[option] / len(samples)
        target = TARGETS.get(option)
        verdict = "" if target is None else f"<= {target:.2f}"
        print(f"{option:<10} {1000 * wall:>13.1f} {wall / wall0:>11.3f} {1000 * cpu:>12.1f} {cpu / cpu0:>10.3f} "
              f"{1000 * in_hooks:>17.2f} {1 + in_hooks / cpu0:>15.3f} {verdict:>8}", flush=True)


def print_callbacks(times: dict[str, list[tuple[float, float]]], by_callback: dict[str, dict[str, float]]) -> None:
    """CPU ms per timed step inside each callback's hooks, per variant (where it is spent)."""
    for option, spent in by_callback.items():
        if spent and times[option]:
            parts = sorted(spent.items(), key=lambda kv: -kv[1])
            print(f"  {option}: " + ", ".join(f"{name} {1000 * s / len(times[option]):.2f}" for name, s in parts)
                  + " (CPU ms/step in hooks)")

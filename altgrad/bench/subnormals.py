"""Where a trained run's CPU step computes on float32 subnormals, and what they cost it.

    python -m altgrad.bench subnormals RUN_DIR [RUN_DIR ...] [--batches 5] [--repeats 4]

A step's cost on the CPU depends on its data where an operand or result falls below float32's smallest normal
(2^-126): most x86 cores take a slow path (a microcode assist) for each such operation unless the thread flushes
subnormals to zero (FTZ/DAZ), which changes the values. Peaked attention is where a language model meets them: a
query whose scores spread over more than ≈ 87 nats has keys whose softmax probabilities are subnormal, and the
attention backward multiplies by every one of them.

For each run dir (a finished or stopped ``python -m altgrad.train`` run: its composed config in ``summary.json``,
its weights in ``checkpoints/last.ckpt``) this rebuilds the model as the run quantized it (statistics off), takes the
run's first ``--batches`` training batches, and prints:

- per attention layer, the share of causal attention probabilities that are subnormal (and that underflow to 0),
  and the attention entropy (nats; ln T is uniform);
- forward + backward ms with subnormals kept (what training computes) and flushed (``torch.set_flush_denormal``),
  interleaved, the best of ``--repeats`` medians, and the ratio;
- the ops whose CPU time moves most between the two (torch.profiler, self time per call).

The flushed timing is a measurement only: flushing is not a setting of training, whose bits it would change.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

TINY = torch.finfo(torch.float32).tiny  # the smallest normal float32, 2^-126


def load_run(run_dir: Path) -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    """The run's model with its layer map applied and its last checkpoint's weights (statistics off), its data
    module (set up for fit) and its summary."""
    import hydra
    from omegaconf import OmegaConf

    from altgrad.callbacks.probe import quantizers
    from altgrad.config import ConfigError, validate
    from altgrad.quant.fake_quant import set_track_stats
    from altgrad.train import build_fake_quant, build_module

    import json

    summary_path, ckpt = run_dir / "summary.json", run_dir / "checkpoints" / "last.ckpt"
    for path in (summary_path, ckpt):
        if not path.is_file():
            raise SystemExit(f"error: {run_dir}: no {path.relative_to(run_dir)}; give the dir of a "
                             "`python -m altgrad.train` run that saved a checkpoint")
    summary = json.loads(summary_path.read_text())
    cfg = OmegaConf.create(summary["config"])
    try:
        run = validate(cfg, paths=False)
    except ConfigError as err:
        raise SystemExit(f"error: {run_dir}: its config does not validate with this code: {err}") from None
    datamodule = hydra.utils.instantiate(cfg.data, _convert_="all")
    datamodule.prepare_data()
    datamodule.setup("fit")
    module = build_module(run, datamodule.vocab_size)
    build_fake_quant(run, run_dir).apply(module.model)  # as the run's FakeQuantCallback did (fp32: nothing quantized)
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    module.load_state_dict(state)
    set_track_stats(list(quantizers(module.model)), False)
    return module.model, datamodule, summary


def attention_rows(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[dict]:
    """Per attention layer over ``batches``: the shares of causal probabilities that are subnormal and that are 0,
    and the mean attention entropy (nats)."""
    from altgrad.callbacks.attention import attention_modules
    from altgrad.diagnostics import attention_entropy, attention_probs

    layers = attention_modules(model)
    seen: dict[str, list[torch.Tensor]] = {name: [] for name, _ in layers}
    hooks = [m.c_attn.register_forward_hook(lambda _m, _i, out, name=name: seen[name].append(out.detach()))
             for name, m in layers]
    try:
        with torch.no_grad():
            for x, _ in batches:
                model(x)
    finally:
        for h in hooks:
            h.remove()
    rows = []
    for name, m in layers:
        sub = zero = total = 0
        entropy = []
        for qkv in seen[name]:
            p = attention_probs(qkv, m.n_head)
            causal = torch.ones(p.shape[-2:], dtype=torch.bool).tril().expand_as(p)
            sub += int(((p > 0) & (p < TINY) & causal).sum())
            zero += int(((p == 0) & causal).sum())
            total += int(causal.sum())
            entropy.append(float(attention_entropy(p).mean()))
        rows.append({"layer": name, "subnormal": sub / total, "zero": zero / total,
                     "entropy": statistics.fmean(entropy)})
    return rows


def step_fn(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> Callable[[], None]:
    """Forward and backward of the loss on each batch, as a training step makes them."""
    def run() -> None:
        for x, y in batches:
            model.zero_grad(set_to_none=True)
            logits = model(x)
            F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1)).backward()
    return run


def timed(fn: Callable[[], None], n_batches: int, repeats: int) -> dict[bool, float]:
    """ms per forward + backward with subnormals kept (False) and flushed (True): interleaved, best of the medians."""
    best = {False: float("inf"), True: float("inf")}
    try:
        for _ in range(repeats):
            for flush in (False, True):
                torch.set_flush_denormal(flush)
                fn()  # warm
                times = []
                for _ in range(3):
                    start = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - start) / n_batches * 1e3)
                best[flush] = min(best[flush], statistics.median(times))
    finally:
        torch.set_flush_denormal(False)
    return best


def op_moves(fn: Callable[[], None], top: int = 4) -> list[tuple[str, float, float]]:
    """(op, self CPU µs kept, flushed) for the ops whose self time moves most, one profiled pass of each."""
    from torch.profiler import ProfilerActivity, profile

    got: dict[bool, dict[str, float]] = {}
    try:
        for flush in (False, True):
            torch.set_flush_denormal(flush)
            fn()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fn()
            got[flush] = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    finally:
        torch.set_flush_denormal(False)
    names = set(got[False]) | set(got[True])
    moved = sorted(names, key=lambda k: got[True].get(k, 0.0) - got[False].get(k, 0.0))
    return [(k, got[False].get(k, 0.0), got[True].get(k, 0.0)) for k in moved[:top]]


def report(run_dir: Path, n_batches: int, repeats: int) -> str:
    """One run's markdown section."""
    model, datamodule, summary = load_run(run_dir)
    it = iter(datamodule.train_dataloader())
    batches = [next(it) for _ in range(n_batches)]
    what = (f"format={summary.get('format')} optimizer={summary.get('optimizer')} master={summary.get('master')}, "
            f"{summary.get('steps')} steps")
    lines = [f"### {run_dir.name}: {what}", "", "| attention layer | subnormal probabilities | zero | entropy, nats |",
             "|---|---:|---:|---:|"]
    lines += [f"| {r['layer']} | {r['subnormal']:.2%} | {r['zero']:.2%} | {r['entropy']:.2f} |"
              for r in attention_rows(model, batches)]
    fn = step_fn(model, batches)
    ms = timed(fn, n_batches, repeats)
    lines += ["", f"forward + backward: {ms[False]:.1f} ms with subnormals, {ms[True]:.1f} ms flushed "
                  f"({ms[False] / ms[True]:.3f} ×)", "",
              "| op (self CPU, all batches) | µs with subnormals | flushed |", "|---|---:|---:|"]
    lines += [f"| `{name}` | {kept:,.0f} | {flushed:,.0f} |" for name, kept, flushed in op_moves(fn)]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m altgrad.bench subnormals", description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run dirs of python -m altgrad.train")
    parser.add_argument("--batches", type=int, default=5, help="training batches (the run's first ones)")
    parser.add_argument("--repeats", type=int, default=4, help="interleaved timing loops (the best median counts)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.batches < 1 or args.repeats < 1:
        raise SystemExit("error: --batches and --repeats must be >= 1")
    if not torch.set_flush_denormal(False):
        raise SystemExit("error: this CPU cannot flush subnormals (torch.set_flush_denormal needs SSE3 on x86)")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(f"subnormals: torch {torch.__version__}, {torch.get_num_threads()} thread(s), the runs' first "
          f"{args.batches} training batches")
    for run_dir in args.run_dirs:
        print()
        print(report(run_dir, args.batches, args.repeats))

"""Optimizer step time of the ULP-aware optimizers relative to torch AdamW (foreach), same process.

Every optimizer steps its own copy of the same quantized nano GPT (layer map ``uniform``, tensor scaling) with
the same fixed gradients; steps are timed round-robin (one step of each optimizer per round) so machine load hits
all of them alike.  The table reports per optimizer the median wall-clock time of a step and the median CPU time
the process spent in it (immune to other processes taking the cores of a shared machine), each with its ratio to
AdamW.  The ULP-aware optimizers run their default step (``optimizer.kernel=auto``: ManifoldAdamW's and
RelativeAdamW's native step, GridOptim's compiled one); the ``compiled`` rows take ManifoldAdamW's and RelativeAdamW's
torch.compile'd step instead (the same bits), compiled during the warm-up steps.

    python -m altgrad.bench optim [--steps 200] [--warmup 20] [--format e4m3] [--threads N]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any

import torch
from omegaconf import OmegaConf

from altgrad.bench.step import CONF, format_config, nano_model, quantize_linears
from altgrad.model import GPT
from altgrad.optim import build_optimizer

TARGET_RATIO = 2.0
_BASELINE = OmegaConf.load(CONF / "train.yaml").baseline
PLAIN = {"plain_lr": _BASELINE.lr, "plain_betas": list(_BASELINE.betas), "plain_eps": _BASELINE.eps}
"""The grid-less parameters' AdamW hyper-parameters: conf/train.yaml's baseline, as the optimizer configs pass them."""

# label → optimizer config (the conf/optimizer files' targets with their default hyper-parameters)
CONFIGS: dict[str, dict[str, Any]] = {
    "adamw": {"_target_": "torch.optim.AdamW", "lr": 5e-3, "betas": [0.9, 0.99], "weight_decay": 0.1,
              "foreach": True},
    "manifold[update]": {"_target_": "altgrad.optim.ManifoldAdamW", "stiffness_on": "update", "weight_decay": 0.1},
    "manifold[grad]": {"_target_": "altgrad.optim.ManifoldAdamW", "stiffness_on": "grad", "lr": 5e-3,
                       "weight_decay": 0.1},
    "manifold[update,smooth]": {"_target_": "altgrad.optim.ManifoldAdamW", "stiffness_kind": "smooth",
                                "weight_decay": 0.1},
    "manifold[update,compiled]": {"_target_": "altgrad.optim.ManifoldAdamW", "stiffness_on": "update",
                                  "weight_decay": 0.1, "kernel": "compiled"},
    "relative": {"_target_": "altgrad.optim.RelativeAdamW", "weight_decay": 0.1},
    "relative[compiled]": {"_target_": "altgrad.optim.RelativeAdamW", "weight_decay": 0.1, "kernel": "compiled"},
    "grid[adam]": {"_target_": "altgrad.optim.GridOptim", "inner": "adam", "weight_decay": 0.1, "seed": 0},
    "grid[sgd]": {"_target_": "altgrad.optim.GridOptim", "inner": "sgd", "weight_decay": 0.1, "seed": 0},
    "madam": {"_target_": "altgrad.optim.Madam", "weight_decay": 0.1},
}
CHECKED = ("manifold[update]", "grid[adam]")  # the issue's ≤ 2× target applies to these


def quantized_nano(fmt: str) -> GPT:
    """The nano GPT (conf/model/nano.yaml shapes, byte vocabulary) with every Linear fake-quantized in ``fmt``."""
    model, _ = nano_model(seed=0, vocab_size=257)
    return quantize_linears(model, format_config(fmt, grad=None), stats=None)


def measure(steps: int, warmup: int, fmt: str) -> list[tuple[str, float, float, int, int]]:
    """(label, median wall s/step, median CPU s/step, tensors by rule, tensors in plain AdamW) per optimizer."""
    base = quantized_nano(fmt)
    gen = torch.Generator().manual_seed(1)
    runs = []
    for label, cfg in CONFIGS.items():
        model = copy.deepcopy(base)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen) * 1e-3
        plain = PLAIN if cfg["_target_"].startswith("altgrad.") else {}
        optimizer, info = build_optimizer({"name": label, **plain, **cfg}, model)
        runs.append((label, optimizer, info, [], []))
    for i in range(warmup + steps):
        for _, optimizer, _, wall, cpu in runs:
            start, start_cpu = time.perf_counter(), time.process_time()
            optimizer.step()
            if i >= warmup:
                wall.append(time.perf_counter() - start)
                cpu.append(time.process_time() - start_cpu)
    return [(label, statistics.median(wall), statistics.median(cpu), len(info["rule_params"]),
             len(info["plain_params"])) for label, _, info, wall, cpu in runs]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m altgrad.bench optim", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps per optimizer (median reported)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    parser.add_argument("--format", default="e4m3", help="weight format of every Linear")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = measure(args.steps, args.warmup, args.format)
    n_params = sum(p.numel() for p in quantized_nano(args.format).parameters())
    ref_wall, ref_cpu = next((w, c) for label, w, c, _, _ in rows if label == "adamw")
    print(f"optimizer step time, nano GPT ({n_params / 1e6:.2f} M params), format={args.format}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, medians of {args.steps} steps")
    print(f"{'optimizer':<25}{'wall ms':>9}{'× adamw':>9}{'cpu ms':>9}{'× adamw':>9}{'rule/plain':>12}  "
          f"target (cpu, ≤ {TARGET_RATIO:g}×)")
    for label, wall, cpu, n_rule, n_plain in rows:
        ratio = cpu / ref_cpu
        target = ("ok" if ratio <= TARGET_RATIO else "MISSED") if label in CHECKED else ""
        print(f"{label:<25}{wall * 1e3:>9.3f}{wall / ref_wall:>9.2f}{cpu * 1e3:>9.3f}{ratio:>9.2f}"
              f"{f'{n_rule}/{n_plain}':>12}  {target}")

"""Train-step cost of fake quantization: the nano model with every Linear quantized vs. unquantized, one process.

    python -m altgrad.bench step [--format e4m3] [--steps 30] [--no-compile]

Each variant is a fresh copy of the same model (same seed); one step = forward + backward + AdamW step. Variants are
timed in interleaved rounds so drift on a shared machine hits them alike; the table gives medians and the ratio of
each quantized variant to the unquantized one with the same compile setting.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from altgrad.callbacks.fake_quant import FakeQuantCallback
from altgrad.model import GPT, GPTConfig

CONF = Path(__file__).resolve().parents[2] / "conf"


def nano_model(seed: int = 0) -> tuple[GPT, int]:
    """The `model=nano` preset as a plain GPT, and its block size."""
    cfg = OmegaConf.to_container(OmegaConf.load(CONF / "model" / "nano.yaml"), resolve=True)
    fields = {k: v for k, v in cfg.items() if k in GPTConfig.__dataclass_fields__ and v is not None}
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**fields))
    return model, model.config.block_size


def make_step(model: torch.nn.Module, compile_model: bool):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    fwd = torch.compile(model) if compile_model else model

    def step(idx: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        logits = fwd(idx)
        F.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()
        opt.step()

    return step


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m altgrad.bench step", description=__doc__.splitlines()[0])
    parser.add_argument("--format", default="e4m3", help="format preset for weights and inputs (grads: e5m2)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    args = parser.parse_args(argv)

    base, block = nano_model()
    idx = torch.randint(0, base.config.vocab_size, (args.batch, block), generator=torch.Generator().manual_seed(0))
    fmt_cfg = {"name": args.format, "grad": "e5m2", "scaling": {"kind": "tensor", "pow2": True}}
    variants: dict[str, object] = {}
    for compiled in ([False] if args.no_compile else [False, True]):
        for quantized in (False, True):
            model = copy.deepcopy(base)
            if quantized:
                FakeQuantCallback(fmt_cfg, {"base_rules": []}).apply(model)
            variants[(quantized, compiled)] = make_step(model, compiled)

    for key, step in variants.items():  # warm-up (and compilation) outside the timed rounds
        for _ in range(args.warmup):
            step(idx)
    times: dict[object, list[float]] = {k: [] for k in variants}
    for _ in range(args.steps):
        for key, step in variants.items():
            t0 = time.perf_counter()
            step(idx)
            times[key].append(time.perf_counter() - t0)

    n_params = sum(p.numel() for p in base.parameters())
    print(f"nano model: {n_params / 1e6:.2f}M params, batch {args.batch}x{block} tokens, format {args.format} "
          f"(weight+input) / e5m2 (grad), torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'variant':<28}{'median ms':>10}{'ratio':>8}")
    for (quantized, compiled), ts in times.items():
        med = statistics.median(ts)
        ref = statistics.median(times[(False, compiled)])
        name = f"{'quantized' if quantized else 'unquantized'}, compile={'on' if compiled else 'off'}"
        print(f"{name:<28}{med * 1e3:>10.2f}{med / ref:>8.3f}")

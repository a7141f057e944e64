"""Train-step cost of fake quantization: the nano model with every Linear quantized vs. unquantized, one process.

    python -m altgrad.bench step [--format e4m3] [--steps 30] [--no-compile] [--model nano] [--device cpu|cuda]
                                 [--bf16] [--vocab 257] [--stats-every 10] [--allocator keep|default]

Each variant is a fresh copy of the same model (same seed); one step = forward + backward + AdamW step. Variants are
timed in interleaved rounds so drift on a shared machine hits them alike; the table gives medians and the ratio of
each quantized variant to the unquantized one with the same compile setting.

The quantized model is timed twice: with the quantizers' statistics off (``track_stats = False`` on every
quantizer: a training step where no diagnostic reads them, as FakeQuantCallback runs it with quant.stats=demand) and
on (a step where one does, or quant.stats=always). The amortised row is computed, not timed: statistics on one step
in ``--stats-every`` (default: trainer.log_every_n_steps of the trainer presets, the cadence of the stability
metrics), i.e. (1 - 1/N)·off + 1/N·on, from the two medians.

The process's malloc is set up as a training run sets it (``--allocator keep``: trainer.keep_freed_memory=true, the
default of every trainer preset; altgrad/host_memory.py); ``--allocator default`` leaves glibc's defaults, under
which the quantized step re-faults freed buffers every step.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from altgrad.callbacks.fake_quant import FakeQuantCallback
from altgrad.callbacks.probe import quantizers
from altgrad.host_memory import keep_freed_memory
from altgrad.model import GPT, GPTConfig
from altgrad.quant.fake_quant import set_track_stats

try:
    import resource  # POSIX only: page-fault counts
except ImportError:  # pragma: no cover - Windows
    resource = None

CONF = Path(__file__).resolve().parents[2] / "conf"


def nano_model(seed: int = 0, preset: str = "nano", vocab_size: int | None = None) -> tuple[GPT, int]:
    """A `model=` preset (default nano) as a plain GPT, and its block size."""
    path = CONF / "model" / f"{preset}.yaml"
    if not path.is_file():
        valid = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
        raise SystemExit(f"--model={preset!r} is not a model preset; valid: {', '.join(valid)}")
    cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    fields = {k: v for k, v in cfg.items() if k in GPTConfig.__dataclass_fields__ and v is not None}
    if vocab_size is not None:
        fields["vocab_size"] = vocab_size
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**fields))
    return model, model.config.block_size


def job_config(overrides: Sequence[str] = ()) -> DictConfig:
    """conf/train.yaml as Hydra composes it for a job with these overrides (unresolved)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose(config_name="train", overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()


def format_config(preset: str, **fields: object) -> dict[str, object]:
    """The ``format=PRESET`` group as a job composes it, ``fields`` set over it (e.g. ``rounding="stochastic"``)."""
    valid = sorted(p.stem for p in (CONF / "format").glob("*.yaml"))
    if preset not in valid:
        raise SystemExit(f"--format={preset!r} is not a format preset; valid: {', '.join(valid)}")
    return OmegaConf.to_container(OmegaConf.merge(job_config([f"format={preset}"]).format, fields), resolve=True)


def quantize_linears(model: torch.nn.Module, fmt: dict[str, object], stats: bool | None = False) -> torch.nn.Module:
    """Every Linear of ``model`` fake-quantized in place as ``layer_map=uniform`` does it, the quantizers'
    statistics on or off (off: a step where no diagnostic reads them, as quant.stats=demand runs it; None: as the
    callback leaves them)."""
    FakeQuantCallback(fmt, {"base_rules": []}).apply(model)
    if stats is not None:
        set_track_stats(list(quantizers(model)), stats)
    return model


def make_step(model: torch.nn.Module, compile_model: bool, bf16: bool = False):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    fwd = torch.compile(model) if compile_model else model
    device = next(model.parameters()).device

    def step(idx: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = fwd(idx)
        F.cross_entropy(logits.float().flatten(0, 1), idx.flatten()).backward()
        opt.step()

    return step


def _page_faults() -> int:
    """Minor page faults of this process so far (0 where the platform has no getrusage)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource is not None else 0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m altgrad.bench step", description=__doc__.splitlines()[0])
    parser.add_argument("--format", default="e4m3", help="format preset for weights and inputs (grads: e5m2)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=6,
                        help="untimed steps first (torch.compile of the compiled variants and of the optimizer's "
                             "fused steps)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    parser.add_argument("--model", default="nano", help="model preset of conf/model (default nano)")
    parser.add_argument("--vocab", type=int, default=257, help="vocabulary size (257: the byte tokenizer)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast around the forward (as trainer=gpu)")
    parser.add_argument("--stats-every", type=int, default=None,
                        help="amortised row: statistics on 1 step in N (default: trainer.log_every_n_steps, 10)")
    parser.add_argument("--allocator", choices=("keep", "default"), default="keep",
                        help="keep: malloc keeps freed blocks, as training does (trainer.keep_freed_memory); "
                             "default: glibc's own thresholds")
    args = parser.parse_args(argv)
    stats_every = args.stats_every or int(job_config().trainer.log_every_n_steps)
    if stats_every < 1:
        raise SystemExit("--stats-every must be >= 1")
    kept = keep_freed_memory() if args.allocator == "keep" else False
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device=cuda: no CUDA GPU is visible; valid here: cpu")

    base, block = nano_model(preset=args.model, vocab_size=args.vocab)
    base.to(device)
    idx = torch.randint(0, base.config.vocab_size, (args.batch, block), generator=torch.Generator().manual_seed(0))
    idx = idx.to(device)
    fmt_cfg = format_config(args.format, grad="e5m2")
    variants: dict[tuple[str, bool], object] = {}  # (unquantized | stats off | stats on, compiled) -> step
    for compiled in ([False] if args.no_compile else [False, True]):
        for kind in ("unquantized", "stats off", "stats on"):
            model = copy.deepcopy(base)
            if kind != "unquantized":
                quantize_linears(model, fmt_cfg, stats=kind == "stats on")
            variants[(kind, compiled)] = make_step(model, compiled, args.bf16)

    for key, step in variants.items():  # warm-up (and compilation) outside the timed rounds
        for _ in range(args.warmup):
            step(idx)
    times: dict[tuple[str, bool], list[float]] = {k: [] for k in variants}
    faults: dict[tuple[str, bool], list[int]] = {k: [] for k in variants}
    for _ in range(args.steps):
        for key, step in variants.items():
            _sync(device)
            f0 = _page_faults()
            t0 = time.perf_counter()
            step(idx)
            _sync(device)
            times[key].append(time.perf_counter() - t0)
            faults[key].append(_page_faults() - f0)

    n_params = sum(p.numel() for p in base.parameters())
    where = (torch.cuda.get_device_name(device) if device.type == "cuda"
             else f"{torch.get_num_threads()} threads")
    print(f"{args.model} model: {n_params / 1e6:.2f}M params, batch {args.batch}x{block} tokens, format {args.format} "
          f"(weight+input) / e5m2 (grad), {'bf16 autocast' if args.bf16 else 'float32'}, torch {torch.__version__}, "
          f"{where}, malloc {'keeps freed memory' if kept else 'glibc defaults'}")
    print(f"{'compile':<9}{'variant':<50}{'median ms':>10}{'ratio':>8}{'page faults/step':>18}")
    medians = {k: statistics.median(ts) for k, ts in times.items()}
    w = 1.0 / stats_every
    for compiled in dict.fromkeys(c for _, c in medians):
        ref = medians[("unquantized", compiled)]
        off, on = medians[("stats off", compiled)], medians[("stats on", compiled)]
        flt = {kind: statistics.median(faults[(kind, compiled)]) for kind in ("unquantized", "stats off", "stats on")}
        rows = [("unquantized", ref, f"{flt['unquantized']:.0f}"),
                ("quantized, stats off (no diagnostic reads them)", off, f"{flt['stats off']:.0f}"),
                ("quantized, stats on (a diagnostic step)", on, f"{flt['stats on']:.0f}"),
                (f"quantized, stats on 1 step in {stats_every} (amortised*)", (1 - w) * off + w * on, "")]
        for name, med, flts in rows:
            print(f"{'on' if compiled else 'off':<9}{name:<50}{med * 1e3:>10.2f}{med / ref:>8.3f}{flts:>18}".rstrip())
    print(f"* computed from the two medians above, not timed: {1 - w:.3g}·off + {w:.3g}·on")

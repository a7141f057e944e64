"""What bit-identical fake quantization cannot go under: a step's quantizer arithmetic against the budget of each of
issue 31's targets, per recipe and thread count, side by side in one process.

    python -m altgrad.bench floor [--recipes default,small] [--threads default,1] [--repeats 9] [--steps 10]

Per setting (a recipe at a thread count; ``default``: torch's thread count at start, what a user's job gets) it
times, interleaved so drift hits them alike (median over ``--repeats`` loops of ``--steps`` steps, wall clock):

- ``fp32 step``: forward, backward, clip at 1.0 and AdamW of the nano model on the recipe's batch;
- ``e4m3 step``: the same with every Linear quantized (``format=e4m3``: e4m3 weight and input, e5m2 gradient),
  statistics off and no callbacks: ``callbacks=none``'s step, the C++ node;
- ``arithmetic``: only the step's quantizer calls, each the bare native call the C++ node makes (the extension's
  ``Plan``: no Python, no autograd, no statistics) on a tensor of its shape, for nearest and for stochastic
  rounding, each call timed with its input and output already in cache: a lower bound (in a step the copies also
  push the originals out of cache, and the calls go through autograd).

The arithmetic row is what writing the quantized copies of every input, weight and output gradient costs however
little else a step does; with those copies written (and read again by the matmuls) the bits are today's. Each
target leaves (target − 1) × the fp32 step for everything quantization adds; where the arithmetic alone is over
that budget, the target cannot be met without changing bits (a GEMM that quantizes its operands as it loads them
sums in its own order). The whole jobs' ratios are docs/benchmarks/job.md's; this bench says which are reachable.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from altgrad.host_memory import keep_freed_memory
from altgrad.quant import native

VOCAB = 257  # the byte tokenizer's
TARGETS = (("e4m3", 1.10), ("e4m3 callbacks=none", 1.05), ("e4m3 stochastic", 1.15))
"""Issue 31's targets whose extra over fp32 is the quantizer calls (plus diagnostics): (row, bound)."""


def recipe_shape(recipe: str) -> tuple[int, int]:
    """(batch, block) of one of the job bench's recipes (``job.RECIPES``: overrides of the default job), as a job
    of that recipe composes them."""
    from altgrad.bench.job import RECIPES
    from altgrad.bench.step import job_config

    if recipe not in RECIPES:
        raise SystemExit(f"error: --recipes: {recipe!r} is not a recipe; valid: {', '.join(RECIPES)}")
    cfg = job_config(RECIPES[recipe])
    return int(cfg.data.batch_size), int(cfg.model.block_size)


@dataclass(frozen=True)
class Setting:
    """A recipe at a thread count."""

    recipe: str
    threads: int
    default_threads: bool

    @property
    def label(self) -> str:
        threads = (f"default threads ({self.threads})" if self.default_threads
                   else f"{self.threads} thread" + "s" * (self.threads > 1))
        return f"{self.recipe} recipe, {threads}"


def _model(block: int, quantized: bool, rounding: str = "nearest") -> torch.nn.Module:
    """The nano model on windows of ``block`` tokens, fp32 or quantized with format=e4m3 (statistics off)."""
    from altgrad.bench.step import format_config, nano_model, quantize_linears

    model, _ = nano_model(0, vocab_size=VOCAB)
    model.config.block_size = block
    if quantized:
        quantize_linears(model, format_config("e4m3", rounding=rounding))
    return model


def step_fn(model: torch.nn.Module, batch: int, block: int) -> Callable[[], None]:
    """One training step as a job makes it without callbacks: forward, backward, clip at 1.0, AdamW."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    params = list(model.parameters())
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, VOCAB, (batch, block + 1), generator=gen)
    x, y = idx[:, :-1], idx[:, 1:]

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    return step


def call_shapes(model: torch.nn.Module, tokens: int) -> list[tuple[object, tuple[int, int]]]:
    """(quantizer, shape of the tensor it quantizes in a step) for every quantizer call of one training step: the
    input (tokens × in), the weight (out × in) and the output gradient (tokens × out) of each quantized Linear."""
    from altgrad.quant.layers import iter_quant_linears

    calls = []
    for _, ql in iter_quant_linears(model):
        out_f, in_f = ql.weight.shape
        for q, shape in ((ql.input_q, (tokens, in_f)), (ql.weight_q, (out_f, in_f)), (ql.grad_q, (tokens, out_f))):
            if q is not None and q.enabled:
                calls.append((q, shape))
    return calls


def arithmetic_fn(model: torch.nn.Module, tokens: int) -> tuple[Callable[[], float], int, int]:
    """Every quantizer call of a step as the bare native call the C++ node makes (``Plan``, statistics off, the
    scaler's state read, not written), each timed with its input and output in cache (run once untimed first, as
    the op that produced the input in a step leaves it there): a lower bound. Returns a pass (its ms), the number
    of calls and of elements."""
    calls = call_shapes(model, tokens)
    gen = torch.Generator().manual_seed(3)
    work = []
    for q, shape in calls:
        plan = q.node_plan()
        if plan is None:
            raise SystemExit("error: the native Linear extension is not built here (it needs torch's headers and "
                             "ninja); the floor is the C++ node's and cannot be timed without it")
        x = torch.randn(shape, generator=gen) * 0.05
        seed = 12345 if q.spec.rounding == "stochastic" else None
        work.append((plan, x, seed))

    def run() -> float:
        total = 0.0
        for plan, x, seed in work:
            plan(x, seed, False)  # x and a freed output block of its size into cache
            start = time.perf_counter()
            plan(x, seed, False)
            total += time.perf_counter() - start
        return total * 1e3

    return run, len(calls), sum(x.numel() for _, x, _ in work)


def time_setting(setting: Setting, repeats: int, steps: int) -> dict[str, object]:
    """Median ms of each row at this setting, interleaved; plus the calls' count and elements."""
    torch.set_num_threads(setting.threads)
    batch, block = recipe_shape(setting.recipe)
    fp32 = _model(block, quantized=False)
    quant = _model(block, quantized=True)
    stoch = _model(block, quantized=True, rounding="stochastic")
    arith, n_calls, n_elems = arithmetic_fn(quant, batch * block)
    arith_st, _, _ = arithmetic_fn(stoch, batch * block)
    rows = {"fp32 step": step_fn(fp32, batch, block), "e4m3 step (statistics off, no callbacks)":
            step_fn(quant, batch, block), "arithmetic, nearest": arith, "arithmetic, stochastic": arith_st}
    for fn in rows.values():  # warm-up: allocator, caches, AdamW's state
        for _ in range(3):
            fn()
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(repeats):
        for name, fn in rows.items():
            start = time.perf_counter()
            timed = [fn() for _ in range(steps)]  # the arithmetic rows time their own calls
            whole = (time.perf_counter() - start) / steps * 1e3
            times[name].append(sum(timed) / steps if name.startswith("arithmetic") else whole)
    return {"ms": {name: statistics.median(ts) for name, ts in times.items()}, "calls": n_calls,
            "elements": n_elems, "tokens": batch * block}


def settings(recipes: list[str], threads: list[str]) -> list[Setting]:
    """Every recipe at every thread count; ``default`` is torch's count at start."""
    default = torch.get_num_threads()
    out = []
    for r in recipes:
        recipe_shape(r)  # an unknown recipe stops here
        for t in threads:
            if t == "default":
                out.append(Setting(r, default, True))
            elif t.isdigit() and int(t) >= 1:
                out.append(Setting(r, int(t), False))
            else:
                raise SystemExit(f"error: --threads: {t!r} is not a thread count; valid: default or an integer >= 1")
    return out


def table(setting: Setting, got: dict[str, object]) -> str:
    """One setting's markdown: the rows, then each target's budget against the arithmetic."""
    ms = got["ms"]
    base = ms["fp32 step"]
    lines = [f"### {setting.label}: {got['tokens']} tokens a step, {got['calls']} quantizer calls, "
             f"{got['elements'] / 1e6:.2f} M elements", "",
             "| row | ms a step | × fp32 step |", "|---|---:|---:|"]
    # a step row's ratio to the fp32 step; an arithmetic row's share of it (what it adds at the least)
    lines += [f"| {name} | {v:.2f} | {'' if ' step' in name else '+'}{v / base:.3f} |" for name, v in ms.items()]
    lines += ["", "| target | budget ms (target − 1) × fp32 | arithmetic ms | arithmetic ÷ budget | reachable with "
              "today's bits |", "|---|---:|---:|---:|---|"]
    for row, bound in TARGETS:
        budget = (bound - 1) * base
        arith = ms["arithmetic, stochastic" if "stochastic" in row else "arithmetic, nearest"]
        share = arith / budget
        verdict = ("no: the arithmetic alone is over the budget" if share > 1
                   else "only if the rest of what quantization adds fits in what is left")
        lines.append(f"| `{row}` ≤ {bound:.2f} × | {budget:.2f} | {arith:.2f} | {share:.2f} | {verdict} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m altgrad.bench floor", description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default="default,small", help="comma-separated recipes of the job bench")
    parser.add_argument("--threads", default="default,1", help="comma-separated: default (torch's) or counts")
    parser.add_argument("--repeats", type=int, default=9, help="interleaved loops per row (the median counts)")
    parser.add_argument("--steps", type=int, default=10, help="steps (or arithmetic passes) per timed loop")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.steps < 1:
        raise SystemExit("error: --repeats and --steps must be >= 1")
    todo = settings([r for r in args.recipes.split(",") if r], [t for t in args.threads.split(",") if t])
    if native.kernel() is None or native.linear_ext() is None:
        raise SystemExit("error: the native kernel or its Linear extension is not built here; the floor is the C++ "
                         "node's calls and cannot be timed without them")
    keep_freed_memory()
    print(f"floor: nano model, format=e4m3 (e4m3 weight and input, e5m2 gradient, tensor scale), torch "
          f"{torch.__version__}, median of {args.repeats} interleaved loops of {args.steps} steps, wall ms")
    for setting in todo:
        print()
        print(table(setting, time_setting(setting, args.repeats, args.steps)))

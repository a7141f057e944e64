"""The fixed cost of one quantizer call on the CPU, and where it goes: µs per call at 16 K and 100 K elements.

    python -m altgrad.bench calls [--sizes 16384,100352] [--calls 2000] [--repeats 7] [--threads 1] [--steps 40]

A training step of the nano model makes 51 quantizer calls (weight, input and output gradient of 17 Linears); on a
small step (768 tokens) their fixed cost, not their arithmetic, is what a quantized job pays over fp32. Each row
times one layer of a call in a tight loop (the CPU time of this thread, best of ``--repeats`` loops of ``--calls``
calls, one torch thread unless ``--threads``), so the differences between rows say where the time goes:

- ``ctypes``: the native library's entry point called with ready-made arguments on 8 elements (the call itself);
- ``kernel``: the same call on n elements (minus ctypes: the arithmetic);
- ``native.quant_call``: plus the Python that turns tensors into pointers and allocates the output;
- ``quantize_now``: plus the quantizer's own dispatch (road, buffers, cached format parameters);
- ``forward``: a TensorQuantizer called as a module on an input that needs no gradient;
- ``forward, autograd``: the same input requiring grad (the straight-through node autograd records);
- ``+ statistics``: track_stats on (the counts and amax of quant.stats; a step without a reader turns them off);
- ``eager road``: the same forward through the torch functions (quant.kernel=eager), for scale.

The ``in a step`` rows time training steps of the small-step recipe's model (nano, block 64, batch 12: 768 tokens)
with every Linear quantized in e4m3 (statistics off, as on most steps) against the unquantized model, and divide the
difference by the 51 calls: what one call costs inside a real forward and backward, allocator and caches included.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from altgrad.host_memory import keep_freed_memory
from altgrad.quant import QuantSpec, TensorQuantizer, get_format, native
from altgrad.quant.rounding import kernel_params, kernel_variant
from altgrad.quant.scaling import scale_consts

SMALL_BLOCK, SMALL_BATCH = 64, 12  # the small-step recipe (docs/benchmarks/job.md)


def per_call(fn: Callable[[], object], calls: int, repeats: int) -> float:
    """µs of this thread's CPU time per call of ``fn``: best of ``repeats`` loops of ``calls`` calls."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - start) / calls)
    return best * 1e6


def call_rows(n: int, calls: int, repeats: int) -> list[tuple[str, float]]:
    """(layer, µs per call) for one e4m3 tensor-scaled quantizer on n float32 elements (see the module doc)."""
    fmt = get_format("e4m3")
    spec = QuantSpec(fmt)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n // 128, 128, generator=gen)
    xg = x.clone().requires_grad_(True)
    rows: list[tuple[str, float]] = []
    k = native.kernel()
    q = TensorQuantizer(spec, "input", track_stats=False)
    if k is not None:
        p = kernel_params(fmt, "nearest", "saturate", x.device)
        consts = scale_consts(fmt, 0, x.device)
        flags = native.variant_flags(kernel_variant(fmt, "nearest", "saturate"))
        y = torch.empty_like(x)
        scale = torch.ones(())
        args = [x.data_ptr(), y.data_ptr(), n, p.data_ptr(), 0, flags, 0, native.KINDS["tensor"], 1,
                consts.data_ptr(), scale.data_ptr(), None, 0, 1, 1, None, 1, None]
        tiny = [*args[:2], 8, *args[3:]]
        rows.append(("ctypes (8 elements)", per_call(lambda: k.call(*tiny), calls, repeats)))
        rows.append(("kernel", per_call(lambda: k.call(*args), calls, repeats)))
        state = q.scaler.state()
        rows.append(("native.quant_call", per_call(
            lambda: native.quant_call(k, x, p, "nearest", flags, None, "tensor", True, consts, scale=state[-1],
                                      update=True), calls, repeats)))
        rows.append(("quantize_now", per_call(lambda: q.quantize_now(x, None, True), calls, repeats)))
    rows.append(("forward", per_call(lambda: q(x), calls, repeats)))
    rows.append(("forward, autograd", per_call(lambda: q(xg), calls, repeats)))
    q.track_stats = True
    rows.append(("forward, autograd + statistics", per_call(lambda: q(xg), calls, repeats)))
    eager = TensorQuantizer(spec, "input", track_stats=False, kernel="eager")
    rows.append(("forward, autograd, eager road", per_call(lambda: eager(xg), max(calls // 10, 1), repeats)))
    return rows


def step_rows(steps: int, repeats: int) -> list[tuple[str, float]]:
    """µs per training step of the small recipe's model, fp32 and e4m3 (statistics off), and per quantizer call."""
    from altgrad.bench.step import nano_model
    from altgrad.callbacks.fake_quant import FakeQuantCallback
    from altgrad.callbacks.probe import quantizers
    from altgrad.quant.fake_quant import set_track_stats

    base, _ = nano_model(0)
    base.config.block_size = SMALL_BLOCK
    quant = copy.deepcopy(base)
    fmt_cfg = {"name": "e4m3", "grad": "e5m2", "scaling": {"kind": "tensor", "pow2": True}}  # format=e4m3's
    FakeQuantCallback(fmt_cfg, {"base_rules": []}).apply(quant)
    qs = list(quantizers(quant))
    set_track_stats(qs, False)
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, base.config.vocab_size, (SMALL_BATCH, SMALL_BLOCK + 1), generator=gen)
    x, y = idx[:, :-1], idx[:, 1:]
    models = {"fp32": base, "e4m3": quant}
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-3) for name, m in models.items()}

    def step(name: str) -> None:
        m, opt = models[name], opts[name]
        loss = F.cross_entropy(m(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times: dict[str, list[float]] = {name: [] for name in models}
    for name in models:
        step(name)
    for _ in range(repeats):  # interleaved: drift hits both alike
        for name in models:
            start = time.thread_time()
            for _ in range(steps):
                step(name)
            times[name].append((time.thread_time() - start) / steps * 1e6)
    fp32, e4m3 = min(times["fp32"]), min(times["e4m3"])
    return [("step, fp32", fp32), ("step, e4m3 (statistics off)", e4m3),
            (f"in a step, per call ({len(qs)} calls)", (e4m3 - fp32) / len(qs))]


def table(sizes: list[int], calls: int, repeats: int, steps: int) -> str:
    """The markdown table of every size's call rows, then the step rows."""
    per_size = {n: dict(call_rows(n, calls, repeats)) for n in sizes}
    names = list(next(iter(per_size.values())))
    lines = ["| layer of a call | " + " | ".join(f"µs at {n:,}" for n in sizes) + " | what it adds |",
             "|---|" + "---:|" * len(sizes) + "---|"]
    before: dict[int, float] = {}
    for name in names:
        cells, adds = [], []
        for n in sizes:
            v = per_size[n][name]
            cells.append(f"{v:.1f}")
            prev = before.get(n)
            adds.append("" if prev is None or "eager" in name else f"{v - prev:+.1f}")
            if "eager" not in name:
                before[n] = v
        lines.append(f"| {name} | " + " | ".join(cells) + " | " + " / ".join(a for a in adds if a) + " |")
    lines += ["", "| in a training step (small recipe) | µs |", "|---|---:|"]
    lines += [f"| {name} | {v:.1f} |" for name, v in step_rows(steps, repeats)]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m altgrad.bench calls", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16384,100352", help="comma-separated element counts")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed loop")
    parser.add_argument("--repeats", type=int, default=7, help="timed loops per row (the best counts)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--steps", type=int, default=20, help="training steps per timed loop of the step rows")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes or min(sizes) < 128 or args.calls < 1 or args.repeats < 1 or args.steps < 1:
        raise SystemExit("error: --sizes must be element counts >= 128; --calls, --repeats, --steps >= 1")
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    print(f"quantizer calls: e4m3, tensor scale, {args.threads} torch thread(s), µs of CPU time per call")
    print(table(sizes, args.calls, args.repeats, args.steps))


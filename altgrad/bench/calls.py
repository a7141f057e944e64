"""The fixed cost of a quantizer call and of a quantized Linear on the CPU, and where it goes.

    python -m altgrad.bench calls [--sizes 16384,100352] [--calls 2000] [--repeats 7] [--threads 1] [--steps 20]

A training step of the nano model makes 51 quantizer calls (weight, input and output gradient of 17 Linears); on a
small step (768 tokens) their fixed cost, not their arithmetic, is what a quantized job pays over fp32. Every row is
the CPU time of this thread (best of ``--repeats`` loops, one torch thread unless ``--threads``), so the differences
between rows say where the time goes.

One call (e4m3, tensor scale), at each of ``--sizes`` elements; "over" names the row it is compared with:

- ``kernel through ctypes, 8 elements``: the native library's entry point with ready-made arguments (ctypes' cost);
- ``kernel through ctypes``: the same on n elements (minus the row above: the arithmetic);
- ``kernel through ctypes, statistics``: the same with the statistics counted in its pass (their arithmetic);
- ``native.quant_call (ctypes)``: plus turning tensors into pointers and allocating the output in Python;
- ``Plan (extension)``: the same call from native_linear.cpp's ``Plan`` (pybind11, the output allocated in C++);
- ``quantize_now``: plus the quantizer's own dispatch (road, plan check) on the road it takes;
- ``forward``, ``forward, autograd``: a TensorQuantizer called as a module, on an input without / with gradient;
- ``+ statistics``: track_stats on (the counts and amax of quant.stats; a step without a reader turns them off);
- ``eager road``: the same forward through the torch functions (quant.kernel=eager), for scale.

One quantized Linear (weight, input and gradient in e4m3/e4m3/e5m2), forward and backward, minus an nn.Linear's, on
each of linear_node.ROADS: the C++ node (``auto``), the Python node, the module road (the quantizer modules around
F.linear); on 1 × 8 → 8 (the fixed cost) and on the small recipe's widest layer (768 × 128 → 512).

Training steps of the small-step recipe's model (nano, block 64, batch 12: 768 tokens), fp32 and e4m3 with statistics
off (as on most steps) on each road, and the difference per quantizer call: what one call costs inside a real
forward and backward, allocator and caches included; and e4m3 on the default road with statistics on (a logging
step's calls: the difference is what the statistics cost a step that records them).
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from altgrad.host_memory import keep_freed_memory
from altgrad.quant import QuantSpec, TensorQuantizer, get_format, linear_node, native
from altgrad.quant.layers import QuantLinear
from altgrad.quant.rounding import kernel_params, kernel_variant
from altgrad.quant.scaling import scale_consts

SMALL_BLOCK, SMALL_BATCH = 64, 12  # the small-step recipe (docs/benchmarks/job.md)
VOCAB = 257  # the byte tokenizer's


def road_names() -> dict[str, str]:
    """What each of linear_node.ROADS runs here: ``auto`` is the C++ node only where the extension is built."""
    cpp = native.kernel() is not None and native.linear_ext() is not None
    return {"auto": "C++ node" if cpp else "auto (no extension: Python node)", "python": "Python node",
            "modules": "module road"}


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


def interleaved(fns: dict[str, Callable[[], object]], calls: int, repeats: int) -> dict[str, float]:
    """µs per call of each of ``fns``, timed in interleaved rounds (drift on a shared machine hits them alike)."""
    best = {name: float("inf") for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.thread_time()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.thread_time() - start) / calls * 1e6)
    return best


def call_rows(n: int, calls: int, repeats: int) -> list[tuple[str, float, str | None]]:
    """(layer, µs per call, the row it adds to) for one e4m3 tensor-scaled quantizer on n float32 elements."""
    fmt = get_format("e4m3")
    spec = QuantSpec(fmt)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n // 128, 128, generator=gen)
    xg = x.clone().requires_grad_(True)
    rows: list[tuple[str, float, str | None]] = []
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
        rows.append(("kernel through ctypes, 8 elements", per_call(lambda: k.call(*tiny), calls, repeats), None))
        rows.append(("kernel through ctypes", per_call(lambda: k.call(*args), calls, repeats),
                     "kernel through ctypes, 8 elements"))
        counts = torch.zeros(6)
        counted = [*args[:15], counts.data_ptr(), *args[16:]]  # slot 15: where the statistics go
        rows.append(("kernel through ctypes, statistics", per_call(lambda: k.call(*counted), calls, repeats),
                     "kernel through ctypes"))
        state = q.scaler.state()
        rows.append(("native.quant_call (ctypes)", per_call(
            lambda: native.quant_call(k, x, p, "nearest", flags, None, "tensor", True, consts, scale=state[-1],
                                      update=True), calls, repeats), "kernel through ctypes"))
        ext = native.linear_ext()
        if ext is not None:
            plan = ext.Plan(k.address, p, 0, flags, native.KINDS["tensor"], True, consts, state[-1], None, True,
                            None)
            rows.append(("Plan (extension)", per_call(lambda: plan(x, None, True), calls, repeats),
                         "native.quant_call (ctypes)"))
        rows.append(("quantize_now", per_call(lambda: q.quantize_now(x, None, True), calls, repeats), rows[-1][0]))
    rows.append(("forward", per_call(lambda: q(x), calls, repeats), rows[-1][0] if rows else None))
    rows.append(("forward, autograd", per_call(lambda: q(xg), calls, repeats), "forward"))
    q.track_stats = True
    rows.append(("forward, autograd + statistics", per_call(lambda: q(xg), calls, repeats), "forward, autograd"))
    eager = TensorQuantizer(spec, "input", track_stats=False, kernel="eager")
    rows.append(("forward, autograd, eager road", per_call(lambda: eager(xg), max(calls // 10, 1), repeats), None))
    return rows


def _e4m3_layer(linear: nn.Linear) -> QuantLinear:
    def spec(name: str) -> QuantSpec:
        return QuantSpec(get_format(name))

    layer = QuantLinear(copy.deepcopy(linear), "layer", weight=spec("e4m3"), input=spec("e4m3"), grad=spec("e5m2"))
    for _, q in layer.quantizers():
        q.track_stats = False
    return layer


def layer_rows(repeats: int, calls: int) -> list[tuple[str, float, float]]:
    """(layer and road, µs per forward + backward, µs over an nn.Linear of that shape) for a quantized Linear."""
    rows = []
    gen = torch.Generator().manual_seed(2)
    for rows_in, d_in, d_out, n in ((1, 8, 8, calls), (SMALL_BATCH * SMALL_BLOCK, 128, 512, max(calls // 40, 5))):
        plain = nn.Linear(d_in, d_out, bias=False)
        layer = _e4m3_layer(plain)
        x = torch.randn(rows_in, d_in, generator=gen, requires_grad=True)
        g = torch.randn(rows_in, d_out, generator=gen)

        def step(module: nn.Module, road: str) -> Callable[[], None]:
            def run() -> None:
                with linear_node.road(road):
                    module(x).backward(g)
                module.weight.grad = None
                x.grad = None
            return run

        fns = {"nn.Linear": step(plain, "auto")}
        fns.update({road_names()[r]: step(layer, r) for r in linear_node.ROADS})
        got = interleaved(fns, n, repeats)
        shape = f"{rows_in} × {d_in} → {d_out}"
        rows += [(f"{shape}, {name}", v, v - got["nn.Linear"]) for name, v in got.items()]
    return rows


def step_rows(steps: int, repeats: int) -> list[tuple[str, float]]:
    """µs per training step of the small recipe's model, fp32 and e4m3 (statistics off) on each road, and the
    difference per quantizer call."""
    from altgrad.bench.step import format_config, nano_model, quantize_linears
    from altgrad.callbacks.probe import quantizers
    from altgrad.quant.fake_quant import set_track_stats

    base, _ = nano_model(0, vocab_size=VOCAB)
    base.config.block_size = SMALL_BLOCK
    quant = quantize_linears(copy.deepcopy(base), format_config("e4m3"))
    qs = list(quantizers(quant))
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, base.config.vocab_size, (SMALL_BATCH, SMALL_BLOCK + 1), generator=gen)
    x, y = idx[:, :-1], idx[:, 1:]
    variants = {"fp32": (base, "auto")}
    names = road_names()
    for road in linear_node.ROADS:  # one copy per road: each keeps its own optimizer state
        variants[f"e4m3, {names[road]}"] = (copy.deepcopy(quant), road)
    counting = copy.deepcopy(quant)  # a logging step's calls: statistics on, on the default road
    set_track_stats(list(quantizers(counting)), True)
    variants[f"e4m3, {names['auto']}, statistics on"] = (counting, "auto")
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-3) for name, (m, _) in variants.items()}

    def step(name: str) -> None:
        m, road = variants[name]
        opt = opts[name]
        with linear_node.road(road):
            loss = F.cross_entropy(m(x).flatten(0, 1), y.flatten())
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times: dict[str, list[float]] = {name: [] for name in variants}
    for name in variants:
        step(name)
    for _ in range(repeats):  # interleaved: drift hits every variant alike
        for name in variants:
            start = time.thread_time()
            for _ in range(steps):
                step(name)
            times[name].append((time.thread_time() - start) / steps * 1e6)
    best = {name: min(ts) for name, ts in times.items()}
    rows = [(f"step, {name}" + (" (statistics off)" if name != "fp32" and not name.endswith(" on") else ""), v)
            for name, v in best.items()]
    rows += [(f"in a step, per call ({len(qs)} calls), {names[r]}",
              (best[f"e4m3, {names[r]}"] - best["fp32"]) / len(qs)) for r in linear_node.ROADS]
    return rows


def table(sizes: list[int], calls: int, repeats: int, steps: int) -> str:
    """The markdown tables: every size's call rows, the layer rows, then the step rows."""
    per_size = {n: call_rows(n, calls, repeats) for n in sizes}
    first = next(iter(per_size.values()))
    lines = ["| layer of a call | " + " | ".join(f"µs at {n:,}" for n in sizes) + " | over |",
             "|---|" + "---:|" * len(sizes) + "---|"]
    for i, (name, _, base) in enumerate(first):
        cells = []
        for n in sizes:
            values = dict((row[0], row[1]) for row in per_size[n])
            v = per_size[n][i][1]
            cells.append(f"{v:.1f}" if base is None else f"{v:.1f} ({v - values[base]:+.1f})")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {base or ''} |")
    lines += ["", "| one quantized Linear, forward + backward | µs | over nn.Linear |", "|---|---:|---:|"]
    lines += [f"| {name} | {v:.1f} | {over:+.1f} |" for name, v, over in layer_rows(repeats, calls)]
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
    ext = "built" if native.linear_ext() is not None else "unavailable (the Python node serves)"
    print(f"quantizer calls: e4m3, tensor scale, {args.threads} torch thread(s), µs of CPU time per call; native "
          f"Linear extension {ext}")
    print(table(sizes, args.calls, args.repeats, args.steps))

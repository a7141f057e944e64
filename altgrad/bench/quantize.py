"""Speed of quantize on a large float32 tensor, as a ratio to x.clone() measured in the same process.

Every preset × rounding mode, beside torch's native low-precision round-trip casts and ml_dtypes' round trips.
Each row is timed right after an x.clone() (interleaved), and its ratio is the median of those pairs, so drift
of a shared machine cancels; a compiled `x + 0` row shows the floor of any kernel writing fresh memory.
First calls build or compile the kernels (reported separately, not timed in the table).
The process's malloc is set up as a training run sets it (``--allocator keep``: trainer.keep_freed_memory, freed
blocks reused, so neither x.clone() nor a kernel page-faults its fresh output); ``--allocator default`` leaves
glibc's, under which a 2^24 tensor is a fresh mmap each call and its 16,384 page faults take ≈ 85 % of either side.
On the CPU, float32 is rounded by the native kernel (``altgrad.quant.native``); the torch.compile'd kernels it
replaces there (same bits) are shown beside it for one preset.
On CUDA a sample is the device time of ``--calls`` back-to-back calls between two events, per call: the copy
engine's bandwidth against the kernel's, with the host's launch work overlapped as it is in a training loop.
Usage: python -m altgrad.bench quantize [--log2n 24] [--repeats 7] [--device cpu|cuda] [--formats e4m3,e5m2]
                                       [--allocator keep|default]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from altgrad.host_memory import keep_freed_memory
from altgrad.quant import ROUNDINGS, get_format, list_formats, native, quantize
from altgrad.quant.compiled import fused
from altgrad.quant.rounding import compiled_kernel, draw_seed, kernel_params, kernel_variant

_TORCH_CASTS = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2", "bf16": "bfloat16", "fp16": "float16"}
_ML_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e3m4", "float8_e4m3")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_once(fn: Callable[[], object], device: torch.device, calls: int = 1) -> tuple[float, float, int]:
    """Wall-clock and process-CPU milliseconds of one call, and the page faults it took (on CUDA: device time per
    call of ``calls`` back-to-back calls between two events; faults not counted, 0)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        c0 = time.process_time()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls, (time.process_time() - c0) * 1e3 / calls, 0
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    _sync(device)
    wall, cpu = (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3
    return wall, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m altgrad.bench quantize", description=__doc__.splitlines()[0])
    p.add_argument("--log2n", type=int, default=24, help="tensor of 2^log2n float32 elements (default 24)")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per row; the median is reported (>= 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs before timing")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--calls", type=int, default=50, help="CUDA only: back-to-back calls per timed sample")
    p.add_argument("--formats", default=",".join(list_formats()), help="comma-separated preset names")
    p.add_argument("--roundings", default=",".join(ROUNDINGS), help="comma-separated rounding modes")
    p.add_argument("--allocator", choices=("keep", "default"), default="keep",
                   help="keep: malloc keeps freed blocks, as training does (trainer.keep_freed_memory); "
                        "default: glibc's own thresholds (every large output a fresh, page-faulting mmap)")
    args = p.parse_args(argv)
    if args.repeats < 5:
        p.error(f"--repeats={args.repeats} is not valid; valid: an integer >= 5")
    if args.calls < 1:
        p.error(f"--calls={args.calls} is not valid; valid: an integer >= 1")
    for name in args.formats.split(","):
        try:
            get_format(name)
        except ValueError as err:
            p.error(f"--formats: {err}")
    for r in args.roundings.split(","):
        if r not in ROUNDINGS:
            p.error(f"--roundings: {r!r} is not valid; valid: {', '.join(ROUNDINGS)}")
    return args


def main(argv: list[str]) -> None:
    """Print the table (ms, Gelem/s, ratio to clone) for every preset × rounding mode and the references."""
    args = _parse(argv)
    device = torch.device(args.device)
    calls = args.calls if device.type == "cuda" else 1
    kept = keep_freed_memory() if args.allocator == "keep" else False
    n = 1 << args.log2n
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n, device=device, generator=gen) * torch.exp2(
        torch.randint(-20, 20, (n,), device=device, generator=gen).float())
    rows: list[tuple[str, str, Callable[[], object]]] = []
    compile_s = {}
    for rounding in args.roundings.split(","):
        t0 = time.perf_counter()
        for name in args.formats.split(","):  # compile every kernel variant the presets need (on the timed
            quantize(x, get_format(name), rounding)  # tensor: a CUDA kernel's block size follows its first call)
        compile_s[rounding] = time.perf_counter() - t0

    def plus_zero(t: torch.Tensor) -> torch.Tensor:
        return t + 0

    floor = fused(plus_zero)  # a fused loop with no arithmetic: what any fresh-output kernel costs
    floor(x)
    rows.append(("compiled x + 0 (floor)", "-", lambda: floor(x)))
    on_native = native.takes(x) and native.kernel() is not None
    if on_native:  # the torch.compile'd kernels the native one replaces: same bits
        name = "e4m3" if "e4m3" in args.formats.split(",") else args.formats.split(",")[0]
        fmt = get_format(name)
        seed = draw_seed(device, seed=0)
        for rounding in args.roundings.split(","):
            inductor = compiled_kernel(kernel_variant(fmt, rounding, "saturate"), None)
            call = (x, kernel_params(fmt, rounding, "saturate", device), seed if rounding == "stochastic" else None)
            inductor(*call)
            rows.append((f"{name} (compiled kernel)", rounding, lambda k=inductor, c=call: k(*c)))
    for name in args.formats.split(","):
        fmt = get_format(name)
        for rounding in args.roundings.split(","):
            rows.append((name, rounding, lambda f=fmt, r=rounding: quantize(x, f, r)))
    for label, dt in _TORCH_CASTS.items():
        dtype = getattr(torch, dt)
        rows.append((f"torch {dt}", "round trip", lambda d=dtype: x.to(d).to(torch.float32)))
    if device.type == "cpu":
        import ml_dtypes

        xn = x.numpy()
        for dt in _ML_DTYPES:
            dtype = getattr(ml_dtypes, dt)
            rows.append((f"ml_dtypes {dt}", "round trip", lambda d=dtype: xn.astype(d).astype(np.float32)))

    # Interleaved: every repeat times x.clone() right before each row, and a row's ratio is the median over
    # repeats of (row / the clone just before it). A slow drift of a shared machine, or of the kernel's page
    # faults on fresh output memory, then moves both sides of a ratio alike.
    def clone() -> torch.Tensor:
        return x.clone()

    for _ in range(args.warmup):
        for _label, _mode, fn in rows:
            fn()
            clone()
    _sync(device)
    samples: list[list[tuple[float, float, float, float]]] = [[] for _ in rows]
    faults: list[list[int]] = [[] for _ in rows]
    clone_faults: list[int] = []
    for _ in range(args.repeats):
        for i, (_label, _mode, fn) in enumerate(rows):
            cw, cc, cf = _time_once(clone, device, calls)
            w, c, f = _time_once(fn, device, calls)
            samples[i].append((w, c, cw, cc))
            faults[i].append(f)
            clone_faults.append(cf)
    clone_all = [s for row in samples for s in row]
    clone_ms = (statistics.median(s[2] for s in clone_all), statistics.median(s[3] for s in clone_all))
    table: list[tuple[str, str, float, float, float, float, float, float]] = [
        ("x.clone()", "-", *clone_ms, clone_ms[0], 1.0, 1.0, statistics.median(clone_faults))]
    for (label, mode, _fn), row, row_faults in zip(rows, samples, faults):
        table.append((label, mode, statistics.median(s[0] for s in row), statistics.median(s[1] for s in row),
                      statistics.median(s[2] for s in row),
                      statistics.median(s[0] / s[2] for s in row), statistics.median(s[1] / s[3] for s in row),
                      statistics.median(row_faults)))

    print(f"quantize benchmark: {n:,} float32 elements (2^{args.log2n}) on {device}, "
          f"{torch.get_num_threads()} threads, median of {args.repeats} runs after {args.warmup} warm-up"
          f"{f', {calls} back-to-back calls per run' if calls > 1 else ''}, torch {torch.__version__}")
    print(f"malloc: {'freed blocks kept, as in training (no page faults)' if kept else 'glibc defaults'}; "
          f"kernel: {'native (altgrad/quant/native_kernel.cpp)' if on_native else 'torch.compile (inductor)'}")
    print("compile (first call, not in the table): "
          + ", ".join(f"{r} {s:.1f} s" for r, s in compile_s.items()))
    cpu = device.type == "cpu"
    head = (f"| {'what':<26} | {'rounding':<11} | {'ms':>8} | {'Gelem/s':>8} | {'its clone ms':>12} "
            f"| {'x clone':>8} |")
    rule = f"|{'-' * 28}|{'-' * 13}|{'-' * 10}|{'-' * 10}|{'-' * 14}|{'-' * 10}|"
    if cpu:
        head += f" {'CPU ms':>8} | {'CPU x clone':>11} | {'faults':>7} |"
        rule += f"{'-' * 10}|{'-' * 13}|{'-' * 9}|"
    print(head)
    print(rule)
    for label, mode, ms, cms, paired, ratio, cratio, nfaults in table:
        line = f"| {label:<26} | {mode:<11} | {ms:8.2f} | {n / ms / 1e6:8.3f} | {paired:12.2f} | {ratio:7.2f}x |"
        if cpu:
            line += f" {cms:8.2f} | {cratio:10.2f}x | {nfaults:7.0f} |"
        print(line)
    # Every preset of one kernel variant runs the same branch-free code (formats are data), so differences
    # between presets are mostly noise: the median over presets is the steadier figure per rounding mode.
    formats = set(args.formats.split(","))
    for rounding in args.roundings.split(","):
        ratios = [(t[5], t[6]) for t in table if t[0] in formats and t[1] == rounding]  # (wall, CPU) x clone
        summary = (f"median over presets, {rounding}: {statistics.median(w for w, _ in ratios):.2f}x clone "
                   f"(worst {max(w for w, _ in ratios):.2f}x)")
        if cpu:
            summary += f" (CPU time {statistics.median(c for _, c in ratios):.2f}x)"
        else:  # same bytes read and written as the copy, so 1 / ratio is the share of its bandwidth
            summary += (f"; bandwidth {100 / statistics.median(w for w, _ in ratios):.0f}% of the copy's "
                        f"(lowest {100 / max(w for w, _ in ratios):.0f}%)")
        print(summary)
    if not cpu:
        print(f"copy bandwidth (read + write): {2 * x.element_size() * n / clone_ms[0] / 1e6:.0f} GB/s")

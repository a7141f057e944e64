"""Speed of quantize on a large float32 tensor, as a ratio to x.clone() measured in the same process.

Every preset × rounding mode, beside torch's native low-precision round-trip casts and ml_dtypes' round trips.
The first call of each rounding mode compiles its kernel (reported separately, not timed in the table).
Usage: python -m altgrad.bench quantize [--log2n 24] [--repeats 7] [--device cpu|cuda] [--formats e4m3,e5m2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from altgrad.quant import ROUNDINGS, get_format, list_formats, quantize

_TORCH_CASTS = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2", "bf16": "bfloat16", "fp16": "float16"}
_ML_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e3m4", "float8_e4m3")


def _timer(device: torch.device) -> Callable[[Callable[[], object], int, int], tuple[float, float]]:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def median_ms(fn: Callable[[], object], repeats: int, warmup: int) -> tuple[float, float]:
        """Median wall-clock and median process-CPU milliseconds (CPU time is steadier on a shared machine)."""
        for _ in range(warmup):
            fn()
        sync()
        wall, cpu = [], []
        for _ in range(repeats):
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            sync()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3

    return median_ms


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m altgrad.bench quantize", description=__doc__.splitlines()[0])
    p.add_argument("--log2n", type=int, default=24, help="tensor of 2^log2n float32 elements (default 24)")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per row; the median is reported (>= 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs before timing")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--formats", default=",".join(list_formats()), help="comma-separated preset names")
    p.add_argument("--roundings", default=",".join(ROUNDINGS), help="comma-separated rounding modes")
    args = p.parse_args(argv)
    if args.repeats < 5:
        p.error(f"--repeats={args.repeats} is not valid; valid: an integer >= 5")
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
    n = 1 << args.log2n
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n, device=device, generator=gen) * torch.exp2(
        torch.randint(-20, 20, (n,), device=device, generator=gen).float())
    median_ms = _timer(device)
    rows: list[tuple[str, str, tuple[float, float]]] = []

    def row(label: str, mode: str, fn: Callable[[], object]) -> tuple[float, float]:
        ms = median_ms(fn, args.repeats, args.warmup)
        rows.append((label, mode, ms))
        return ms

    compile_s = {}
    for rounding in args.roundings.split(","):
        t0 = time.perf_counter()
        quantize(x[:4096], get_format("e4m3"), rounding)  # compile (all formats share the kernel)
        quantize(x, get_format("e4m3"), rounding)
        compile_s[rounding] = time.perf_counter() - t0

    clone_ms = row("x.clone()", "-", lambda: x.clone())
    for name in args.formats.split(","):
        fmt = get_format(name)
        for rounding in args.roundings.split(","):
            row(name, rounding, lambda f=fmt, r=rounding: quantize(x, f, r))
    for label, dt in _TORCH_CASTS.items():
        dtype = getattr(torch, dt)
        row(f"torch {dt}", "round trip", lambda d=dtype: x.to(d).to(torch.float32))
    if device.type == "cpu":
        import ml_dtypes

        xn = x.numpy()
        for dt in _ML_DTYPES:
            dtype = getattr(ml_dtypes, dt)
            row(f"ml_dtypes {dt}", "round trip", lambda d=dtype: xn.astype(d).astype(np.float32))
    # clone again at the end: the reference is the mean of both, so slow drift of a shared machine evens out
    late = median_ms(lambda: x.clone(), args.repeats, 1)
    clone_ms = ((clone_ms[0] + late[0]) / 2, (clone_ms[1] + late[1]) / 2)
    rows[0] = ("x.clone()", "-", clone_ms)

    print(f"quantize benchmark: {n:,} float32 elements (2^{args.log2n}) on {device}, "
          f"{torch.get_num_threads()} threads, median of {args.repeats} runs after {args.warmup} warm-up, "
          f"torch {torch.__version__}")
    print("compile (first call, not in the table): "
          + ", ".join(f"{r} {s:.1f} s" for r, s in compile_s.items()))
    cpu = device.type == "cpu"
    head = f"| {'what':<26} | {'rounding':<11} | {'ms':>8} | {'Gelem/s':>8} | {'x clone':>8} |"
    rule = f"|{'-' * 28}|{'-' * 13}|{'-' * 10}|{'-' * 10}|{'-' * 10}|"
    if cpu:
        head += f" {'CPU ms':>8} | {'CPU x clone':>11} |"
        rule += f"{'-' * 10}|{'-' * 13}|"
    print(head)
    print(rule)
    for label, mode, (ms, cms) in rows:
        line = f"| {label:<26} | {mode:<11} | {ms:8.2f} | {n / ms / 1e6:8.3f} | {ms / clone_ms[0]:7.2f}x |"
        if cpu:
            line += f" {cms:8.2f} | {cms / clone_ms[1]:10.2f}x |"
        print(line)
    # Every preset runs the same branch-free kernel (formats are data), so differences between presets are noise:
    # the median over presets is the steadier figure per rounding mode.
    formats = set(args.formats.split(","))
    for rounding in args.roundings.split(","):
        wall = statistics.median(ms for label, mode, (ms, _) in rows if label in formats and mode == rounding)
        cpu_ms = statistics.median(c for label, mode, (_, c) in rows if label in formats and mode == rounding)
        summary = f"median over presets, {rounding}: {wall / clone_ms[0]:.2f}x clone"
        print(summary + (f" (CPU time {cpu_ms / clone_ms[1]:.2f}x)" if cpu else ""))

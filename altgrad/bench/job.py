"""Whole training jobs through the real entry point: wall, warm-up and steady throughput, as ratios to the fp32 job.

    python -m altgrad.bench job [--rounds 3] [--steps 300] [--only NAME,...] [--set KEY=VALUE ...]
                                [--markdown PATH] [--keep DIR]

Every configuration is one ``python -m altgrad.train`` subprocess, as a researcher runs it (default diagnostics,
W&B offline, checkpoints, the sample at the end); the configurations of one round run one after the other, in an
order rotated every round so drift on a shared machine hits them alike, and the table gives medians over rounds
with their spread. Columns:

- wall: the whole process, launch to exit (for a sweep's second job: from the first job's end of training to the
  sweep's exit, i.e. what one more job adds to a sweep);
- warm-up: process start (or, for the sweep row, the first job's end of training) to the first optimizer step done
  (interpreter start-up, imports, data, model, the sanity validation and the first step's compiles);
- steady tokens/s: over the second half of the steps (the run's ``timing`` in summary.json, module.JobClock);
- ratio: the configuration's wall over the fp32 job's wall of the same round, median over rounds;
- phases: start-up (to fit start), the first step, all steps, validation, and after training (fit end to exit:
  the final sample, W&B's finish, summary.json, interpreter exit).

The reference row is a plain PyTorch loop of the same model and recipe (``altgrad.bench._reference_loop``).
Targets (issue 20) are printed next to the ratios they apply to.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Job:
    """One configuration of the bench: overrides of a training job, or the plain reference loop, or a sweep."""

    name: str
    overrides: tuple[str, ...] = ()
    kind: str = "run"  # run | reference | sweep
    target: str | None = None  # "wall<=1.15" (ratio of walls to fp32) or "tps>=0.95" (steady tokens/s to fp32)
    default: bool = True  # False: run only when named in --only
    env: tuple[tuple[str, str], ...] = ()  # environment variables of this job


JOBS: tuple[Job, ...] = (
    Job("fp32"),
    Job("fp32 callbacks=none", ("callbacks=none",)),
    Job("plain PyTorch loop", kind="reference"),
    Job("e4m3", ("format=e4m3",), target="wall<=1.15"),
    Job("e4m3 callbacks=none", ("format=e4m3", "callbacks=none"), target="wall<=1.10"),
    Job("e4m3 stochastic", ("format=e4m3", "format.rounding=stochastic"), target="wall<=1.20"),
    Job("e5m2 manifold master=none", ("format=e5m2", "optimizer=manifold", "quant.master=none"),
        target="wall<=1.25"),
    Job("e4m3 callbacks=full", ("format=e4m3", "callbacks=full"), target="wall<=1.35"),
    Job("e4m3 sweep job 2 (basic)", ("format=e4m3",), kind="sweep"),
    Job("e4m3 sweep job 2 (joblib)", ("format=e4m3", "hydra/launcher=joblib", "hydra.launcher.n_jobs=1"),
        kind="sweep"),
    # the quantizer calls on the torch.compile'd road instead of the native CPU kernel (what the kernel buys a job)
    Job("e4m3 compiled road", ("format=e4m3",), default=False, env=(("ALTGRAD_NATIVE", "0"),)),
    # the CPU preset refuses trainer.compile=true; these rows are the measurement behind that
    Job("fp32 compile", ("trainer.compile=true",), default=False, env=(("ALTGRAD_CPU_COMPILE", "1"),)),
    Job("e4m3 compile", ("format=e4m3", "trainer.compile=true"), default=False,
        env=(("ALTGRAD_CPU_COMPILE", "1"),)),
)
BASE = "fp32"
SWEEP_SEEDS = "seed=1337,1338"


@dataclass
class Sample:
    """What one job of one round measured (seconds; tokens/s)."""

    wall: float
    warmup: float | None
    steady_tps: float | None
    startup: float | None
    first_step: float | None
    steps: float | None
    validation: float | None
    after_fit: float | None


@dataclass
class Results:
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    ratios: dict[str, list[float]] = field(default_factory=dict)


def _launch(job: Job, out: Path, steps: int, extra: list[str]) -> tuple[list[str], Path]:
    """The command line of one job and the folder its summary.json lands in (job 2's for a sweep)."""
    common = [f"trainer.max_steps={steps}", *job.overrides, *extra]
    if job.kind == "reference":
        return [sys.executable, "-m", "altgrad.bench._reference_loop", str(out / "summary.json"), *common], out
    if job.kind == "sweep":
        return ([sys.executable, "-m", "altgrad.train", "-m", SWEEP_SEEDS, *common, f"hydra.sweep.dir={out}"],
                out / "1")
    return [sys.executable, "-m", "altgrad.train", *common, f"hydra.run.dir={out}"], out


def run_job(job: Job, out: Path, steps: int, extra: list[str], env: dict[str, str]) -> Sample:
    """Run one job to its end and read what it recorded; a failed job stops the bench with its error."""
    cmd, summary_dir = _launch(job, out, steps, extra)
    out.mkdir(parents=True, exist_ok=True)
    launched = time.time()
    proc = subprocess.run(cmd, cwd=REPO, env={**env, **dict(job.env)}, capture_output=True, text=True)
    exited = time.time()
    (out / "bench.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise SystemExit(f"error: job {job.name!r} exited with {proc.returncode}:\n  " + "\n  ".join(tail))
    timing = json.loads((summary_dir / "summary.json").read_text())["timing"]
    if job.kind == "sweep":  # job 2 counts from the first job's end of training
        origin = json.loads((out / "0" / "summary.json").read_text())["timing"]["fit_end_unix"]
    else:
        origin = timing.get("process_start_unix") or launched
    first = timing.get("first_step_unix")
    return Sample(wall=exited - origin, warmup=None if first is None else first - origin,
                  steady_tps=timing.get("steady_tokens_per_second"),
                  startup=timing.get("startup_seconds") if job.kind != "sweep" else None,
                  first_step=timing.get("first_step_seconds"), steps=timing.get("steps_seconds"),
                  validation=timing.get("validation_seconds"), after_fit=exited - timing["fit_end_unix"])


def folder(name: str) -> str:
    """A run-dir name for a configuration that Hydra's override grammar accepts as a path (letters, digits, -_.)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip("_")


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _spread(values: list[float | None]) -> str:
    vals = [v for v in values if v is not None]
    return f"{min(vals):.1f}–{max(vals):.1f}" if len(vals) > 1 else ""


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def verdict(target: str | None, wall_ratio: float | None, tps_ratio: float | None) -> str:
    """'met' / 'missed' against a target such as 'wall<=1.15' or 'tps>=0.95' ('' without a target)."""
    if target is None:
        return ""
    op = "<=" if "<=" in target else ">="
    what, bound = target.split(op)
    value = wall_ratio if what == "wall" else tps_ratio
    if value is None:
        return f"{target}: unmeasured"
    ok = value <= float(bound) if op == "<=" else value >= float(bound)
    return f"{target}: {'met' if ok else 'missed'}"


def table(results: Results, jobs: list[Job], rounds_done: int, markdown: bool = False) -> str:
    """The bench's two tables (overview and phases) over the rounds measured so far."""
    base = results.samples.get(BASE, [])
    base_tps = _median([s.steady_tps for s in base])
    ref_tps = _median([s.steady_tps for s in results.samples.get("plain PyTorch loop", [])])
    head = ["configuration", "wall s", "spread", "× fp32 wall", "warm-up s", "warm-up − fp32", "steady tok/s",
            "× fp32 tok/s", "target"]
    rows = []
    base_warm = _median([s.warmup for s in base])
    for job in jobs:
        samples = results.samples.get(job.name, [])
        if not samples:
            continue
        wall = _median([s.wall for s in samples])
        ratio = _median(results.ratios.get(job.name, []))
        warm = _median([s.warmup for s in samples])
        tps = _median([s.steady_tps for s in samples])
        tps_ratio = tps / base_tps if tps and base_tps else None
        if job.name == BASE and ref_tps:  # the fp32 job's steady throughput against the plain loop's
            of_plain = tps / ref_tps if tps else None
            target_text = f"{_fmt(of_plain, '.3f')} × plain loop tok/s; {verdict('tps>=0.95', None, of_plain)}"
        elif job.name == "fp32 callbacks=none":  # what the default diagnostics cost an fp32 job
            own = _median([b.wall / s.wall for b, s in zip(base, samples)])
            target_text = f"fp32 / this = {_fmt(own, '.3f')}; {verdict('wall<=1.05', own, None)}"
        else:
            target_text = verdict(job.target, ratio, tps_ratio)
        rows.append([job.name, _fmt(wall, ".1f"), _spread([s.wall for s in samples]), _fmt(ratio, ".3f"),
                     _fmt(warm, ".1f"), _fmt(None if warm is None or base_warm is None else warm - base_warm, "+.1f"),
                     _fmt(tps, ".0f"), _fmt(tps_ratio, ".3f"), target_text])
    phase_head = ["configuration", "start-up s", "first step s", "steps s", "validation s", "after training s"]
    phases = []
    for job in jobs:
        samples = results.samples.get(job.name, [])
        if samples:
            phases.append([job.name] + [_fmt(_median([getattr(s, f) for s in samples]), ".1f")
                                        for f in ("startup", "first_step", "steps", "validation", "after_fit")])
    title = f"Whole jobs, medians over {rounds_done} round(s)"
    return "\n".join([title, "", _grid(head, rows, markdown), "", "Phases (medians)", "",
                      _grid(phase_head, phases, markdown)])


def _grid(head: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in
                                                              range(len(head))) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" if i in (0, len(widths) - 1) else f"{{:>{w}}}" for i, w in enumerate(widths))
    return "\n".join(fmt.format(*r).rstrip() for r in [head, *rows])


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - platforms without getloadavg
        return "unknown"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m altgrad.bench job", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every configuration (median over them)")
    parser.add_argument("--steps", type=int, default=300, help="trainer.max_steps of every job (default job: 300)")
    names = [j.name for j in JOBS]
    parser.add_argument("--only", default=None,
                        help="comma-separated configurations (fp32 is always run: the ratios' base; the compile "
                             "rows only when named); valid: " + ", ".join(names))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override added to every job (repeatable), e.g. --set data.batch_size=12")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the final tables as markdown here")
    parser.add_argument("--keep", type=Path, default=None, help="keep the jobs' run dirs under this folder")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.steps < 2:
        raise SystemExit("error: --rounds must be >= 1 and --steps >= 2 (steady throughput needs two steps)")
    jobs = [j for j in JOBS if j.default]
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        unknown = [w for w in wanted if w not in names]
        if unknown:
            raise SystemExit(f"error: --only {', '.join(map(repr, unknown))}: no such configuration; valid: "
                             + ", ".join(names))
        jobs = [j for j in JOBS if j.name == BASE or j.name in wanted]
    bad = [s for s in args.set if "=" not in s or s.startswith(("trainer.max_steps=", "hydra.run.dir="))]
    if bad:
        raise SystemExit(f"error: --set {bad[0]!r}: expected KEY=VALUE (not trainer.max_steps: use --steps, "
                         "not hydra.run.dir: the bench places the run dirs)")

    env = dict(os.environ)
    env.setdefault("WANDB_MODE", "offline")
    env.setdefault("WANDB_SILENT", "true")
    work = args.keep or Path(tempfile.mkdtemp(prefix="altgrad-bench-job-"))
    load_before = _load()
    print(f"job bench: {len(jobs)} configurations x {args.rounds} rounds, {args.steps} steps each, "
          f"{os.cpu_count()} CPUs, load average {load_before} (1/5/15 min); extra overrides: {args.set or 'none'}",
          flush=True)
    results = Results()
    try:
        for r in range(args.rounds):
            order = jobs[r % len(jobs):] + jobs[:r % len(jobs)]
            walls: dict[str, float] = {}
            for job in order:
                sample = run_job(job, work / f"round{r}" / folder(job.name), args.steps, args.set, env)
                results.samples.setdefault(job.name, []).append(sample)
                walls[job.name] = sample.wall
                print(f"  round {r + 1}: {job.name}: wall {sample.wall:.1f} s, warm-up "
                      f"{_fmt(sample.warmup, '.1f')} s, steady {_fmt(sample.steady_tps, '.0f')} tok/s", flush=True)
            for name, wall in walls.items():
                results.ratios.setdefault(name, []).append(wall / walls[BASE])
            print("\n" + table(results, jobs, r + 1) + "\n", flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"load average before {load_before}, after {_load()} (1/5/15 min)")
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table(results, jobs, args.rounds, markdown=True) + "\n")

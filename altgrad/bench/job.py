"""Whole training jobs through the real entry point, as users run them: wall, warm-up and steady throughput, as
ratios to the fp32 job, at the machine's default thread count and at one thread, on the default job and on a
small-step recipe.

    python -m altgrad.bench job [--rounds 3] [--steps 300] [--small-steps 1000] [--threads default,1]
                                [--recipes default,small] [--only NAME,...] [--set KEY=VALUE ...]
                                [--order rotated|bracketed] [--markdown PATH] [--record PATH] [--keep DIR]
                                [--no-calls] [--note TEXT]

``python -m altgrad.bench job --markdown docs/benchmarks/job.md`` regenerates the whole page.

Every configuration is one ``python -m altgrad.train`` subprocess, as a researcher runs it (default diagnostics,
W&B offline, checkpoints, the sample at the end). A *setting* is a recipe at a thread count: ``default`` (the
default job, ``--steps`` steps of 16 × 128 tokens) or ``small`` (block 64, batch 12: 768 tokens a step, the
char-level CPU recipe of issue 31: lr 1e-3, warm-up 100, cosine to 1e-4, ``--small-steps`` steps), with torch's
default threads (``OMP_NUM_THREADS`` unset: what ``make train`` gets) or one (``OMP_NUM_THREADS=1``). One round runs
every configuration of every setting once, in an order rotated every round so drift on a shared machine hits them
alike (``--order bracketed``: the fp32 job also before each configuration and once more at the end, each ratio
paired with the fp32 jobs run just before and after it, as the host's drift is shared by neighbouring jobs); the
tables give medians over rounds with their spread (ratios: geometric means of the per-round pairs), and each target
is judged on the per-round paired ratios (``altgrad.bench.paired``: met or missed only when the 95 % interval clears
the bound). ``--record`` keeps every finished job (``altgrad.bench.job_record``), so a stopped bench goes on and
rounds from several quiet sittings pool. Columns:

- wall: the whole process, launch to exit (for a sweep's second job: from the first job's end of training to the
  sweep's exit, i.e. what one more job adds to a sweep);
- warm-up: process start (or, for the sweep row, the first job's end of training) to the first optimizer step done;
- steady tokens/s: over the second half of the steps (the run's ``timing`` in summary.json, module.JobClock);
- × fp32 wall: the configuration's wall over the fp32 job's wall of the same round and setting, geometric mean over
  rounds;
- fp32 tok/s ÷ this: the fp32 job's steady tokens/s over this one's, per round, geometric mean (a slowdown);
- phases: start-up (to fit start), the first step, all steps, validation, and after training.

On a CUDA machine, ``--set trainer=gpu --set model=gpt_50m`` (``make bench-gpu-job``) runs the same jobs on the GPU
preset: the one target there is the quantized bf16 job's steady tokens/s ≥ 0.85 × the bf16 job's, and a steady-MFU
column appears wherever the jobs have a ``trainer.peak_flops``.

The reference row is a plain PyTorch loop of the same model and recipe (``altgrad.bench._reference_loop``). Targets
(issue 31) apply to both ratios, in every setting. With ``--markdown`` the page also gets the quantizer's per-call
cost from ``python -m altgrad.bench calls`` (unless ``--no-calls``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from altgrad.bench import job_record
from altgrad.bench.paired import Judgement, combine, judge, settle_text

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Job:
    """One configuration of the bench: overrides of a training job, or the plain reference loop, or a sweep."""

    name: str
    overrides: tuple[str, ...] = ()
    kind: str = "run"  # run | reference | sweep
    target: float | None = None  # the most both ratios to the fp32 job may be (issue 31)
    default: bool = True  # False: run only when named in --only


JOBS: tuple[Job, ...] = (
    Job("fp32"),
    Job("fp32 callbacks=none", ("callbacks=none",)),
    Job("plain PyTorch loop", kind="reference"),
    Job("e4m3", ("format=e4m3",), target=1.10),
    Job("e4m3 callbacks=none", ("format=e4m3", "callbacks=none"), target=1.05),
    Job("e4m3 stochastic", ("format=e4m3", "format.rounding=stochastic"), target=1.15),
    Job("e5m2 manifold master=none", ("format=e5m2", "optimizer=manifold", "quant.master=none"), target=1.20),
    Job("e4m3 callbacks=full", ("format=e4m3", "callbacks=full"), default=False),
    Job("e4m3 sweep job 2 (basic)", ("format=e4m3",), kind="sweep", default=False),
    Job("e4m3 sweep job 2 (joblib)", ("format=e4m3", "hydra/launcher=joblib", "hydra.launcher.n_jobs=1"),
        kind="sweep", default=False),
    # the quantizer calls on the torch.compile'd road instead of the native CPU kernel (what the kernel buys a job)
    Job("e4m3 compiled road", ("format=e4m3", "quant.kernel=compiled"), default=False),
    # ManifoldAdamW's step through torch.compile instead of its native twin (what the native step buys a job)
    Job("e5m2 manifold master=none compiled step", ("format=e5m2", "optimizer=manifold", "quant.master=none",
                                                     "optimizer.kernel=compiled"), default=False),
    # the CPU preset refuses trainer.compile=true; these rows are the measurement behind that
    Job("fp32 compile", ("trainer.compile=force",), default=False),
    Job("e4m3 compile", ("format=e4m3", "trainer.compile=force"), default=False),
)
BASE = "fp32"
REFERENCE = "plain PyTorch loop"
PLAIN_TARGET = 0.95  # the fp32 job's steady tokens/s over the plain loop's, at least
GPU_TARGET = 0.85  # on a GPU (--set trainer=gpu): the quantized bf16 job's steady tok/s over the bf16 job's, at least
GPU_TARGETED = "e4m3"  # the quantized bf16 job of that target (default diagnostics)
SWEEP_SEEDS = "seed=1337,1338"
RECIPES: dict[str, tuple[str, ...]] = {
    "default": (),
    # issue 31's char-level CPU recipe on the embedded corpus: block 64, batch 12, the nano model (4 × 4 × 128),
    # lr 1e-3 (the baseline's, so every arm's plain groups take it too), warm-up 100, cosine to 1e-4
    "small": ("model.block_size=64", "data.batch_size=12", "baseline.lr=1e-3", "schedule.warmup_steps=100",
              "schedule.min_lr_ratio=0.1"),
}
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class Setting:
    """A recipe at a thread count (None: torch's default, OMP_NUM_THREADS unset)."""

    recipe: str
    steps: int
    threads: int | None

    @property
    def label(self) -> str:
        threads = "default threads" if self.threads is None else f"{self.threads} thread" + "s" * (self.threads > 1)
        return f"{self.recipe} recipe, {threads}"

    def env(self, base: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in base.items() if k not in THREAD_VARS}
        if self.threads is not None:
            env.update({k: str(self.threads) for k in THREAD_VARS})
        return env


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
    steady_mfu: float | None = None  # with trainer.peak_flops set (the GPU presets)
    round: int = 0  # the round it ran in: ratios pair samples of the same round
    seq: int | None = None  # its place in its setting's order that round (None: a record from before --order)


def _neighbours(sample: Sample, others: list[Sample]) -> list[Sample]:
    """The samples of ``others`` (one configuration, one round) that ``sample`` is paired with: the nearest one run
    before it and the nearest one run after it (one or two), or the round's first where places are not recorded."""
    if sample.seq is None or any(o.seq is None for o in others):
        return others[:1]
    same = [o for o in others if o.seq == sample.seq]  # the sample itself (a configuration paired with itself)
    if same:
        return same
    before = [o for o in others if o.seq < sample.seq]
    after = [o for o in others if o.seq > sample.seq]
    return ([max(before, key=lambda o: o.seq)] if before else []) + ([min(after, key=lambda o: o.seq)] if after else [])


@dataclass
class Results:
    """Samples by configuration name (one setting), each knowing its round."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)

    def pairs(self, name: str, base: str, ratio: Callable[[Sample, Sample], float | None]) -> list[float | None]:
        """One ``ratio(sample, base_sample)`` for every round in which both configurations ran. Where one of the two
        ran several times that round (the fp32 job of a bracketed round), the other's sample is paired with its
        neighbours among them, the one run just before and the one just after: the geometric mean of those ratios,
        since the host's speed drifts slowly and neighbouring jobs share most of it."""
        mine = self.samples.get(name, [])
        theirs = self.samples.get(base, [])
        out: list[float | None] = []
        for r in dict.fromkeys(a.round for a in mine):
            a_round = [a for a in mine if a.round == r]
            b_round = [b for b in theirs if b.round == r]
            if not b_round:
                continue
            if len(a_round) == 1:
                ratios = [ratio(a_round[0], b) for b in _neighbours(a_round[0], b_round)]
            else:  # this configuration is the repeated one: pair the other's one sample with its neighbours here
                ratios = [ratio(a, b_round[0]) for a in _neighbours(b_round[0], a_round)]
            out.append(None if any(x is None for x in ratios) else _geomean(ratios))
        return out


def _wall_ratio(a: Sample, base: Sample) -> float:
    return a.wall / base.wall


def _slowdown(a: Sample, base: Sample) -> float | None:
    """The base's steady tokens/s over this sample's (a slowdown, like the wall ratio)."""
    return base.steady_tps / a.steady_tps if a.steady_tps and base.steady_tps else None


def _share(a: Sample, base: Sample) -> float | None:
    """This sample's steady tokens/s over the base's."""
    return a.steady_tps / base.steady_tps if a.steady_tps and base.steady_tps else None


ORDERS = ("rotated", "bracketed")


def round_order(jobs: list[Job], shift: int, order: str) -> list[Job]:
    """One setting's jobs for one round, in the order they run: ``rotated``, every configuration once, starting
    ``shift`` places further each round; ``bracketed``, the same rotation of the other configurations with the fp32
    job before each and once more at the end (fp32, A, fp32, B, …, fp32), so every ratio pairs jobs run side by side."""
    if order not in ORDERS:
        raise SystemExit(f"error: --order {order!r}: valid: {', '.join(ORDERS)}")
    if order == "rotated":
        return jobs[shift % len(jobs):] + jobs[:shift % len(jobs)]
    base = [j for j in jobs if j.name == BASE]
    others = [j for j in jobs if j.name != BASE]
    if not others:
        return base
    shift %= len(others)
    rotated = others[shift:] + others[:shift]
    return [job for other in rotated for job in (*base, other)] + base


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
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    exited = time.time()
    (out / "bench.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise SystemExit(f"error: job {job.name!r} exited with {proc.returncode}:\n  " + "\n  ".join(tail))
    summary = json.loads((summary_dir / "summary.json").read_text())
    timing = summary["timing"]
    if job.kind == "sweep":  # job 2 counts from the first job's end of training
        origin = json.loads((out / "0" / "summary.json").read_text())["timing"]["fit_end_unix"]
    else:
        origin = timing.get("process_start_unix") or launched
    first = timing.get("first_step_unix")
    return Sample(wall=exited - origin, warmup=None if first is None else first - origin,
                  steady_tps=timing.get("steady_tokens_per_second"),
                  startup=timing.get("startup_seconds") if job.kind != "sweep" else None,
                  first_step=timing.get("first_step_seconds"), steps=timing.get("steps_seconds"),
                  validation=timing.get("validation_seconds"), after_fit=exited - timing["fit_end_unix"],
                  steady_mfu=summary.get("steady_mfu"))


def folder(name: str) -> str:
    """A run-dir name for a configuration that Hydra's override grammar accepts as a path (letters, digits, -_.)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip("_")


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _geomean(ratios: list[float | None]) -> float | None:
    """The geometric mean of per-round ratios: the estimate a target is judged on (``paired.judge``)."""
    logs = [math.log(r) for r in ratios if r is not None and r > 0 and math.isfinite(r)]
    return math.exp(sum(logs) / len(logs)) if logs else None


def _spread(values: list[float | None]) -> str:
    vals = [v for v in values if v is not None]
    return f"{min(vals):.1f}–{max(vals):.1f}" if len(vals) > 1 else ""


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


@dataclass
class Row:
    """One configuration's medians in one setting, and its target's judgements on the per-round paired ratios."""

    job: Job
    wall: float | None
    spread: str
    wall_ratio: float | None  # geometric mean of the per-round wall ratios to the fp32 job
    warmup: float | None
    tps: float | None
    slowdown: float | None  # the fp32 job's steady tokens/s over this one's (geometric mean over rounds)
    of_plain: float | None  # this one's steady tokens/s over the plain loop's (fp32 only; geometric mean)
    mfu: float | None = None  # steady MFU (median), where the jobs had a peak to divide by
    gpu: bool = False  # measured on a GPU: only GPU_TARGET applies
    judged: tuple[Judgement, ...] = ()  # the ratios its target applies to, judged against the bound

    def check(self) -> tuple[str, str]:
        """(the target as text, its verdict) for this row; ('', '') where none applies."""
        if not self.judged:
            return "", ""
        if self.gpu:
            return f"tok/s ≥ {GPU_TARGET:.2f} × fp32", combine(*self.judged)
        if self.job.name == BASE:
            return f"tok/s ≥ {PLAIN_TARGET:.2f} × plain loop", combine(*self.judged)
        return f"≤ {self.job.target:.2f} ×", combine(*self.judged)

    def evidence(self) -> str:
        """The judged ratios with their 95 % intervals, the verdict, and for an unsettled one what would settle it."""
        ok = self.check()[1]
        if self.gpu or self.job.name == BASE:
            text = f"{self.judged[0].text()} ×"
        else:
            text = f"wall {self.judged[0].text()}, tok/s {self.judged[1].text()}"
        return f"{text}: {ok}" + (f" ({settle_text(*self.judged)})" if ok == "unsettled" else "")


def _judged(results: Results, job: Job, gpu: bool) -> tuple[Judgement, ...]:
    """The per-round ratios this configuration's target applies to, judged (none where no target applies)."""
    if gpu:
        if job.name != GPU_TARGETED:
            return ()
        return (judge(results.pairs(job.name, BASE, _share), GPU_TARGET, at_least=True),)
    if job.name == BASE:
        if REFERENCE not in results.samples:
            return ()
        return (judge(results.pairs(BASE, REFERENCE, _share), PLAIN_TARGET, at_least=True),)
    if job.target is None:
        return ()
    return (judge(results.pairs(job.name, BASE, _wall_ratio), job.target),
            judge(results.pairs(job.name, BASE, _slowdown), job.target))


def rows(results: Results, jobs: list[Job], gpu: bool = False) -> list[Row]:
    """Every configuration measured so far: medians of its own numbers, geometric means of its per-round ratios
    (the estimates its target is judged on); ``gpu``: judged by GPU_TARGET alone."""
    out = []
    for job in jobs:
        samples = results.samples.get(job.name, [])
        if not samples:
            continue
        out.append(Row(job, _median([s.wall for s in samples]), _spread([s.wall for s in samples]),
                       _geomean(results.pairs(job.name, BASE, _wall_ratio)), _median([s.warmup for s in samples]),
                       _median([s.steady_tps for s in samples]), _geomean(results.pairs(job.name, BASE, _slowdown)),
                       _geomean(results.pairs(BASE, REFERENCE, _share)) if job.name == BASE else None,
                       _median([s.steady_mfu for s in samples]), gpu, _judged(results, job, gpu)))
    return out


def table(results: Results, jobs: list[Job], markdown: bool = False, gpu: bool = False) -> str:
    """One setting's two tables (overview and phases) over the rounds measured so far; a steady-MFU column where the
    jobs recorded one."""
    measured = rows(results, jobs, gpu)
    with_mfu = any(r.mfu is not None for r in measured)
    head = ["configuration", "wall s", "spread", "× fp32 wall", "warm-up s", "steady tok/s", "fp32 tok/s ÷ this",
            *(["steady MFU"] * with_mfu), "target", "verdict"]
    body = []
    for r in measured:
        target, ok = r.check()
        if r.job.name == BASE and not gpu:
            target = f"{_fmt(r.of_plain, '.3f')} × plain loop tok/s; ≥ {PLAIN_TARGET:.2f}"
        mfu = [_fmt(None if r.mfu is None else 100 * r.mfu, ".2f") + " %" * (r.mfu is not None)] * with_mfu
        body.append([r.job.name, _fmt(r.wall, ".1f"), r.spread, _fmt(r.wall_ratio, ".3f"), _fmt(r.warmup, ".1f"),
                     _fmt(r.tps, ".0f"), _fmt(r.slowdown, ".3f"), *mfu, target, ok])
    phase_head = ["configuration", "start-up s", "first step s", "steps s", "validation s", "after training s"]
    phases = []
    for job in jobs:
        samples = results.samples.get(job.name, [])
        if samples:
            phases.append([job.name] + [_fmt(_median([getattr(s, f) for s in samples]), ".1f")
                                        for f in ("startup", "first_step", "steps", "validation", "after_fit")])
    return "\n".join([_grid(head, body, markdown), "", "Phases (medians, seconds):", "",
                      _grid(phase_head, phases, markdown)])


def targets_table(results: dict[Setting, Results], jobs: list[Job], markdown: bool = False, gpu: bool = False) -> str:
    """Every target (rows) in every setting (columns): the paired ratios it applies to (geometric mean over rounds,
    95 % interval) and the verdict."""
    settings = list(results)
    head = ["target (issue 31)"] + [s.label for s in settings]
    body = []
    by_setting = {s: {r.job.name: r for r in rows(results[s], jobs, gpu)} for s in settings}
    for job in jobs:
        if gpu and job.name != GPU_TARGETED or not gpu and job.name != BASE and job.target is None:
            continue
        line = []
        for s in settings:
            r = by_setting[s].get(job.name)
            line.append("not run" if r is None or not r.judged else r.evidence())
        if gpu:
            what = f"`{GPU_TARGETED}` (quantized bf16) steady tok/s ≥ {GPU_TARGET:.2f} × the fp32 (bf16) job's"
        elif job.name == BASE:
            what = f"fp32 job's steady tok/s ≥ {PLAIN_TARGET:.2f} × the plain loop's"
        else:
            what = f"`{job.name}` ≤ {job.target:.2f} × fp32 (wall and tok/s)"
        body.append([what, *line])
    return _grid(head, body, markdown)


def _grid(head: list[str], body: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in
                                                              range(len(head))) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 or i >= len(widths) - 2 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return "\n".join(fmt.format(*r).rstrip() for r in [head, *body])


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - platforms without getloadavg
        return "unknown"


def hardware() -> str:
    """The CPU model, its count and the memory: what a timing depends on besides the code."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        mem = f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        mem = "memory unknown"
    return f"{cpu}, {os.cpu_count()} CPUs, {mem}"


@functools.cache
def _versions() -> tuple[str, str, str]:
    """torch's and Lightning's versions and torch's default thread count, as a job's process sees them (asked once
    per bench: it costs an interpreter start)."""
    proc = subprocess.run([sys.executable, "-c", "import torch, lightning; print(torch.__version__, "
                           "lightning.__version__, torch.get_num_threads())"], capture_output=True, text=True)
    torch_v, lightning_v, threads = (proc.stdout.split() + ["?"] * 3)[:3]
    return torch_v, lightning_v, threads


@functools.cache
def commit() -> str:
    """The checkout's short commit, '+ local changes' where tracked files differ; 'unknown' without git (a copy of
    the tree on a lent GPU machine)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    return (head.stdout.strip() or "unknown") + (" with local changes" if dirty and head.stdout.strip() else "")


def machine() -> str:
    """One line: CPU model, cores, memory, Python, torch and the commit the page is written at."""
    torch_v, lightning_v, threads = _versions()
    cpu, cpus, mem = hardware().rsplit(", ", 2)
    return (f"{cpu}, {cpus} (torch's default: {threads} threads), {mem}; Python "
            f"{platform.python_version()}, torch {torch_v}, Lightning {lightning_v}; written at commit {commit()}")


def calls_table() -> str:
    """``python -m altgrad.bench calls``'s tables (one torch thread), or a line saying why they are missing."""
    proc = subprocess.run([sys.executable, "-m", "altgrad.bench", "calls"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        return f"(the micro-bench failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]})"
    return "\n".join(line for line in proc.stdout.strip().splitlines() if line.startswith("|") or not line.strip())


PAGE_INTRO = """# job: whole training jobs, as users run them

The speed goals are carried by this bench; the micro-benchmarks ([quantize](quantize.md), [step](step.md),
[optim](optim.md), [callbacks](callbacks.md), and `python -m altgrad.bench calls` below) stay as guards of their
parts. This page is written by one command (every number below comes from it; its jobs take ≈ {minutes} min here):

```
{command}
```

Every configuration is one `python -m altgrad.train` subprocess (default diagnostics, W&B offline, checkpoints, the
200-token sample at the end), in {n_settings} setting(s): {settings}. The recipes: the default job (`make train`,
16 × 128 tokens a step) and the small-step recipe (block 64, batch 12 = 768 tokens a step, lr 1e-3, warm-up 100,
cosine to 1e-4, on the embedded corpus: issue 31's char-level CPU recipe); default threads: `OMP_NUM_THREADS` unset,
what `make train` gets. {order}
The setting tables give medians over {rounds} round(s), the spread of the wall times,
and two ratios to the fp32 job of the same setting, each the geometric mean of the per-round paired ratios (the
estimate the Targets table judges): whole-process wall and steady tokens/s (the fp32 job's over this one's, so both
are slowdowns). **Targets are judged on the per-round paired ratios**: their geometric mean with a 95 % Student-t
interval over rounds (log scale); a target is *met* or *missed* only when the whole interval lies on one side of its
bound, and otherwise *unsettled*, with the rounds that would settle it with 80 % power if today's mean and spread
held (a paired t-test's sample size). {record} The run records where its time goes
(`summary.json["timing"]`, `altgrad.module.JobClock`). The `plain PyTorch loop` row is
`altgrad/bench/_reference_loop.py`: the same GPT, data windows, batch, AdamW groups, schedule, clip and validation
cadence as a nanoGPT-style loop (forward, backward, clip, AdamW step; no Lightning, logger, callbacks, checkpoints).
Rows on request (`--only`): `e4m3 callbacks=full`, sweep job 2, `e4m3 compiled road` (`quant.kernel=compiled`),
`e5m2 manifold master=none compiled step` (`optimizer.kernel=compiled`), `fp32 compile` / `e4m3 compile`
(`trainer.compile=force`). Where the quantized jobs' time goes, and what would close
the gaps this page shows: [job_profile](job_profile.md); which targets today's bits can reach at all, from the
quantizer arithmetic a step cannot do without: `python -m altgrad.bench floor`.
"""


GPU_NOTE = """**On a GPU** (`--set trainer=gpu`): bf16-mixed autocast, TF32, torch.compile of the whole model (the
quantizers traced into its graph); `fp32` is the unquantized bf16 job and the one target is issue 31's: the quantized
bf16 job (`{targeted}`, default diagnostics) at ≥ {target:.2f} × its steady tokens/s. Steady MFU: the steady second
half's tokens/s × the model's training FLOPs per token (6N + 12·L·H·Q·T) over `trainer.peak_flops`. The plain-loop
row is a CPU reference and is not run here unless named."""


def gpu_mode(sets: list[str]) -> bool:
    """Whether the jobs run on the GPU preset (``--set trainer=gpu``)."""
    return "trainer=gpu" in sets


@dataclass
class Provenance:
    """When the page's jobs were measured: by this invocation (with the load around it) or taken from the record."""

    ran: list[str] = field(default_factory=list)  # UTC times the jobs run by this invocation finished
    pooled: list[str] = field(default_factory=list)  # the same for jobs taken from the record
    loads: tuple[str, str] = ("", "")
    code: str | None = None  # the record's code key, where there is a record
    commits: list[str] = field(default_factory=list)  # the commits the jobs ran at (record entries name theirs)

    def text(self) -> str:
        times = sorted(self.ran + self.pooled)
        if not times:
            return "No job measured."
        span = f"{times[0][:16].replace('T', ' ')} – {times[-1][:16].replace('T', ' ')} UTC"
        line = (f"{len(times)} jobs, finished {span}: {len(self.ran)} run by this invocation, {len(self.pooled)} "
                "taken from the record")
        if self.code:
            line += f" (code key {self.code}: the files a timed job runs, `altgrad.bench.job_record`)"
        if self.commits:
            line += "; run at commit " + ", ".join(sorted(set(self.commits)))
        if self.ran:
            line += (f"; load average (1/5/15 min) {self.loads[0]} before this invocation's jobs, {self.loads[1]} "
                     "after (the bench's own job keeps one core or more busy)")
        return line + "."


ROTATED_TEXT = "One round runs every configuration of every setting once, in an order rotated every round."
BRACKETED_TEXT = ("A bracketed round also runs the fp32 job before each configuration and once more at the end "
                  "(fp32, A, fp32, B, …, fp32), and each ratio pairs a job with the fp32 jobs run just before and "
                  "just after it (the geometric mean of the two), since the host's speed drifts slowly and "
                  "neighbouring jobs share most of it.")


def order_text(results: dict[Setting, Results]) -> str:
    """How the page's rounds were ordered: a round with several fp32 jobs was bracketed (a record pools both)."""
    bracketed = rotated = 0
    for res in results.values():
        base_rounds = [smp.round for smp in res.samples.get(BASE, [])]
        for r in set(base_rounds):
            bracketed += base_rounds.count(r) > 1
            rotated += base_rounds.count(r) == 1
    if not bracketed:
        return ROTATED_TEXT
    return (f"{ROTATED_TEXT} {BRACKETED_TEXT} Of the page's rounds (counted over the settings): {rotated} rotated, "
            f"{bracketed} bracketed.")


def page(results: dict[Setting, Results], jobs: list[Job], args: argparse.Namespace, command: str,
         provenance: Provenance, calls: str | None) -> str:
    """The whole of docs/benchmarks/job.md (or, with ``--set trainer=gpu``, its GPU twin)."""
    gpu = gpu_mode(args.set)
    settings = "; ".join(f"{s.label} ({s.steps} steps)" for s in results)
    record = ("" if args.record is None else
              f"Every job's numbers are in `{args.record}` (one JSON line each); rounds measured in several sittings "
              "of the same code, machine and overrides pool there, and rerunning the command goes on where it stopped.")
    minutes = sum(smp.wall for res in results.values() for samples in res.samples.values() for smp in samples) / 60
    parts = [PAGE_INTRO.format(minutes=f"{minutes:.0f}", command=command, n_settings=len(results), settings=settings,
                               rounds=args.rounds, record=record, order=order_text(results)),
             *([GPU_NOTE.format(targeted=GPU_TARGETED, target=GPU_TARGET), ""] if gpu else []),
             *([f"**{args.note}**", ""] if args.note else []),
             f"Machine: {machine()}. {provenance.text()}", "",
             "## Targets", "", targets_table(results, jobs, markdown=True, gpu=gpu), ""]
    for setting, res in results.items():
        parts += [f"## {setting.label} ({setting.steps} steps)", "", table(res, jobs, markdown=True, gpu=gpu), ""]
    if calls is not None:
        parts += ["## The quantizer's per-call cost (`python -m altgrad.bench calls`)", "",
                  "One e4m3 tensor-scaled quantizer, one torch thread, CPU time of the calling thread per call "
                  "(best of 7 loops); each row adds one layer of the call, so the differences say where its fixed "
                  "cost goes. The step rows time the small recipe's training step (forward, backward, AdamW) "
                  "with every Linear quantized (statistics off, as on most steps) against fp32, per quantizer call.",
                  "", calls, ""]
    if not gpu:
        parts += ["GPU (`model=gpt_50m trainer=gpu`, quantized bf16 ≥ 0.85 × bf16 tokens/s, MFU): this bench with "
                  "`--set trainer=gpu --set model=gpt_50m` on a CUDA machine (`make bench-gpu-job`); today's numbers "
                  "and where the time goes: [gpu](gpu.md).", ""]
    return "\n".join(parts)


def _threads(text: str) -> list[int | None]:
    out: list[int | None] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "default":
            out.append(None)
        elif part.isdigit() and int(part) >= 1:
            out.append(int(part))
        else:
            raise SystemExit(f"error: --threads {part!r}: expected 'default' or a count >= 1")
    return out


Place = tuple[Setting, str, int, int | None]
"""A job's place in the bench: setting, configuration, round, and its place in that round's order (None: a record
from before orders were recorded, one job per configuration and round)."""


def pool(entries: list[dict], results: dict[Setting, Results], jobs: list[Job],
         rounds: int) -> dict[Place, dict]:
    """Put a record's entries of these settings, configurations and first ``rounds`` rounds into ``results`` (the
    first entry of each place); returns them by the place they fill, which need not run again."""
    known = {(s.recipe, s.steps, s.threads): s for s in results}
    names = {j.name for j in jobs}
    taken: dict[Place, dict] = {}
    for e in entries:
        setting = known.get((e["setting"]["recipe"], e["setting"]["steps"], e["setting"]["threads"]))
        place = (setting, e["job"], e["round"], e["sample"].get("seq"))
        if setting is None or e["job"] not in names or e["round"] >= rounds or place in taken:
            continue
        results[setting].samples.setdefault(e["job"], []).append(Sample(**e["sample"]))
        taken[place] = e
    return taken


def to_run(plan: list[Job], setting: Setting, round_: int, done: dict[Place, dict]) -> list[tuple[int, Job]]:
    """The places of this round's ``plan`` (one setting) not yet in the record, with the job for each. A round the
    record holds from before orders were recorded counts by configuration, as does a round finished in another order
    (every configuration ran); a round begun in another order and not finished stops the bench (going on in this
    order would pair jobs that did not run side by side)."""
    here = {(name, seq) for (s, name, r, seq) in done if s == setting and r == round_}
    names = {name for name, _ in here}
    if any(seq is None for _, seq in here):
        return [(seq, job) for seq, job in enumerate(plan) if job.name not in names]
    planned = {(job.name, seq) for seq, job in enumerate(plan)}
    if not here <= planned:
        if names >= {job.name for job in plan}:
            return []
        raise SystemExit(f"error: --record: round {round_ + 1} of the {setting.label} was begun in another order "
                         f"(--order, --only) than this command's; rerun it as it was begun ({', '.join(ORDERS)})")
    return [(seq, job) for seq, job in enumerate(plan) if (job.name, seq) not in here]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m altgrad.bench job", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every configuration (median over them)")
    parser.add_argument("--steps", type=int, default=300, help="trainer.max_steps of the default recipe (300)")
    parser.add_argument("--small-steps", type=int, default=1000, help="trainer.max_steps of the small recipe")
    parser.add_argument("--threads", default="default,1", help="thread counts: 'default' (OMP_NUM_THREADS unset) "
                                                               "and/or numbers, comma-separated")
    parser.add_argument("--recipes", default="default,small", help="comma-separated: " + ", ".join(RECIPES))
    names = [j.name for j in JOBS]
    parser.add_argument("--only", default=None,
                        help="comma-separated configurations (fp32 is always run: the ratios' base); valid: "
                             + ", ".join(names))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override added to every job (repeatable), e.g. --set data.batch_size=12")
    parser.add_argument("--markdown", type=Path, default=None, help="write the whole page (docs/benchmarks/job.md)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the jobs' run dirs under this folder")
    parser.add_argument("--record", type=Path, default=None,
                        help="append every finished job to this JSON-lines file and pool the rounds already in it "
                             "(same code, machine and --set): --rounds is then the total, and a stopped bench goes on "
                             "where it stopped")
    parser.add_argument("--order", default="rotated", choices=ORDERS,
                        help="rotated: every configuration once a round, the order rotated every round; bracketed: "
                             "the fp32 job also before each configuration and at the end, each ratio paired with the "
                             "fp32 jobs beside it (more jobs a round, less of the host's drift in each ratio)")
    parser.add_argument("--no-calls", action="store_true", help="leave the per-call micro-bench off the page")
    parser.add_argument("--note", default=None, help="a line printed in bold under the page's introduction (e.g. "
                                                      "how loaded the machine was)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.steps < 2 or args.small_steps < 2:
        raise SystemExit("error: --rounds must be >= 1 and --steps, --small-steps >= 2 (steady throughput needs "
                         "two steps)")
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    unknown = [r for r in recipes if r not in RECIPES]
    if unknown or not recipes:
        raise SystemExit(f"error: --recipes {args.recipes!r}: valid: {', '.join(RECIPES)}")
    threads = _threads(args.threads)
    if not threads:
        raise SystemExit("error: --threads needs at least one of 'default' or a count")
    gpu = gpu_mode(args.set)
    jobs = [j for j in JOBS if j.default and not (gpu and j.kind == "reference")]
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
    settings = [Setting(r, args.steps if r == "default" else args.small_steps, t) for r in recipes for t in threads]

    env = dict(os.environ)
    env.setdefault("WANDB_MODE", "offline")
    env.setdefault("WANDB_SILENT", "true")
    work = args.keep or Path(tempfile.mkdtemp(prefix="altgrad-bench-job-"))
    load_before = _load()
    print(f"job bench: {len(jobs)} configurations x {len(settings)} settings x {args.rounds} rounds, "
          f"{os.cpu_count()} CPUs, load average {load_before} (1/5/15 min); extra overrides: {args.set or 'none'}",
          flush=True)
    results = {s: Results() for s in settings}
    key = record = None
    done: dict[Place, dict] = {}
    provenance = Provenance()
    if args.record is not None:
        record = args.record
        key = job_record.make_key(REPO, args.set, hardware(), " ".join(_versions()[:2]))
        entries, other = job_record.load(record, key)
        provenance.code = key["code"]
        done = pool(entries, results, jobs, args.rounds)
        provenance.pooled = [e.get("time", "") for e in done.values()]
        provenance.commits = [e.get("commit") or "unrecorded" for e in done.values()]
        print(f"record {record}: {len(done)} of {len(jobs) * len(settings) * args.rounds} jobs already measured "
              f"for this code, machine and overrides ({other} other line(s) left out)", flush=True)
    try:
        for r in range(args.rounds):
            for k, setting in enumerate(settings):
                plan = round_order(jobs, r + k, args.order)
                extra = [*RECIPES[setting.recipe], *args.set]
                todo = to_run(plan, setting, r, done)
                for seq, job in todo:
                    repeated = sum(j.name == job.name for j in plan) > 1  # the fp32 job of a bracketed round
                    out = work / f"round{r}" / folder(setting.label) / (folder(job.name) + f"_{seq}" * repeated)
                    sample = dataclasses.replace(run_job(job, out, setting.steps, extra, setting.env(env)), round=r,
                                                 seq=seq)
                    results[setting].samples.setdefault(job.name, []).append(sample)
                    provenance.ran.append(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
                    provenance.commits.append(commit())
                    if record is not None:
                        job_record.append(record, key, {"recipe": setting.recipe, "steps": setting.steps,
                                                        "threads": setting.threads}, job.name, r, sample, commit())
                    print(f"  round {r + 1}, {setting.label}: {job.name}: wall {sample.wall:.1f} s, warm-up "
                          f"{_fmt(sample.warmup, '.1f')} s, steady {_fmt(sample.steady_tps, '.0f')} tok/s", flush=True)
                if todo:
                    print(f"\n{setting.label}, medians over {r + 1} round(s):\n"
                          f"{table(results[setting], jobs, gpu=gpu)}\n", flush=True)
    except KeyboardInterrupt:
        kept = f"; the finished jobs are in {record}: rerun the same command to go on" if record else \
            " (without --record, nothing is kept)"
        raise SystemExit(f"interrupted: the bench stopped before its {args.rounds} round(s){kept}") from None
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    load_after = _load()
    provenance.loads = (load_before, load_after)
    print(targets_table(results, jobs, gpu=gpu))
    print(f"load average before {load_before}, after {load_after} (1/5/15 min)")
    if args.markdown is not None:
        calls = None if args.no_calls else calls_table()
        command = "python -m altgrad.bench job " + shlex.join(argv)  # as typed: quoted where a value has spaces
        text = page(results, jobs, args, command, provenance, calls)
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
        print(f"wrote {args.markdown}")

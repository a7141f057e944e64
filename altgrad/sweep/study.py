"""The CPU study in one resumable command: pilot → horizon check → AdamW tuning per format → each arm's tuning →
tuned-lr table (edge picks extended) → evaluation → report. ``make study`` runs it.

Every stage is a sweep of a named experiment (conf/experiment/study_cpu*.yaml) into its own folder below ``--root``
with ``+resume_sweep=true``, so a rerun skips every finished job and resumes interrupted ones: a stopped study goes
on where it stopped. Each job's record (summary.json, metrics.csv, layer_map.json, .hydra/overrides.yaml) is copied
into ``--records/<stage>/<job>`` as the job ends, and the report is written from those records alone::

    python -m altgrad.sweep.study                       # the study; rerun to resume
    python -m altgrad.sweep.study --jobs 2              # two sweeps at a time (a 2-core machine: 1 thread each)
    python -m altgrad.sweep.study --debug --root DIR --records DIR --out DIR   # the same pipeline at debug size
    python -m altgrad.sweep.study --evidence-gpu --budget-s 540   # GPU confirmation, in resumable chunks

``--evidence-gpu`` runs the same stages without a pilot (its horizon is its configuration's) for bf16_ref and the
CPU study's best and worst formats (``--formats`` names them by hand).

The horizon stage does not edit the configuration: it checks that the configured H (the evaluation's
trainer.max_steps) passes the pilot's rule and stops with the H the pilot supports when it does not, unless the
study's plan states why it keeps H anyway (``horizon_waiver``, printed with the rule's numbers). The lr stages
stop when lr_pick refuses a pick that no extension scan can settle. Exit codes: 0 done, 1 a job failed (rerun to
retry it), 2 a refusal or a configuration error, 3 the time budget ran out (the running job checkpointed: rerun to
go on); one line on stderr says which.

With ``--jobs N`` a stage runs N sweeps at once into its folder: the pilot, tuning and evaluation grids split into
one sweep per cell (format × arm or lr, its seeds inside), and when a stage has fewer sweeps than N (an extension
round with one scan) the lists on their command lines split into one sweep per value. Job dirs are named by their
overrides, so the split changes no job's dir, config or result, and a study may switch N between runs.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from altgrad.report.load import load_sweeps
from altgrad.sweep import lr_pick
from altgrad.sweep.horizon import pick_horizon
from altgrad.sweep.records import collect, copy_job, job_dirs, job_status

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
DEBUG_TABLE_GROUP = "debug_tuned"
"""The config group of a table kept outside conf/ (the debug study's): its twins load it after their own values."""
STOP_GRACE_S = 120.0
"""How long a sweep stopped at the end of the time budget may take to checkpoint its running job."""
MIN_START_S = 30.0
"""A sweep is not started with less than this left of the time budget."""
POLL_S = 1.0
"""How often the driver looks at its running sweeps when several run at once."""
MAX_EXTENSION_ROUNDS = 4
"""How many times one lr stage may extend its scan before it stops (each round adds two lrs per edge cell)."""


@dataclass(frozen=True)
class StudyPlan:
    """The experiments of a study's stages and the rules its checks apply."""

    name: str
    pilot: str | None  # None: no pilot and no horizon stage (the horizon is the configuration's)
    tune: str
    tune_arms: str
    evaluation: str
    arm_lrs: dict[str, str]  # arm (optimizer preset) → its tuning grid, swept as optimizer.lr
    eval_seeds: str
    min_lrs: int
    table_name: str
    table_in_repo: bool  # the table is conf/experiment/optim/tuned/NAME.yaml (committed); else ROOT/conf/debug_tuned/
    min_horizon: int
    horizon_every: int
    horizon_factor: int = 4
    horizon_tolerance: float = 0.03
    narrow: tuple[str, ...] = field(default=())  # overrides given to the tuning and evaluation stages
    horizon_waiver: str | None = None  # why the configured H is kept where the pilot's rule fails (None: stop)
    reference_format: str | None = None  # set: formats = this + the CPU study's best and worst (or --formats)


PLANS = {
    "study_cpu": StudyPlan(
        name="study_cpu", pilot="study_cpu_pilot", tune="study_cpu_tune", tune_arms="study_cpu_tune_arms",
        evaluation="study_cpu", arm_lrs={"manifold": "0.1,0.3,1.0,3.0", "relative": "3e-3,1e-2,3e-2,0.1"},
        eval_seeds="1,2,3,4,5", min_lrs=4, table_name="study_cpu", table_in_repo=True, min_horizon=400,
        horizon_every=100,
        horizon_waiver=("the embedded corpus keeps being learnt for thousands of steps (the pilot's fp32 AdamW: "
                        "val loss 0.595 at step 600, 0.174 at 2400, still falling at the end), so no H the 2-core "
                        "CPU can afford passes; H = 600 is the budget's horizon and the report's caveats say so")),
    # the same pipeline on the 1-block debug model (5-step jobs), e4m3 only: a check of the machinery, not evidence.
    # Its pilot is 4 × 5 steps, where no loss is within 3 % of its value 15 steps later: the rule's tolerance is wide.
    # GPU confirmation: gpt_50m on EurLex tokens prepared offline, bf16_ref + the CPU study's best and worst formats
    "evidence_gpu": StudyPlan(
        name="evidence_gpu", pilot=None, tune="evidence_gpu_tune", tune_arms="evidence_gpu_tune_arms",
        evaluation="evidence_gpu", arm_lrs={"manifold": "0.3,1.0,3.0", "relative": "3e-3,1e-2,3e-2"},
        eval_seeds="1,2,3", min_lrs=3, table_name="evidence_gpu", table_in_repo=True, min_horizon=0,
        horizon_every=0, reference_format="bf16_ref"),
    "evidence_gpu_debug": StudyPlan(
        name="evidence_gpu_debug", pilot=None, tune="evidence_gpu_tune_debug",
        tune_arms="evidence_gpu_tune_arms_debug", evaluation="evidence_gpu_debug",
        arm_lrs={"manifold": "1.0,10.0,100.0", "relative": "0.1,1.0,10.0"}, eval_seeds="1,2", min_lrs=3,
        table_name="evidence_gpu_debug", table_in_repo=False, min_horizon=0, horizon_every=0,
        reference_format="bf16_ref"),
    "study_cpu_debug": StudyPlan(
        name="study_cpu_debug", pilot="study_cpu_pilot_debug", tune="study_cpu_tune_debug",
        tune_arms="study_cpu_tune_arms_debug", evaluation="study_cpu_debug",
        arm_lrs={"manifold": "0.1,1.0,10.0,100.0", "relative": "0.01,0.1,1.0,10.0"}, eval_seeds="1,2", min_lrs=4,
        table_name="study_cpu_debug", table_in_repo=False, min_horizon=5, horizon_every=5, horizon_tolerance=10.0,
        narrow=("format=e4m3",)),
}


class StudyStop(Exception):
    """A stage cannot go on; ``code`` is the exit status (1: a job failed, 2: a refusal or a configuration error,
    3: the time budget ran out)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Study:
    """One study's folders and the commands of its stages."""

    def __init__(self, plan: StudyPlan, root: Path, records: Path, out: Path, *, formats: Sequence[str] = (),
                 budget_s: float | None = None, jobs: int = 1) -> None:
        self.jobs = jobs
        self.plan, self.root, self.records, self.out = plan, root.resolve(), records.resolve(), out.resolve()
        self.narrow = plan.narrow
        if plan.reference_format is not None:
            self.narrow = (f"format={','.join([plan.reference_format, *formats])}", *plan.narrow)
        self.deadline = None if budget_s is None else time.monotonic() + budget_s
        conf_root = CONF if plan.table_in_repo else self.root / "conf"
        self.conf_root = conf_root
        group = ("experiment", "optim", "tuned") if plan.table_in_repo else (DEBUG_TABLE_GROUP,)
        self.table = conf_root.joinpath(*group, f"{plan.table_name}.yaml")

    # -- commands -------------------------------------------------------------------------------------------------
    def extra_overrides(self, stage: str) -> list[str]:
        """What every train command of a stage adds: the records callback, resuming, and the table's search path."""
        extra = ["+resume_sweep=true",
                 "+hydra.callbacks.records._target_=altgrad.sweep.records.CopyRecords",
                 f"+hydra.callbacks.records.dest={self.records / stage}"]
        if not self.plan.table_in_repo:
            extra.append(f"hydra.searchpath=[file://{self.conf_root}]")
        return extra

    def train(self, stage: str, args: Sequence[str]) -> None:
        """Run one sweep of a stage (a named experiment) into root/<stage>, then collect its records (the stage
        checks its jobs' results once all its sweeps ran: one sweep may resume another's interrupted job)."""
        self.train_all(stage, [args])

    def train_all(self, stage: str, sweeps: Sequence[Sequence[str]]) -> None:
        """Run a stage's sweeps, up to ``jobs`` at a time (each a `python -m altgrad.train -m` process into the
        same root/<stage>; their job dirs are disjoint), collecting each sweep's records as it ends.

        At the end of the time budget every running sweep gets SIGTERM, so its running job checkpoints (exit 3);
        a sweep that stops with a configuration error (exit 2) starts no further sweeps and stops the stage once
        the running ones end."""
        self.restore(stage)
        pending = [list(args) for args in sweeps]
        if len(pending) < self.jobs:
            # fewer sweeps than CPUs to share: their command-line lists (an extension's lrs) as single sweeps. Not
            # always: each sweep is a process, and a resumed study's finished jobs then cost a start-up each.
            pending = [one for args in pending for one in split_lists(args)]
        running: list[subprocess.Popen] = []
        config_error = False
        try:
            while True:
                for proc in [p for p in running if p.poll() is not None]:
                    running.remove(proc)
                    collect(self.root / stage, self.records / stage)
                    config_error |= proc.returncode == 2
                while pending and len(running) < self.jobs and not config_error:
                    self.check_time(stage)
                    running.append(self.launch(stage, pending.pop(0)))
                if not running:
                    break
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    self.stop(running)
                    collect(self.root / stage, self.records / stage)
                    raise StudyStop(f"{stage}: the time budget ran out; the running job was stopped with a "
                                    "checkpoint: rerun the same command to continue", 3)
                self.wait_any(running)
        except BaseException:
            self.stop(running)  # an interrupt or a stop: every running job checkpoints before the driver goes
            raise
        if config_error:
            raise StudyStop(f"{stage}: the sweep stopped with a configuration error (exit 2; see above)", 2)

    def launch(self, stage: str, args: Sequence[str]) -> subprocess.Popen:
        """Start one sweep of a stage; with several at a time each gets its share of the CPU's threads."""
        extra = [f"hydra.sweep.dir={self.root / stage}", *self.extra_overrides(stage)]
        ours = {_key(a) for a in extra}
        command = [sys.executable, "-m", "altgrad.train", "-m", *(a for a in args if _key(a) not in ours and a != "-m"),
                   *extra]
        env = None
        if self.jobs > 1 and "OMP_NUM_THREADS" not in os.environ:
            env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // self.jobs))}
        print(f"[study] {stage}: {shlex.join(['python', *command[1:]])}", flush=True)
        return subprocess.Popen(command, cwd=REPO, env=env)

    def wait_any(self, running: Sequence[subprocess.Popen]) -> None:
        """Block until one of the running sweeps ends or the time budget runs out."""
        if len(running) == 1:
            left = None if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)
            try:
                running[0].wait(timeout=left)
            except subprocess.TimeoutExpired:
                pass
            return
        while all(p.poll() is None for p in running):
            if self.deadline is not None and time.monotonic() >= self.deadline:
                return
            time.sleep(POLL_S)

    @staticmethod
    def stop(running: Sequence[subprocess.Popen]) -> None:
        """SIGTERM every running sweep (its running job checkpoints), then wait for them; kill what outlasts
        STOP_GRACE_S."""
        for proc in running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + STOP_GRACE_S
        for proc in running:
            try:
                proc.wait(timeout=max(end - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def check_time(self, stage: str) -> None:
        """Stop (exit 3) before starting a stage's sweep when less than MIN_START_S of the budget is left."""
        if self.deadline is not None and self.deadline - time.monotonic() < MIN_START_S:
            raise StudyStop(f"{stage}: the time budget ran out before the next sweep; rerun the same command to "
                            "continue", 3)

    def restore(self, stage: str) -> int:
        """Put the finished records of a stage back into its sweep folder where its job dirs lack them (a study
        resumed from the repository alone, in a fresh checkout): +resume_sweep then skips those jobs, and lr_pick
        reads them. Returns how many jobs were restored."""
        restored = 0
        for record in job_dirs(self.records / stage):
            target = self.root / stage / record.name
            if job_status(record) in ("completed", "diverged") and job_status(target) is None:
                copy_job(record, target)
                restored += 1
        if restored:
            print(f"[study] {stage}: {restored} finished job(s) restored from {self.records / stage}", flush=True)
        return restored

    def check_finished(self, stage: str) -> None:
        """Stop (exit 1) when a job of the stage has no finished result: failed, interrupted, or never ran."""
        unfinished = [f"{p.name} ({job_status(p) or 'no summary'})" for p in job_dirs(self.root / stage)
                      if job_status(p) not in ("completed", "diverged")]
        if unfinished:
            raise StudyStop(f"{stage}: {len(unfinished)} job(s) without a result: {'; '.join(unfinished[:5])}"
                            f"{' …' if len(unfinished) > 5 else ''}; rerun the study to retry them", 1)

    # -- stages ---------------------------------------------------------------------------------------------------
    def pilot(self) -> None:
        self.sweep_cells("pilot", self.plan.pilot)
        self.check_finished("pilot")

    def horizon(self) -> int:
        """Check the configured horizon against the pilot's rule; return it."""
        plan = self.plan
        pick = pick_horizon(load_sweeps([self.root / "pilot"]).jobs, factor=plan.horizon_factor,
                            min_horizon=plan.min_horizon, every=plan.horizon_every, tolerance=plan.horizon_tolerance)
        print(pick.table(), flush=True)
        configured = self.configured_horizon()
        if pick.passes(configured):
            print(f"[study] horizon: H = {configured} passes (smallest passing: {pick.horizon})", flush=True)
            return configured
        check = pick.check(configured)
        gap = f"gap {100 * check.gap:+.1f} %" if check else f"{plan.horizon_factor}H is beyond the pilot"
        if plan.horizon_waiver:
            print(f"[study] horizon: H = {configured} does NOT pass the pilot's rule ({gap}); kept because "
                  f"{plan.horizon_waiver}", flush=True)
            return configured
        if pick.horizon is None:
            raise StudyStop(f"horizon: no H from {plan.min_horizon} up to 1/{plan.horizon_factor} of the pilot "
                            f"brings the fp32 loss within {100 * plan.horizon_tolerance:g} % of its value at "
                            f"{plan.horizon_factor}H (H = {configured}: {gap}); lengthen the pilot "
                            f"(trainer.max_steps of {plan.pilot})", 2)
        raise StudyStop(f"horizon: the configured H = trainer.max_steps = {configured} does not pass the pilot's "
                        f"rule ({gap}); the pilot supports H = {pick.horizon}: set it in the study's base config", 2)

    def configured_horizon(self) -> int:
        return int(self.compose([f"experiment={self.plan.tune}"]).trainer.max_steps)

    def compose(self, overrides: Sequence[str], hydra: bool = False):  # -> DictConfig
        """The train config with these overrides, as a job of this study sees it (the table's search path too)."""
        from hydra import compose, initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        search = [] if self.plan.table_in_repo else [f"hydra.searchpath=[file://{self.conf_root}]"]
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
                return compose(config_name="train", overrides=[*overrides, *search], return_hydra_config=hydra)
        finally:
            GlobalHydra.instance().clear()

    def pick_lrs(self, stage: str) -> None:
        """lr_pick --table over a stage's sweep; run the extension scans it writes until every cell has a pick."""
        extend = self.root / f"{stage}.extend.sh"
        self.restore(stage)
        for _ in range(MAX_EXTENSION_ROUNDS + 1):
            extend.unlink(missing_ok=True)
            args = [str(self.root / stage), "--table", str(self.table), "--eval-seeds", self.plan.eval_seeds,
                    "--min-lrs", str(self.plan.min_lrs), "--extend", str(extend)]
            print(f"[study] {stage}: python -m altgrad.sweep.lr_pick {shlex.join(args)}", flush=True)
            if lr_pick.main(args) == 0:
                return
            if not extend.is_file():
                raise StudyStop(f"{stage}: lr_pick refused a pick that no extension scan settles (see above)", 2)
            self.extend(stage)
            self.check_finished(stage)
        raise StudyStop(f"{stage}: still a pick at a grid edge after {MAX_EXTENSION_ROUNDS} extension rounds; "
                        f"see {extend}", 2)

    def extend(self, stage: str) -> None:
        """Run the extension scans lr_pick last wrote for a stage (finished jobs are skipped). Before a stage's
        check this reruns an extension job that a stop left without a result (killed before its checkpoint)."""
        extend = self.root / f"{stage}.extend.sh"
        if extend.is_file():
            self.train_all(stage, [shlex.split(line)[3:] for line in extend.read_text().splitlines()
                                   if line.startswith("python -m altgrad.train ")])

    def tune(self) -> None:
        self.sweep_cells("tune", self.plan.tune)
        self.extend("tune")
        self.check_finished("tune")
        self.pick_lrs("tune")

    def tune_arms(self) -> None:
        self.train_all("tune_arms", [[f"experiment={self.plan.tune_arms}", f"optimizer={arm}", f"optimizer.lr={lrs}",
                                      *self.narrow] for arm, lrs in self.plan.arm_lrs.items()])
        self.extend("tune_arms")
        self.check_finished("tune_arms")
        self.pick_lrs("tune_arms")

    def evaluation(self) -> None:
        self.sweep_cells("eval", self.plan.evaluation)
        self.check_finished("eval")

    def sweep_cells(self, stage: str, experiment: str) -> None:
        """A stage's experiment as one sweep, or with several jobs at once as one sweep per cell (its seeds), so
        that the cells share the CPUs to the end."""
        if self.jobs == 1:
            self.train(stage, [f"experiment={experiment}", *self.narrow])
        else:
            self.train_all(stage, [[f"experiment={experiment}", *cell] for cell in self.cells(experiment)])

    def cells(self, experiment: str) -> list[list[str]]:
        """The cells of an experiment's grid, narrowed: one override list per combination of its swept keys but
        ``seed`` (the narrowing overrides of other keys kept), in the grid's order."""
        narrow = dict(a.split("=", 1) for a in self.narrow)
        params = {k: narrow.pop(k, v) for k, v in self.sweeper_params(experiment).items() if k != "seed"}
        rest = [f"{k}={v}" for k, v in narrow.items()]
        return [[*cell, *rest] for cell in split_lists([f"{k}={v}" for k, v in params.items()])]

    def sweeper_params(self, experiment: str) -> dict[str, str]:
        """An experiment's grid (hydra.sweeper.params) as composed from the configuration."""
        cfg = self.compose([f"experiment={experiment}"], hydra=True)
        return {str(k): str(v) for k, v in cfg.hydra.sweeper.params.items()}

    def report(self) -> None:
        command = [sys.executable, "-m", "altgrad.report", str(self.records), "--out", str(self.out)]
        print(f"[study] report: {shlex.join(['python', *command[1:]])}", flush=True)
        if subprocess.run(command, cwd=REPO).returncode != 0:
            raise StudyStop("report: altgrad.report failed (see above)", 2)

    def run(self, until: str | None = None) -> None:
        for name in STAGES:
            if self.plan.pilot is None and name in ("pilot", "horizon"):
                continue
            getattr(self, name)()
            if name == until:
                print(f"[study] stopped after {name} (--until)", flush=True)
                return


def best_and_worst(records: Path) -> tuple[str, str]:
    """The formats with the lowest and the highest mean Δ of the primary contrast (paired by seed) in a finished
    study's evaluation records. Raises ValueError when the records hold no complete declared evaluation."""
    from altgrad.report.study import analyse, declared_endpoints

    if not Path(records).is_dir():
        raise ValueError(f"{records} does not exist: run the CPU study first (make study), or pass --formats A,B")
    jobs = load_sweeps([records]).jobs
    declared = declared_endpoints(jobs)
    if not declared:
        raise ValueError(f"{records}: no job declares an endpoint (the CPU study's evaluation has not run); "
                         "pass --formats A,B")
    endpoint, members = declared[0]
    result = analyse(endpoint, members)
    if result.missing_formats:
        raise ValueError(f"{records}: the evaluation has no runs of {', '.join(result.missing_formats)} yet; finish "
                         "the CPU study or pass --formats A,B")
    means = {c.format: statistics.fmean(c.deltas.values()) for c in result.of(endpoint.primary_contrast) if c.deltas}
    if len(means) < 2:
        raise ValueError(f"{records}: fewer than two formats have paired results of the primary contrast; pass "
                         "--formats A,B")
    order = sorted(means, key=lambda f: (means[f], f))
    return order[0], order[-1]


def split_lists(args: Sequence[str]) -> list[list[str]]:
    """A sweep's command line as one command line per job of its command-line lists (``a=1,2 b=x,y`` → four, in
    Hydra's launch order); values are spelt as Hydra spells them in job dirs (``3e-3`` → ``0.003``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    choices: list[list[str]] = []
    for arg in args:
        override = parser.parse_override(arg) if "=" in arg and not arg.startswith("hydra.") else None
        if override is not None and override.is_discrete_sweep():
            key = arg.split("=", 1)[0]
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            choices.append([arg])
    return [list(combination) for combination in itertools.product(*choices)]


def _key(override: str) -> str:
    """An override's key without its + / ++ / ~ prefix (``+resume_sweep=true`` → ``resume_sweep``)."""
    return override.split("=", 1)[0].lstrip("+~")


STAGES = ("pilot", "horizon", "tune", "tune_arms", "evaluation", "report")


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m altgrad.sweep.study", description=__doc__.split("\n\n")[0])
    parser.add_argument("--debug", action="store_true", help="the debug-size twin of the study (a pipeline check)")
    parser.add_argument("--evidence-gpu", action="store_true",
                        help="the GPU confirmation (gpt_50m on EurLex; bf16_ref + the CPU study's best and worst)")
    parser.add_argument("--formats", default=None,
                        help="evidence: the two formats beside bf16_ref (default: the CPU study's best and worst)")
    parser.add_argument("--cpu-records", type=Path, default=REPO / "docs" / "results" / "study-cpu" / "runs" / "eval",
                        help="evidence: the CPU study's evaluation records the best and worst formats come from")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop after this many seconds (the running job checkpoints); rerun to continue")
    parser.add_argument("--root", type=Path, default=None, help="sweep folders (default multirun/<study>)")
    parser.add_argument("--records", type=Path, default=None,
                        help="job records (default docs/results/<study>/runs, <study> with - for _)")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default: the records' parent)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="sweeps run at once (tuning scans, extension scans, evaluation cells); each gets "
                             "cpu_count/jobs threads unless OMP_NUM_THREADS is set")
    parser.add_argument("--until", choices=STAGES, default=None, help="stop after this stage")
    args = parser.parse_args(list(argv))
    name = "evidence_gpu" if args.evidence_gpu else "study_cpu"
    plan = PLANS[f"{name}_debug" if args.debug else name]
    slug = plan.name.replace("_", "-")
    root = args.root or REPO / "multirun" / slug
    records = args.records or REPO / "docs" / "results" / slug / "runs"
    out = args.out or records.parent
    if args.jobs < 1:
        print(f"error: --jobs={args.jobs} is invalid; valid: a whole number of sweeps ≥ 1", file=sys.stderr)
        return 2
    if args.budget_s is not None and args.budget_s <= 0:
        print(f"error: --budget-s={args.budget_s:g} is invalid; valid: a positive number of seconds", file=sys.stderr)
        return 2
    try:
        formats: tuple[str, ...] = ()
        if plan.reference_format is not None:
            if args.formats:
                formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
            else:
                formats = best_and_worst(args.cpu_records)
            print(f"[study] formats: {plan.reference_format} + {', '.join(formats)}", flush=True)
        Study(plan, root, records, out, formats=formats, budget_s=args.budget_s, jobs=args.jobs).run(args.until)
    except StudyStop as stop:
        print(f"error: {stop}", file=sys.stderr)
        return stop.code
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"[study] done: report in {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

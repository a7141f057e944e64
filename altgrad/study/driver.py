"""Carry out a study's plan (altgrad/study/plan.py), stage by stage, resumably.

Every sweep of a stage runs `python -m altgrad.train -m` into the stage's folder below the study's sweep root with
``+resume_sweep=true``, so a rerun skips finished jobs and resumes interrupted ones; each job's record
(summary.json, metrics.csv, layer_map.json, .hydra/overrides.yaml) is copied into ``<records>/<stage>/<job>`` as
the job ends, and a stage restores finished records into an empty sweep folder first, so a study resumes from the
repository alone. Exit codes (altgrad.study.__main__): 0 done, 1 a job failed (rerun to retry it), 2 a refusal or
a configuration error, 3 the time budget ran out (rerun to go on), 128 + N a signal N (the running jobs
checkpointed; rerun to go on).
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from altgrad.report.load import load_sweeps
from altgrad.study import sweeps as runner
from altgrad.study.plan import REPO, Stage, StudyPlan, sweep_seed_list
from altgrad.study.power import paired_groups, power_for
from altgrad.sweep import lr_pick, lr_table
from altgrad.sweep.horizon import pick_horizon
from altgrad.sweep.records import collect, copy_job, job_dirs, job_status

CONF = REPO / "conf"
SCRATCH_TABLE_GROUP = "debug_tuned"
"""The config group of a plan's scratch table (``table: null``), kept below the sweep root, not in conf/."""
MIN_START_S = 30.0
"""A sweep is not started with less than this left of the time budget."""
MAX_EXTENSION_ROUNDS = 4
"""How many times one tune stage may extend its scans before it stops (each round adds two lrs per edge cell)."""


class StudyStop(Exception):
    """A stage cannot go on; ``code`` is the exit status (see the module docstring)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Study:
    """One study's folders, settings and stages."""

    def __init__(self, plan: StudyPlan, root: Path, records: Path, out: Path, *, settings: Sequence[str] = (),
                 formats: Sequence[str] = (), budget_s: float | None = None, jobs: int = 1) -> None:
        self.plan, self.jobs = plan, jobs
        self.root, self.records, self.out = root.resolve(), records.resolve(), out.resolve()
        self.settings = list(settings)  # --set KEY=VALUE: every job gets them (not part of job dir names)
        narrow = list(plan.overrides)
        if formats:
            narrow = runner.with_overrides(narrow, [f"format={','.join(formats)}"])
        self.narrow = narrow
        self.deadline = None if budget_s is None else time.monotonic() + budget_s
        if plan.table is not None:
            self.table, self.conf_root = REPO / plan.table, None
        else:
            self.conf_root = self.root / "conf"
            self.table = self.conf_root / SCRATCH_TABLE_GROUP / f"{plan.name}.yaml"
            self.table.parent.mkdir(parents=True, exist_ok=True)  # Hydra's search path must exist from the start

    # -- commands -------------------------------------------------------------------------------------------------
    def search_path(self) -> list[str]:
        return [] if self.conf_root is None else [f"hydra.searchpath=[file://{self.conf_root}]"]

    def extra_overrides(self, stage: str) -> list[str]:
        """What every train command of a stage adds: resuming, the records callback, the scratch table's search
        path and the --set settings."""
        return ["+resume_sweep=true",
                "+hydra.callbacks.records._target_=altgrad.sweep.records.CopyRecords",
                f"+hydra.callbacks.records.dest={self.records / stage}",
                *self.search_path(), *self.settings]

    def command(self, stage: str, args: Sequence[str]) -> list[str]:
        extra = [f"hydra.sweep.dir={self.root / stage}", *self.extra_overrides(stage)]
        body = runner.with_overrides([a for a in args if a != "-m"], extra)
        return [sys.executable, "-m", "altgrad.train", "-m", *body]

    def launch(self, stage: str, args: Sequence[str]) -> subprocess.Popen:
        """Start one sweep of a stage; with several at a time each gets its share of the CPU's threads."""
        command = self.command(stage, args)
        env = None
        if self.jobs > 1 and "OMP_NUM_THREADS" not in os.environ:
            env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // self.jobs))}
        print(f"[study] {stage}: {shlex.join(['python', *command[1:]])}", flush=True)
        return runner.start(command, cwd=str(REPO), env=env)

    def train_all(self, stage: str, sweeps: Sequence[Sequence[str]]) -> None:
        """Run a stage's sweeps, up to ``jobs`` at a time, collecting each sweep's records as it ends."""
        self.restore(stage)
        pending = [list(args) for args in sweeps]
        if self.jobs > 1:
            # one sweep per cell (its seeds inside), so the cells share the CPUs to the end of the stage
            pending = [cell for args in pending for cell in self.cells(args)]
        pending = [args for args in pending if not self.finished(stage, args)]  # a resumed study starts no
        # process for what is done

        def ended(proc: subprocess.Popen) -> None:
            collect(self.root / stage, self.records / stage)

        config_error, out_of_time = runner.run_all(
            pending, lambda args: self.launch(stage, args), jobs=self.jobs, deadline=self.deadline, on_end=ended,
            before_start=lambda: self.check_time(stage))
        if out_of_time:
            raise StudyStop(f"{stage}: the time budget ran out; the running jobs were stopped with a checkpoint: "
                            "rerun the same command to continue", 3)
        if config_error:
            raise StudyStop(f"{stage}: a sweep stopped with a configuration error (exit 2; see above)", 2)

    def finished(self, stage: str, args: Sequence[str]) -> bool:
        """Whether every job of a sweep already holds a finished result in the stage's folder."""
        from altgrad.sweep.plan import plan

        try:
            jobs = plan([*args, *self.search_path(), *self.settings])
        except Exception:  # noqa: BLE001 - not plannable here: let the sweep itself say what is wrong
            return False
        return bool(jobs) and all(job_status(self.root / stage / job.subdir) in ("completed", "diverged")
                                  for job in jobs)

    def cells(self, args: Sequence[str]) -> list[list[str]]:
        """A sweep's cells: one command line per combination of its swept values but ``seed`` (the experiment's
        own grid included), in Hydra's order; the seeds stay together in each cell."""
        experiment = next((a.split("=", 1)[1] for a in args if runner.key_of(a) == "experiment"), None)
        own = {k: v for k, v in self.sweeper_params(experiment).items() if k != "seed"} if experiment else {}
        given = {runner.key_of(a) for a in args}
        listed = [a for a in args if runner.key_of(a) != "seed"]
        seeds = [a for a in args if runner.key_of(a) == "seed"]
        spelled = [f"{k}={v}" for k, v in own.items() if k not in given]
        return [[*cell, *seeds] for cell in runner.split_lists([*listed, *spelled])]

    def sweeper_params(self, experiment: str) -> dict[str, str]:
        cfg = self.compose([f"experiment={experiment}"], hydra=True)
        return {str(k): str(v) for k, v in (cfg.hydra.sweeper.params or {}).items()}

    def compose(self, overrides: Sequence[str], hydra: bool = False):  # -> DictConfig
        """The train config with these overrides, as a job of this study sees it."""
        from hydra import compose, initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
                return compose(config_name="train", overrides=[*overrides, *self.search_path()],
                               return_hydra_config=hydra)
        finally:
            GlobalHydra.instance().clear()

    def check_time(self, stage: str) -> None:
        if self.deadline is not None and self.deadline - time.monotonic() < MIN_START_S:
            raise StudyStop(f"{stage}: the time budget ran out before the next sweep; rerun the same command to "
                            "continue", 3)

    def restore(self, stage: str) -> int:
        """Put the finished records of a stage back into its sweep folder where its job dirs lack them (a study
        resumed from the repository alone): +resume_sweep then skips those jobs. Returns how many."""
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

    # -- stage kinds ----------------------------------------------------------------------------------------------
    def stage_sweeps(self, stage: Stage) -> list[list[str]]:
        """A sweep or tune stage's command lines: each sweep narrowed, with the stage's seeds."""
        seeds: list[str] = []
        if stage.seeds == "power":
            seeds = [f"seed={sweep_seed_list(range(1, self.power_seeds() + 1))}"]
        elif stage.seeds:
            seeds = [f"seed={sweep_seed_list(stage.seeds)}"]
        return [runner.with_overrides(list(args), [*self.narrow, *seeds]) for args in stage.sweeps]

    def sweep(self, stage: Stage) -> None:
        self.train_all(stage.name, self.stage_sweeps(stage))
        self.check_finished(stage.name)

    def tune(self, stage: Stage) -> None:
        self.train_all(stage.name, self.stage_sweeps(stage))
        self.extend(stage.name)
        self.check_finished(stage.name)
        self.pick_lrs(stage)

    def pick_lrs(self, stage: Stage) -> None:
        """lr_pick --table over a stage's sweep; run the extension scans it writes until every cell has a pick."""
        extend = self.root / f"{stage.name}.extend.sh"
        self.restore(stage.name)
        for _ in range(MAX_EXTENSION_ROUNDS + 1):
            extend.unlink(missing_ok=True)
            args = [str(self.root / stage.name), "--table", str(self.table), "--eval-seeds",
                    sweep_seed_list(self.eval_seeds(stage)), "--min-lrs", str(stage.min_lrs), "--extend",
                    str(extend), "--plain-arm", stage.plain_arm]
            print(f"[study] {stage.name}: python -m altgrad.sweep.lr_pick {shlex.join(args)}", flush=True)
            if lr_pick.main(args) == 0:
                return
            if not extend.is_file():
                raise StudyStop(f"{stage.name}: lr_pick refused a pick that no extension scan settles (see above)", 2)
            self.extend(stage.name)
            self.check_finished(stage.name)
        raise StudyStop(f"{stage.name}: still a pick at a grid edge after {MAX_EXTENSION_ROUNDS} extension rounds; "
                        f"see {extend}", 2)

    def extend(self, stage: str) -> None:
        """Run the extension scans lr_pick last wrote for a stage (finished jobs are skipped); before a stage's
        check this reruns an extension job that a stop left without a result."""
        extend = self.root / f"{stage}.extend.sh"
        if extend.is_file():
            self.train_all(stage, [shlex.split(line)[3:] for line in extend.read_text().splitlines()
                                   if line.startswith("python -m altgrad.train ")])

    def eval_seeds(self, stage: Stage) -> list[int]:
        """Seeds a tuning run must not use: the stage's own list, else every seed an evaluation of the plan may
        run (explicit seed lists, and 1 … max_seeds of a power stage)."""
        if stage.eval_seeds:
            return list(stage.eval_seeds)
        seeds: set[int] = set()
        for other in self.plan.stages:
            if other.kind == "sweep" and isinstance(other.seeds, tuple):
                seeds.update(other.seeds)
            if other.kind == "power":
                seeds.update(range(1, int(other.get("max_seeds")) + 1))
        return sorted(seeds)

    def horizon(self, stage: Stage) -> int:
        """Check the evaluation's H against the pilot's rule; return it (or stop, unless the plan waives it)."""
        pick = pick_horizon(load_sweeps([self.root / stage.get("pilot")]).jobs, factor=stage.get("factor", 4),
                            min_horizon=stage.get("min_horizon", 400), every=stage.get("every", 100),
                            tolerance=stage.get("tolerance", 0.03))
        print(pick.table(), flush=True)
        first = runner.split_lists(self.narrow)[0] if self.narrow else []  # H is the same for every cell
        configured = int(self.compose([f"experiment={stage.get('experiment')}", *first]).trainer.max_steps)
        factor, tolerance = stage.get("factor", 4), stage.get("tolerance", 0.03)
        if pick.passes(configured):
            print(f"[study] horizon: H = {configured} passes (smallest passing: {pick.horizon})", flush=True)
            return configured
        check = pick.check(configured)
        gap = f"gap {100 * check.gap:+.1f} %" if check else f"{factor}H is beyond the pilot"
        if stage.get("waiver"):
            print(f"[study] horizon: H = {configured} does NOT pass the pilot's rule ({gap}); kept because "
                  f"{stage.get('waiver')}", flush=True)
            return configured
        if pick.horizon is None:
            raise StudyStop(f"horizon: no H from {stage.get('min_horizon', 400)} up to 1/{factor} of the pilot "
                            f"brings the fp32 loss within {100 * tolerance:g} % of its value at {factor}H "
                            f"(H = {configured}: {gap}); lengthen the pilot", 2)
        raise StudyStop(f"horizon: the configured H = trainer.max_steps = {configured} does not pass the pilot's "
                        f"rule ({gap}); the pilot supports H = {pick.horizon}: set it in the study's base config", 2)

    def power(self, stage: Stage) -> None:
        """Choose the evaluation's seeds from the tuning runs' paired SD; record the calculation."""
        jobs = load_sweeps([self.root / s for s in stage.get("stages")]).jobs
        table = lr_table.read_table(self.table)
        picks = {fmt: {arm: lr for arm, (lr, _) in arms.items()} for fmt, arms in table.items()}
        groups = paired_groups(jobs, picks, [tuple(c) for c in stage.get("contrasts")])
        result = power_for(groups, margin=float(stage.get("margin")), power=float(stage.get("power")),
                           alpha=float(stage.get("alpha")), family=int(stage.get("family")),
                           min_seeds=int(stage.get("min_seeds")), max_seeds=int(stage.get("max_seeds")))
        print(f"[study] {result.describe()}", flush=True)
        path = self.records / f"{stage.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result.as_record(), indent=2) + "\n")

    def power_seeds(self) -> int:
        """The number of evaluation seeds the power stage chose (it ran before, by the plan's order)."""
        stage = next(s for s in self.plan.stages if s.kind == "power")
        path = self.records / f"{stage.name}.json"
        try:
            return int(json.loads(path.read_text())["seeds"])
        except (OSError, ValueError, KeyError, TypeError):
            raise StudyStop(f"{stage.name}: no power calculation in {path}; run the study from its start", 2) from None

    def report(self, stage: Stage) -> None:
        command = [sys.executable, "-m", "altgrad.report", str(self.records), "--out", str(self.out)]
        print(f"[study] report: {shlex.join(['python', *command[1:]])}", flush=True)
        if subprocess.run(command, cwd=REPO).returncode != 0:
            raise StudyStop("report: altgrad.report failed (see above)", 2)

    def run(self, until: str | None = None) -> None:
        with runner.SignalGuard():
            for stage in self.plan.stages:
                getattr(self, stage.kind)(stage)
                if stage.name == until:
                    print(f"[study] stopped after {stage.name} (--until)", flush=True)
                    return


def best_and_worst(records: Path) -> tuple[str, str]:
    """The formats with the lowest and the highest mean Δ of the primary contrast (paired by seed) in a finished
    study's evaluation records. Raises ValueError when the records hold no complete declared evaluation."""
    from altgrad.report.study import analyse, declared_endpoints

    if not Path(records).is_dir():
        raise ValueError(f"{records} does not exist: run that study first, or pass --formats A,B")
    jobs = load_sweeps([records]).jobs
    declared = declared_endpoints(jobs)
    if not declared:
        raise ValueError(f"{records}: no job declares an endpoint (that study's evaluation has not run); "
                         "pass --formats A,B")
    endpoint, members = declared[0]
    result = analyse(endpoint, members)
    if result.missing_formats:
        raise ValueError(f"{records}: the evaluation has no runs of {', '.join(result.missing_formats)} yet; finish "
                         "that study or pass --formats A,B")
    means = {c.format: statistics.fmean(c.deltas.values()) for c in result.of(endpoint.primary_contrast) if c.deltas}
    if len(means) < 2:
        raise ValueError(f"{records}: fewer than two formats have paired results of the primary contrast; pass "
                         "--formats A,B")
    order = sorted(means, key=lambda f: (means[f], f))
    return order[0], order[-1]

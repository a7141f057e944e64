"""The study driver's checks between stages, on records of known content: the horizon rule stops a study whose
configured H the pilot does not support (unless the plan states why it keeps H), a job without a result stops it
for a retry, an lr refusal no extension can settle stops it with exit 2; and how it runs sweeps (several at once,
a budget, signals)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from altgrad.study import __main__ as cli
from altgrad.study import driver
from altgrad.study import sweeps as runner
from altgrad.study.driver import Study, StudyStop
from altgrad.study.plan import load_plan


def write_job(path: Path, summary: dict, curve=None, overrides=()) -> None:
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides) or "[]\n")
    (path / "summary.json").write_text(json.dumps(summary))
    if curve is not None:
        (path / "metrics.csv").write_text("step,val/loss\n" + "".join(f"{s},{v}\n" for s, v in curve))


def pilot(root: Path, f, last: int) -> None:
    curve = [(0, f(0))] + [(s - 1, f(s)) for s in range(25, last + 1, 25)]
    write_job(root / "pilot" / "baseline.lr=0.003,seed=101",
              {"status": "completed", "final_val_loss": curve[-1][1], "lr": 3e-3, "format": "fp32",
               "optimizer": "adamw", "seed": 101}, curve)


def make_study(tmp_path: Path, name: str = "study_cpu", waiver: str | None = "keep", **stage) -> Study:
    """The plan's study in tmp folders; ``waiver`` replaces the horizon stage's, ``stage`` the tune stages' fields."""
    plan = load_plan(name)
    stages = []
    for s in plan.stages:
        if s.kind == "horizon" and waiver != "keep":
            s = dataclasses.replace(s, settings={**s.settings, "waiver": waiver})
        if s.kind == "tune" and stage:
            s = dataclasses.replace(s, **stage)
        stages.append(s)
    return Study(dataclasses.replace(plan, stages=tuple(stages)), tmp_path / "root", tmp_path / "runs",
                 tmp_path / "out")


def horizon(st: Study) -> int:
    return st.horizon(st.plan.stage("horizon"))


def configured(st: Study) -> int:
    return int(st.compose(["experiment=study_cpu_tune"]).trainer.max_steps)


def test_the_configured_horizon_passes(tmp_path: Path, capsys) -> None:
    st = make_study(tmp_path, waiver=None)
    pilot(st.root, lambda s: 1.0 + 1.0 / (s + 1), 2400)  # flat from the start
    assert horizon(st) == configured(st)
    assert f"[study] horizon: H = {configured(st)} passes (smallest passing: 400)" in capsys.readouterr().out


def test_a_falling_curve_stops_the_study(tmp_path: Path) -> None:
    st = make_study(tmp_path, waiver=None)
    pilot(st.root, lambda s: 5.0 / (1 + s / 100), 2400)
    with pytest.raises(StudyStop, match=r"no H from 400 up to 1/4 of the pilot brings the fp32 loss within 3 % "
                                        r"of its value at 4H \(H = \d+: gap \+\d") as stop:
        horizon(st)
    assert stop.value.code == 2


def test_a_pilot_too_short_for_the_configured_horizon_names_the_supported_one(tmp_path: Path) -> None:
    st = make_study(tmp_path, waiver=None)
    pilot(st.root, lambda s: 1.0 + 1.0 / (s + 1), 1600)  # 4 × 400 fits, 4 × the configured H does not
    with pytest.raises(StudyStop, match=r"does not pass the pilot's rule \(4H is beyond the pilot\); the pilot "
                                        r"supports H = 400"):
        horizon(st)


def test_a_waiver_keeps_the_horizon_and_says_so(tmp_path: Path, capsys) -> None:
    st = make_study(tmp_path, waiver="the budget")
    pilot(st.root, lambda s: 5.0 / (1 + s / 100), 2400)
    assert horizon(st) == configured(st)
    assert "does NOT pass the pilot's rule (gap +" in capsys.readouterr().out


def test_a_job_without_a_result_stops_the_stage(tmp_path: Path) -> None:
    st = make_study(tmp_path)
    write_job(st.root / "tune" / "a", {"status": "completed"})
    write_job(st.root / "tune" / "b", {"status": "failed", "error": "boom"})
    (st.root / "tune" / "c" / ".hydra").mkdir(parents=True)
    (st.root / "tune" / "c" / ".hydra" / "overrides.yaml").write_text("[]\n")
    with pytest.raises(StudyStop, match=r"tune: 2 job\(s\) without a result: b \(failed\); c \(no summary\)") as stop:
        st.check_finished("tune")
    assert stop.value.code == 1


def test_an_lr_refusal_no_extension_settles_stops_the_study(tmp_path: Path, monkeypatch) -> None:
    st = make_study(tmp_path)
    monkeypatch.setattr(st, "table", tmp_path / "table.yaml")
    for lr, loss in ((1e-3, 3.0), (3e-3, 2.0), (1e-2, 2.5), (3e-2, 2.9)):  # bracketed, but on an evaluation seed
        write_job(st.root / "tune" / f"baseline.lr={lr},seed=1",
                  {"status": "completed", "final_val_loss": loss, "lr": lr, "format": "e4m3", "optimizer": "adamw",
                   "seed": 1}, overrides=[f"baseline.lr={lr}", "seed=1", "experiment=study_cpu_tune"])
    with pytest.raises(StudyStop, match="lr_pick refused a pick that no extension scan settles") as stop:
        st.pick_lrs(st.plan.stage("tune"))
    assert stop.value.code == 2 and not (tmp_path / "table.yaml").exists()


def test_records_restore_finished_jobs_only(tmp_path: Path) -> None:
    st = make_study(tmp_path)
    write_job(st.records / "tune" / "done", {"status": "completed"})
    write_job(st.records / "tune" / "broken", {"status": "failed"})
    assert st.restore("tune") == 1 and st.restore("tune") == 0
    assert (st.root / "tune" / "done" / "summary.json").is_file() and not (st.root / "tune" / "broken").exists()


def test_the_cli_reports_a_stop_in_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    line = "tune: 1 job(s) without a result: b (failed); rerun the study to retry them"

    def stop(self, until):
        raise StudyStop(line, 1)

    monkeypatch.setattr(Study, "run", stop)
    assert cli.main(["study_cpu", "--root", str(tmp_path / "root"), "--records", str(tmp_path / "runs")]) == 1
    assert capsys.readouterr().err == f"error: {line}\n"


def test_an_edge_pick_is_extended_until_it_is_bracketed(tmp_path: Path, monkeypatch) -> None:
    st = make_study(tmp_path, min_lrs=3)
    monkeypatch.setattr(st, "table", tmp_path / "conf" / "tuned.yaml")
    loss = {1e-3: 3.0, 3e-3: 2.5, 1e-2: 2.0, 3e-2: 1.9, 0.1: 2.2, 0.3: 2.8}  # the best lr lies beyond the grid

    def job(lr: float) -> None:
        write_job(st.root / "tune" / f"baseline.lr={lr:g},format=e4m3,optimizer=adamw,seed=101",
                  {"status": "completed", "final_val_loss": loss[lr], "lr": lr, "format": "e4m3",
                   "optimizer": "adamw", "seed": 101},
                  overrides=[f"baseline.lr={lr:g}", "format=e4m3", "optimizer=adamw", "seed=101",
                             "experiment=study_cpu_tune"])

    for lr in (1e-3, 3e-3, 1e-2):
        job(lr)
    ran: list[list[str]] = []

    def fake_train_all(stage: str, sweeps) -> None:  # what the extension commands ask for, as the sweeps run it
        for args in sweeps:
            ran.append(list(args))
            lrs = next(a for a in args if a.startswith("baseline.lr=")).split("=", 1)[1]
            for lr in lrs.split(","):
                job(float(lr))

    monkeypatch.setattr(st, "train_all", fake_train_all)
    st.pick_lrs(st.plan.stage("tune"))
    assert [next(a for a in args if a.startswith("baseline.lr=")) for args in ran] == ["baseline.lr=0.03,0.1"]
    assert "experiment=study_cpu_tune" in ran[0] and "seed=101" in ran[0] and "format=e4m3" in ran[0]
    table = (tmp_path / "conf" / "tuned.yaml").read_text()
    assert "    adamw: 0.03  # 5/5 lrs 0.001…0.1 stable, seeds [101]: final val loss 1.9000" in table
    assert "    plain: 0.03  #" in table


def fake_sweeps(st: Study, monkeypatch, code: str) -> list[tuple[list[str], subprocess.Popen, int]]:
    """Make each sweep a Python process running CODE (its args in sys.argv); returns (args, process, how many
    other sweeps were still running when it started) per launch."""
    launched: list[tuple[list[str], subprocess.Popen, int]] = []

    def launch(stage: str, args) -> subprocess.Popen:
        overlapping = sum(p.poll() is None for _, p, _ in launched)
        proc = subprocess.Popen([sys.executable, "-c", code, *args])
        launched.append((list(args), proc, overlapping))
        return proc

    monkeypatch.setattr(st, "launch", launch)
    return launched


def test_several_sweeps_share_the_cpus_and_each_is_collected(tmp_path: Path, monkeypatch) -> None:
    st = make_study(tmp_path)
    st.jobs = 2
    launched = fake_sweeps(st, monkeypatch, "import sys, time; time.sleep(3 if sys.argv[1] == 'b' else 0.5)")
    collected: list[str] = []
    monkeypatch.setattr(driver, "collect", lambda root, dest: collected.append(root.name))
    st.train_all("eval", [["a"], ["b"], ["c"]])
    assert [args for args, _, _ in launched] == [["a"], ["b"], ["c"]]
    assert [others for _, _, others in launched] == [0, 1, 1]  # c starts when a ends, beside b: two at a time
    assert all(p.returncode == 0 for _, p, _ in launched) and collected == ["eval"] * 3


def test_one_sweep_at_a_time_by_default(tmp_path: Path, monkeypatch) -> None:
    st = make_study(tmp_path)
    launched = fake_sweeps(st, monkeypatch, "import time; time.sleep(0.3)")
    st.train_all("eval", [["a"], ["b"]])
    assert [others for _, _, others in launched] == [0, 0]


def test_a_configuration_error_starts_no_further_sweep(tmp_path: Path, monkeypatch) -> None:
    st = make_study(tmp_path)
    st.jobs = 2
    launched = fake_sweeps(st, monkeypatch, "import sys, time; time.sleep(0.5 if sys.argv[1] == 'a' else 2); "
                                            "sys.exit(2 if sys.argv[1] == 'a' else 0)")
    with pytest.raises(StudyStop, match="configuration error") as stop:
        st.train_all("eval", [["a"], ["b"], ["c"]])
    assert stop.value.code == 2
    assert [args for args, _, _ in launched] == [["a"], ["b"]] and launched[1][1].returncode == 0  # b ran to its end


def test_the_end_of_the_budget_stops_every_running_sweep_with_sigterm(tmp_path: Path, monkeypatch) -> None:
    st = make_study(tmp_path)
    st.jobs = 2
    monkeypatch.setattr(driver, "MIN_START_S", 0.0)
    st.deadline = time.monotonic() + 1.0
    # a sweep that checkpoints on SIGTERM: exits 0 from its handler, else would sleep a minute
    launched = fake_sweeps(st, monkeypatch, "import signal, sys, time; "
                                            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(60)")
    start = time.monotonic()
    with pytest.raises(StudyStop, match="the time budget ran out") as stop:
        st.train_all("eval", [["a"], ["b"], ["c"]])
    assert stop.value.code == 3 and time.monotonic() - start < 30
    assert [args for args, _, _ in launched] == [["a"], ["b"]]
    assert all(p.returncode == 0 for _, p, _ in launched)  # stopped by their handlers, not killed


def test_the_evaluation_runs_one_sweep_per_cell_with_several_jobs(tmp_path: Path) -> None:
    st = make_study(tmp_path)
    st.jobs = 2
    cells = st.cells(["experiment=study_cpu"])
    assert len(cells) == 7 * 3 and cells[0] == ["experiment=study_cpu", "format=bf16_ref", "optimizer=adamw"]
    assert cells[-1] == ["experiment=study_cpu", "format=e7m0", "optimizer=relative"]
    narrowed = Study(load_plan("evidence_gpu"), tmp_path / "r", tmp_path / "runs", tmp_path / "o",
                     formats=("bf16_ref", "e4m3"))
    sweeps = narrowed.stage_sweeps(narrowed.plan.stage("eval"))
    assert [c for args in sweeps for c in narrowed.cells(args)] == [
        ["experiment=evidence_gpu", f"format={f}", f"optimizer={o}"] for f in ("bf16_ref", "e4m3")
        for o in ("adamw", "manifold", "relative")]


def test_jobs_below_one_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    assert cli.main(["study_cpu", "--jobs", "0", "--root", str(tmp_path / "root")]) == 2
    assert capsys.readouterr().err == "error: --jobs=0 is invalid; valid: a whole number of sweeps ≥ 1\n"


def test_an_extension_job_a_stop_left_without_a_result_runs_again(tmp_path: Path, monkeypatch) -> None:
    st = make_study(tmp_path)
    write_job(st.root / "tune_arms" / "format=e4m3,optimizer.lr=0.1,optimizer=relative,seed=101",
              {"status": "completed"})
    killed = st.root / "tune_arms" / "format=e4m3,optimizer.lr=0.3,optimizer=relative,seed=101"
    (killed / ".hydra").mkdir(parents=True)  # killed before its first checkpoint: no summary
    (st.root / "tune_arms.extend.sh").write_text(
        "# relative in e4m3: best lr 0.1 at the high edge\n"
        "python -m altgrad.train format=e4m3 experiment=study_cpu_tune_arms optimizer=relative optimizer.lr=0.3,1 "
        "seed=101\n")
    ran: list[list[str]] = []

    def fake_train_all(stage: str, sweeps) -> None:
        ran.extend(list(a) for a in sweeps)
        if any("optimizer.lr=0.3,1" in a for a in sweeps):
            (killed / "summary.json").write_text(json.dumps({"status": "completed"}))

    monkeypatch.setattr(st, "train_all", fake_train_all)
    monkeypatch.setattr(st, "pick_lrs", lambda stage: None)
    st.tune(st.plan.stage("tune_arms"))  # no "job(s) without a result" stop: the extension line ran before the check
    assert ran[-1] == ["format=e4m3", "experiment=study_cpu_tune_arms", "optimizer=relative", "optimizer.lr=0.3,1",
                       "seed=101"]


def test_a_command_lines_lists_become_one_sweep_per_job_in_hydras_order() -> None:
    assert runner.split_lists(["experiment=e", "optimizer.lr=3e-3,1", "seed=101", "+tag=a,b"]) == [
        ["experiment=e", "optimizer.lr=0.003", "seed=101", "+tag=a"],
        ["experiment=e", "optimizer.lr=0.003", "seed=101", "+tag=b"],
        ["experiment=e", "optimizer.lr=1", "seed=101", "+tag=a"],
        ["experiment=e", "optimizer.lr=1", "seed=101", "+tag=b"]]  # 0.003: how Hydra names the job dir
    assert runner.split_lists(["format=e4m3", "hydra.sweep.dir=/x,y"]) == [["format=e4m3", "hydra.sweep.dir=/x,y"]]


def test_with_several_jobs_every_lr_of_a_scan_is_its_own_sweep_and_finished_ones_start_nothing(
        tmp_path: Path, monkeypatch) -> None:
    st = make_study(tmp_path)
    st.jobs = 2
    launched = fake_sweeps(st, monkeypatch, "pass")
    args = ["experiment=study_cpu_tune_arms", "format=bf16_ref", "optimizer=manifold", "optimizer.lr=100,300"]
    write_job(st.root / "tune_arms" / "format=bf16_ref,optimizer.lr=100,optimizer=manifold,seed=101",
              {"status": "completed"})
    st.train_all("tune_arms", [args])
    assert [a for a, _, _ in launched] == [["experiment=study_cpu_tune_arms", "format=bf16_ref", "optimizer=manifold",
                                            "optimizer.lr=300"]]  # lr 100 finished: no process for it

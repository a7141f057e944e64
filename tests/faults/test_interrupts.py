"""Interrupts are a result: a checkpoint at the step reached, status `interrupted`, one line on how to resume,
exit 128 + signal; resuming in place continues bit for bit and appends to the run's records."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from fault_helpers import REPO, TINY, checkpoint, metric_rows, run_train, signal_mid_run, summary

STRAIGHT_STEPS = 12


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str]) -> Path:
    """The same run without interruption."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    result = run_train([*TINY, f"trainer.max_steps={STRAIGHT_STEPS}", f"hydra.run.dir={run_dir}"], offline_env)
    assert result.returncode == 0, result.stderr[-2000:]
    return run_dir


@pytest.mark.parametrize("name", ["SIGTERM", pytest.param("SIGINT", marks=pytest.mark.slow)])
def test_a_signal_mid_run_checkpoints_and_resumes_in_place(name: str, tmp_path: Path, straight: Path,
                                                          offline_env: dict[str, str]) -> None:
    signum = getattr(signal, name)
    run_dir = tmp_path / "run"
    code, output = signal_mid_run([*TINY, "trainer.max_steps=1000", f"hydra.run.dir={run_dir}"], offline_env, signum,
                                  tmp_path / "first.log", after_steps=2)
    assert code == 128 + signum, output[-2000:]
    assert "Traceback" not in output
    s = summary(run_dir)
    step = s["steps"]
    assert s["status"] == "interrupted" and s["interrupted_by"] == name and s["interrupted_at_step"] == step
    assert 2 <= step < STRAIGHT_STEPS
    assert checkpoint(run_dir)["global_step"] == step  # saved at the signal's step, not at the last interval
    resume_lines = [line for line in output.splitlines() if "resume with:" in line]
    assert len(resume_lines) == 1 and f"interrupted by {name} at step {step}" in resume_lines[0]
    assert f"ckpt_path={run_dir}" in resume_lines[0] and f"hydra.run.dir={run_dir}" in resume_lines[0]
    assert s["resume_command"] in resume_lines[0]
    rows_before = metric_rows(run_dir)

    result = run_train([*TINY, f"trainer.max_steps={STRAIGHT_STEPS}", f"ckpt_path={run_dir}",
                        f"hydra.run.dir={run_dir}"], offline_env)
    assert result.returncode == 0, result.stderr[-2000:]
    resumed = summary(run_dir)
    assert resumed["status"] == "completed" and resumed["resumed_at_step"] == step and resumed["resumed_in_place"]
    a, b = checkpoint(run_dir)["state_dict"], checkpoint(straight)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = metric_rows(run_dir)
    assert rows[: len(rows_before)] == rows_before  # the interrupted run's records are kept, then appended to
    assert rows == metric_rows(straight)  # and together they are the straight run's, step-0 validation included
    assert resumed["initial_val_loss"] == summary(straight)["initial_val_loss"]
    assert resumed["final_val_loss"] == summary(straight)["final_val_loss"]


@pytest.mark.slow
def test_sigusr1_is_an_interrupt_too(tmp_path: Path, offline_env: dict[str, str]) -> None:
    run_dir = tmp_path / "run"
    code, output = signal_mid_run([*TINY, "trainer.max_steps=1000", f"hydra.run.dir={run_dir}"], offline_env,
                                  signal.SIGUSR1, tmp_path / "run.log", after_steps=1)
    assert code == 128 + signal.SIGUSR1, output[-2000:]
    s = summary(run_dir)
    assert s["status"] == "interrupted" and s["interrupted_by"] == "SIGUSR1" and s["signal"] == signal.SIGUSR1
    assert checkpoint(run_dir)["global_step"] == s["steps"] >= 1


def test_a_signal_during_set_up_is_one_line(tmp_path: Path, offline_env: dict[str, str]) -> None:
    """Before training starts there is nothing to save: one line, no traceback, exit 128 + signal."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "altgrad.train", *TINY, f"hydra.run.dir={run_dir}"], cwd=REPO,
                            env=offline_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (run_dir / ".hydra" / "config.yaml").is_file() and time.monotonic() < deadline:
        time.sleep(0.05)  # Hydra has set the job up: the run is starting (imports, data, model)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err[-2000:]
    assert "Traceback" not in err + out
    assert "interrupted by SIGINT" in err
    if (run_dir / "summary.json").is_file():  # the signal came once train() had started: recorded as such
        s = summary(run_dir)
        assert s["status"] == "interrupted" and s["steps"] == 0 and s["checkpoint"] is None


@pytest.mark.slow
def test_a_sweep_hit_by_sigterm_stops_non_zero_and_resumes_the_job_in_place(tmp_path: Path,
                                                                            offline_env: dict[str, str]) -> None:
    sweep_dir = tmp_path / "sweep"
    args = ["-m", *TINY, "trainer.max_steps=16", "seed=1,2", f"hydra.sweep.dir={sweep_dir}"]
    code, output = signal_mid_run(args, offline_env, signal.SIGTERM, tmp_path / "sweep.log", after_steps=2)
    assert code == 128 + signal.SIGTERM, output[-2000:]
    s = summary(sweep_dir / "0")
    assert s["status"] == "interrupted" and not (sweep_dir / "1").exists()  # the sweep stopped with its job
    assert f"hydra.sweep.dir={sweep_dir} +resume_sweep=true" in output

    result = run_train([*args, "+resume_sweep=true"], offline_env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"resume_sweep: {sweep_dir / '0'} was interrupted; resuming it" in result.stdout
    resumed = summary(sweep_dir / "0")
    assert resumed["status"] == "completed" and resumed["steps"] == 16 and resumed["resumed_at_step"] == s["steps"]
    assert summary(sweep_dir / "1")["status"] == "completed"


@pytest.mark.slow
def test_the_requeue_recipe_starts_resumes_and_then_skips(tmp_path: Path, offline_env: dict[str, str]) -> None:
    """docs/faults.md: one command for a requeued job (a fixed folder and +resume_sweep=true)."""
    run_dir = tmp_path / "job"
    args = [*TINY, "trainer.max_steps=12", f"hydra.run.dir={run_dir}", "+resume_sweep=true"]
    code, output = signal_mid_run(args, offline_env, signal.SIGTERM, tmp_path / "first.log", after_steps=2)
    assert code == 128 + signal.SIGTERM, output[-2000:]
    step = summary(run_dir)["steps"]
    second = run_train(args, offline_env)
    assert second.returncode == 0 and "was interrupted; resuming it from its checkpoint" in second.stdout
    s = summary(run_dir)
    assert s["status"] == "completed" and s["steps"] == 12 and s["resumed_at_step"] == step
    third = run_train(args, offline_env)
    assert third.returncode == 0 and "already completed; skipped" in third.stdout

"""Interrupts are a result: a checkpoint at the step reached, status `interrupted`, one line on how to resume,
exit 128 + signal; resuming in place continues bit for bit and appends to the run's records."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from fault_helpers import (REPO, TINY, checkpoint, helper_env, metric_rows, run_train, signal_at, signal_mid_run,
                           summary)

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
    assert f"resume_sweep: {sweep_dir / '0'} was interrupted (SIGTERM at step {s['steps']}); resuming it" \
        in result.stdout
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
    assert second.returncode == 0 and f"was interrupted (SIGTERM at step {step}); resuming it from its checkpoint" \
        in second.stdout
    s = summary(run_dir)
    assert s["status"] == "completed" and s["steps"] == 12 and s["resumed_at_step"] == step
    third = run_train(args, offline_env)
    assert third.returncode == 0 and "already completed; skipped" in third.stdout


# --- every moment can be continued or finished by the printed command ---------------------------------------------
@pytest.mark.parametrize("hook,step", [("on_train_end", None),
                                       pytest.param("on_validation_start", STRAIGHT_STEPS, marks=pytest.mark.slow)])
def test_a_signal_after_the_last_step_is_finished_by_the_printed_command(hook: str, step: int | None, tmp_path: Path,
                                                                         straight: Path,
                                                                         offline_env: dict[str, str]) -> None:
    """SIGTERM once every step is done (noted at the end of training, or during the final validation, which then
    stops at once): status interrupted at max_steps with its checkpoint; the printed command finishes the run."""
    env = helper_env(offline_env)
    run_dir = tmp_path / "run"
    # Validation every 5 steps: the final one at step 12 comes after training, as in any run whose interval does
    # not divide max_steps.
    args = [*TINY, f"trainer.max_steps={STRAIGHT_STEPS}", "trainer.val_check_interval=5", f"hydra.run.dir={run_dir}"]
    first = run_train([*args, *signal_at(hook, signal.SIGTERM, tmp_path / "fired", step)], env)
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-2000:]
    s = summary(run_dir)
    assert s["status"] == "interrupted" and s["steps"] == s["checkpoint_step"] == STRAIGHT_STEPS
    assert s["final_val_step"] == 10  # the last validation run: the final one (step 12) did not
    line = first.stderr.strip().splitlines()[-1]
    assert line.startswith(f"interrupted by SIGTERM at step {STRAIGHT_STEPS}; checkpoint saved; resume with: python")
    rows_before = metric_rows(run_dir)

    again = run_train(shlex.split(line.split("resume with: ", 1)[1])[3:], env)  # the printed command, as printed
    assert again.returncode == 0, again.stderr[-2000:]
    done = summary(run_dir)
    assert done["status"] == "completed" and done["steps"] == STRAIGHT_STEPS
    assert done["resumed_at_step"] == STRAIGHT_STEPS and done["resumed_in_place"]
    # The same weights as a straight run (validated every 2 steps: the interval changes no weight) and so the same
    # final loss; the interrupted run's records are kept and the final validation appended once.
    assert done["final_val_loss"] == summary(straight)["final_val_loss"]
    rows = metric_rows(run_dir)
    assert rows[: len(rows_before)] == rows_before and len(rows) == len(rows_before) + 1
    assert float(rows[-1]["val/loss"]) == pytest.approx(done["final_val_loss"], rel=1e-6)


def test_a_signal_in_the_sanity_check_then_the_same_command_starts_again(tmp_path: Path,
                                                                         offline_env: dict[str, str]) -> None:
    env = helper_env(offline_env)
    run_dir = tmp_path / "run"
    args = [*TINY, "trainer.max_steps=3", f"hydra.run.dir={run_dir}",
            *signal_at("on_sanity_check_start", signal.SIGTERM, tmp_path / "fired")]
    first = run_train(args, env)
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-2000:]
    s = summary(run_dir)
    assert s["status"] == "interrupted" and s["steps"] == 0 and s["checkpoint"] is None
    assert first.stderr.strip().splitlines()[-1].endswith("nothing trained yet, so no checkpoint: rerun the same "
                                                          "command to start again")
    again = run_train(args, env)  # what it says
    assert again.returncode == 0, again.stderr[-2000:]
    assert summary(run_dir)["status"] == "completed" and summary(run_dir)["steps"] == 3


def test_the_requeue_recipe_resumes_a_killed_run_from_its_checkpoint(tmp_path: Path, straight: Path,
                                                                     offline_env: dict[str, str]) -> None:
    """SIGKILL (no chance to save): the same command resumes from the last periodic checkpoint, never from step 0,
    and the records are the straight run's. A temporary file a kill mid-write leaves is removed."""
    env = helper_env(offline_env)
    run_dir = tmp_path / "job"
    args = [*TINY, f"trainer.max_steps={STRAIGHT_STEPS}", "trainer.checkpoint_every_n_steps=4",
            f"hydra.run.dir={run_dir}", "+resume_sweep=true",
            *signal_at("on_train_batch_end", signal.SIGKILL, tmp_path / "fired", step=6)]
    first = run_train(args, env)
    assert first.returncode == -signal.SIGKILL and not (run_dir / "summary.json").exists()
    assert checkpoint(run_dir)["global_step"] == 4
    orphan = run_dir / "checkpoints" / ".last.ckpt.0123456789abcdef0123456789abcdef.tmp"
    orphan.write_bytes(b"half a checkpoint")  # what a kill during a checkpoint write leaves
    second = run_train(args, env)
    assert second.returncode == 0, second.stderr[-2000:]
    assert f"resume_sweep: {run_dir} ended without a summary (killed); resuming it from its checkpoint" in second.stdout
    s = summary(run_dir)
    assert s["status"] == "completed" and s["resumed_at_step"] == 4 and not orphan.exists()
    a, b = checkpoint(run_dir)["state_dict"], checkpoint(straight)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert metric_rows(run_dir) == metric_rows(straight)  # rows the killed run logged after step 4 were dropped
    third = run_train(args, env)
    assert third.returncode == 0 and "already completed; skipped" in third.stdout


@pytest.mark.slow  # ≈ 80 s: two process pools
def test_a_joblib_sweep_stops_as_one_and_resumes(tmp_path: Path, offline_env: dict[str, str]) -> None:
    """hydra/launcher=joblib: a SIGTERM to the sweep reaches the jobs in its worker processes; each running job saves
    its checkpoint at the step reached, the queued one does not start, and the printed command resumes them all."""
    sweep_dir = tmp_path / "sweep"
    args = ["-m", *TINY, "trainer.max_steps=30", "seed=1,2,3", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
            f"hydra.sweep.dir={sweep_dir}"]
    code, output = signal_mid_run(args, offline_env, signal.SIGTERM, tmp_path / "sweep.log", after_steps=2)
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert "Traceback" not in output
    steps = {}
    for job in ("0", "1"):  # running when the signal came (a job still starting up may not have started at all)
        if (sweep_dir / job / "summary.json").exists():
            s = summary(sweep_dir / job)
            assert s["status"] == "interrupted" and 1 <= s["steps"] < 30 and s["checkpoint_step"] == s["steps"]
            assert checkpoint(sweep_dir / job)["global_step"] == s["steps"]
            steps[job] = s["steps"]
    assert steps and not (sweep_dir / "2" / "summary.json").exists() and not (sweep_dir / ".stop").exists()
    lines = [line[line.index("interrupted by"):] for line in output.splitlines() if "the sweep's running jobs" in line]
    assert len(lines) == 1 and lines[0].startswith("interrupted by SIGTERM: the sweep's running jobs stopped with "
                                                   "their checkpoints and the others did not start; resume with: ")
    line = lines[0]

    result = run_train(shlex.split(line.split("resume with: ", 1)[1])[3:], offline_env)
    assert result.returncode == 0, result.stderr[-3000:]
    for job in ("0", "1", "2"):
        s = summary(sweep_dir / job)
        assert s["status"] == "completed" and s["steps"] == 30 and s.get("resumed_at_step") == steps.get(job)


def test_a_sweep_that_a_resume_check_refuses_changes_nothing_and_starts_no_job(tmp_path: Path,
                                                                              offline_env: dict[str, str]) -> None:
    """+resume_sweep=true with a new budget: the first finished job is another configuration's; it is refused with
    one line, every file of the sweep (.hydra/ and multirun.yaml included) stays as it was, no further job runs."""
    sweep_dir = tmp_path / "sweep"
    args = ["-m", *TINY, "trainer.max_steps=3", "seed=1,2", f"hydra.sweep.dir={sweep_dir}"]
    assert run_train(args, offline_env).returncode == 0
    (sweep_dir / "1" / "summary.json").unlink()  # job 1 "was killed": a rerun would run it
    before = {p: p.read_bytes() for p in sweep_dir.rglob("*") if p.is_file()}
    result = run_train([*args[:-1], "trainer.max_steps=5", f"hydra.sweep.dir={sweep_dir}", "+resume_sweep=true"],
                       offline_env)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr + result.stdout
    assert errors[0].startswith(f"error: resume_sweep: {sweep_dir / '0' / 'summary.json'} holds a completed run of "
                                "another configuration (trainer.max_steps: 3 → 5); nothing was changed and no further "
                                "job")
    after = {p: p.read_bytes() for p in sweep_dir.rglob("*") if p.is_file()}
    assert after == before

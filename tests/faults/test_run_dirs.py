"""One run, one folder: runs started together never share a folder, and a taken folder is refused untouched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fault_helpers import TINY, run_train, summary

QUICK = [*TINY, "trainer.max_steps=3"]


def _start(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "altgrad.train", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _val_rows_at_step_0(run_dir: Path) -> int:
    lines = (run_dir / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    step, val = header.index("step"), header.index("val/loss")
    return sum(1 for line in lines[1:] if line.split(",")[step] == "0" and line.split(",")[val])


def test_two_runs_started_together_get_two_folders(tmp_path: Path, offline_env: dict[str, str]) -> None:
    procs = [_start(QUICK, offline_env, tmp_path) for _ in range(2)]  # the default run dir, under tmp_path/outputs
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    run_dirs = {line.split("run dir: ", 1)[1] for out, _ in outs for line in out.splitlines()
                if line.startswith("run dir: ")}
    assert len(run_dirs) == 2
    for run_dir in map(Path, run_dirs):
        assert summary(run_dir)["status"] == "completed"
        assert _val_rows_at_step_0(run_dir) == 1  # its own records only


@pytest.mark.slow
def test_two_runs_in_one_explicit_folder_one_is_refused(tmp_path: Path, offline_env: dict[str, str]) -> None:
    run_dir = tmp_path / "shared"
    procs = [_start([*QUICK, f"seed={seed}", f"hydra.run.dir={run_dir}"], offline_env, tmp_path) for seed in (1, 2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert sorted(p.returncode for p in procs) == [0, 2], [o[1][-2000:] for o in outs]
    refused = outs[[p.returncode for p in procs].index(2)][1]
    errors = [line for line in refused.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"run dir {run_dir}" in errors[0] and "Traceback" not in refused
    assert "in use by a live run" in errors[0] or "already holds a completed run" in errors[0]
    assert summary(run_dir)["status"] == "completed" and _val_rows_at_step_0(run_dir) == 1
    # the folder's record is the winner's: the loser wrote nothing (.hydra/ is written by the run that owns it)
    winner = summary(run_dir)["seed"]
    assert f"seed={winner}" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert f"\nseed: {winner}\n" in "\n" + (run_dir / ".hydra" / "config.yaml").read_text()


@pytest.mark.slow  # the default suite checks the refusal in test_bad_inputs.py
def test_a_finished_folder_is_refused_and_left_as_it_was(tmp_path: Path, offline_env: dict[str, str]) -> None:
    run_dir = tmp_path / "done"
    assert run_train([*QUICK, f"hydra.run.dir={run_dir}"], offline_env).returncode == 0
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    result = run_train([*QUICK, "seed=7", f"hydra.run.dir={run_dir}"], offline_env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: run dir {run_dir} already holds a completed run (3 steps); give another hydra.run.dir "
        "(or leave it unset for a fresh folder)")
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before  # .hydra/ included

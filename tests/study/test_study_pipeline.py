"""The study driver at debug size, two sweeps at a time, end to end through the real entry points: pilot → horizon
check → AdamW tuning → arm tuning → tuned-lr table → evaluation at the table's lrs → report from the copied records
alone; then the same command (one sweep at a time) on an empty sweep folder resumes from the records without
training anything again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # ≈ 25 five-step jobs and their rerun: 1-2 minutes on 2 cores

REPO = Path(__file__).resolve().parents[2]
RECORD = {"summary.json", "metrics.csv", "layer_map.json", ".hydra/overrides.yaml"}


def study(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "altgrad.study", "study_cpu_debug", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("study_env")
    return {**os.environ, "ALTGRAD_CACHE": str(root / "cache"), "WANDB_MODE": "offline",
            "WANDB_SILENT": "true", "WANDB_DIR": str(root / "wandb"), "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "HYDRA_FULL_ERROR": "0", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> tuple[Path, subprocess.CompletedProcess]:
    base = tmp_path_factory.mktemp("study")
    done = study(["--root", str(base / "root"), "--records", str(base / "runs"), "--out", str(base / "out"),
                  "--jobs", "2"], env)
    return base, done


def test_the_debug_study_runs_every_stage(ran) -> None:
    base, done = ran
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[study] horizon: H = 5 passes" in done.stdout
    runs = base / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["eval", "pilot", "tune", "tune_arms"]
    for stage in runs.iterdir():
        for record in stage.iterdir():  # exactly the four files, no checkpoints, logs or W&B
            files = {p.relative_to(record).as_posix() for p in record.rglob("*") if p.is_file()}
            assert files == RECORD, record
    assert len(list((runs / "pilot").iterdir())) == 2 and len(list((runs / "eval").iterdir())) == 3 * 2
    assert len(list((runs / "tune").iterdir())) >= 4 and len(list((runs / "tune_arms").iterdir())) >= 2 * 4
    # two sweeps at a time: the evaluation as one sweep per cell (format × arm), its seeds inside
    evals = [line for line in done.stdout.splitlines() if line.startswith("[study] eval: ")]
    assert [next(a for a in line.split() if a.startswith("optimizer=")) for line in evals] == \
        ["optimizer=adamw", "optimizer=manifold", "optimizer=relative"]


def test_the_evaluation_ran_at_the_tuned_lrs(ran) -> None:
    base, done = ran
    assert done.returncode == 0, done.stderr[-3000:]
    table = yaml.safe_load((base / "root" / "conf" / "debug_tuned" / "study_cpu_debug.yaml").read_text())
    cell = table["tuned_lr"]["e4m3"]
    assert set(cell) == {"plain", "adamw", "manifold", "relative"} and cell["plain"] == cell["adamw"]
    for record in (base / "runs" / "eval").iterdir():
        summary = json.loads((record / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["format"] == "e4m3"
        assert summary["lr"] == pytest.approx(cell[summary["optimizer"]])
        assert summary["config"]["baseline"]["lr"] == pytest.approx(cell["plain"])
    for record in (base / "runs" / "tune_arms").iterdir():  # the arms were tuned at AdamW's pick
        assert json.loads((record / "summary.json").read_text())["config"]["baseline"]["lr"] == cell["plain"]


def test_the_report_regenerates_from_the_records(ran, env: dict[str, str]) -> None:
    base, done = ran
    assert done.returncode == 0, done.stderr[-3000:]
    written = (base / "out" / "report.md").read_text()
    assert "## Declared endpoint (study_cpu_debug)" in written
    again = subprocess.run([sys.executable, "-m", "altgrad.report", str(base / "runs"), "--out", str(base / "out")],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert (base / "out" / "report.md").read_text() == written


def test_a_rerun_from_the_records_alone_trains_nothing(ran, env: dict[str, str]) -> None:
    base, done = ran
    assert done.returncode == 0, done.stderr[-3000:]
    before = {p: p.read_bytes() for p in (base / "runs").rglob("*") if p.is_file()}
    table = base / "root" / "conf" / "debug_tuned" / "study_cpu_debug.yaml"
    fresh = base / "fresh"  # a new checkout: no sweep folders, only the records (and the committed table)
    (fresh / "conf" / "debug_tuned").mkdir(parents=True)
    (fresh / "conf" / "debug_tuned" / table.name).write_text(table.read_text())
    again = study(["--root", str(fresh), "--records", str(base / "runs"), "--out", str(base / "out2"),
                   "--until", "eval"], env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "restored from" in again.stdout and "run dir:" not in again.stdout
    assert "python -m altgrad.train" not in again.stdout  # every job finished: not even a sweep process started
    assert {p: p.read_bytes() for p in (base / "runs").rglob("*") if p.is_file()} == before

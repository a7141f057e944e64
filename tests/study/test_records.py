"""A job's record: the four files the report loads, copied out of its job dir (nothing else), only once the job wrote
its summary, and again whenever one of them changed."""

from __future__ import annotations

import json
from pathlib import Path

from altgrad.sweep.records import RECORD_FILES, collect, copy_job, job_dirs


def make_job(path: Path, status: str | None = "completed") -> Path:
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    (path / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (path / "metrics.csv").write_text("step,val/loss\n0,5.5\n")
    (path / "layer_map.json").write_text("{}")
    (path / "checkpoints").mkdir()
    (path / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    (path / "train.log").write_text("log")
    if status is not None:
        (path / "summary.json").write_text(json.dumps({"status": status}))
    return path


def files_below(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_a_record_holds_the_four_files_and_nothing_else(tmp_path: Path) -> None:
    job = make_job(tmp_path / "sweep" / "seed=1")
    assert copy_job(job, tmp_path / "rec" / "seed=1") == 4
    assert files_below(tmp_path / "rec" / "seed=1") == sorted(RECORD_FILES)
    for name in RECORD_FILES:
        assert (tmp_path / "rec" / "seed=1" / name).read_bytes() == (job / name).read_bytes()
        assert (tmp_path / "rec" / "seed=1" / name).stat().st_mode & 0o777 == 0o644


def test_copies_only_what_changed(tmp_path: Path) -> None:
    job = make_job(tmp_path / "job")
    dest = tmp_path / "rec"
    assert copy_job(job, dest) == 4 and copy_job(job, dest) == 0
    (job / "metrics.csv").write_text("step,val/loss\n0,5.5\n24,3.0\n")
    (job / "summary.json").write_text(json.dumps({"status": "diverged"}))
    assert copy_job(job, dest) == 2
    assert json.loads((dest / "summary.json").read_text()) == {"status": "diverged"}
    assert (dest / "metrics.csv").read_text().endswith("24,3.0\n")


def test_a_job_without_a_summary_is_not_copied(tmp_path: Path) -> None:
    running = make_job(tmp_path / "running", status=None)
    assert copy_job(running, tmp_path / "rec") == 0 and not (tmp_path / "rec").exists()
    broken = make_job(tmp_path / "broken", status=None)
    (broken / "summary.json").write_text("{not json")
    assert copy_job(broken, tmp_path / "rec2") == 0


def test_collect_copies_every_job_of_a_sweep_under_its_name(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    for name, status in (("lr=0.1,seed=1", "completed"), ("lr=1,seed=1", "failed"), ("lr=3,seed=1", None)):
        make_job(sweep / name, status)
    (sweep / "multirun.yaml").write_text("x")
    assert [p.name for p in job_dirs(sweep)] == ["lr=0.1,seed=1", "lr=1,seed=1", "lr=3,seed=1"]
    assert collect(sweep, tmp_path / "rec") == 8
    assert sorted(p.name for p in (tmp_path / "rec").iterdir()) == ["lr=0.1,seed=1", "lr=1,seed=1"]
    assert collect(tmp_path / "nowhere", tmp_path / "rec") == 0

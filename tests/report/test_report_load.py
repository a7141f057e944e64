"""Loading sweep folders: every job found (flat or nested), broken jobs kept and labelled, bad folders refused."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from report_synthetic import write_job

from altgrad.report.load import load_sweeps, read_curve


def test_flat_sweep_states(ab_sweep: Path) -> None:
    sweep = load_sweeps([ab_sweep])
    states = Counter(j.state for j in sweep.jobs)
    assert states == {"completed": 25, "diverged": 1, "failed": 1, "corrupt": 1, "missing": 1}
    assert [j.name for j in sweep.jobs[:3]] == ["0", "1", "2"]  # natural order, not 0, 1, 10
    assert sweep.jobs[10].name == "10"


def test_broken_jobs_are_described(ab_sweep: Path) -> None:
    sweep = load_sweeps([ab_sweep])
    corrupt, = sweep.by_state("corrupt")
    assert "unreadable summary.json" in corrupt.problem
    assert (corrupt.format, corrupt.optimizer, corrupt.seed) == ("e5m2", "grid", 0)  # from .hydra/overrides.yaml
    missing, = sweep.by_state("missing")
    assert "no summary.json" in missing.problem and missing.format == "e7m0"
    failed, = sweep.by_state("failed")
    assert failed.problem == "RuntimeError: CUDA out of memory"
    assert failed.curve == () and failed.final_loss is None
    diverged, = sweep.by_state("diverged")
    assert diverged.problem == "nonfinite loss" and diverged.final_loss is None


def test_completed_job_fields(ab_sweep: Path) -> None:
    job = load_sweeps([ab_sweep]).jobs[1]
    assert (job.format, job.optimizer_label, job.storage, job.seed, job.lr) == (
        "e4m3", "manifold[update]", "fp32 master", 0, 0.3)
    assert job.final_loss == pytest.approx(3.1)
    assert job.diagnostics["mean_stall_ratio"] == 0.1
    assert job.curve[0] == (0, pytest.approx(5.1)) and job.curve[-1] == (50, pytest.approx(3.1))
    grid = load_sweeps([ab_sweep]).jobs[2]
    assert grid.storage == "on-grid nearest"


def test_nested_and_multiple_sweeps(ab_sweep: Path, stage_sweep: Path) -> None:
    stages = load_sweeps([stage_sweep])
    assert len(stages.jobs) == 21
    assert "e4m3/forward+grad/1" in {j.name for j in stages.jobs}
    both = load_sweeps([ab_sweep, stage_sweep])
    assert len(both.jobs) == 29 + 21
    assert {j.name.split("/")[0] for j in both.jobs} == {"ab", "stages"}


def test_sweeps_with_the_same_folder_name_are_told_apart(tmp_path: Path) -> None:
    for day in ("2025-01-01", "2025-01-02"):
        write_job(tmp_path / day / "12-00-00" / "0", fmt="e4m3", optimizer="adamw", seed=0, final=3.0)
    a, b = tmp_path / "2025-01-01" / "12-00-00", tmp_path / "2025-01-02" / "12-00-00"
    names = [j.name for j in load_sweeps([a, b]).jobs]
    assert names == ["2025-01-01/12-00-00/0", "2025-01-02/12-00-00/0"]
    assert len(load_sweeps([a, a / ".." / "12-00-00"]).jobs) == 1  # one folder given twice is read once


def test_single_run_dir_is_one_job(ab_sweep: Path) -> None:
    sweep = load_sweeps([ab_sweep / "0"])
    assert len(sweep.jobs) == 1 and sweep.jobs[0].state == "completed"


def test_missing_or_empty_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_sweeps([tmp_path / "nope"])
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(ValueError, match="no jobs in"):
        load_sweeps([tmp_path / "empty"])
    with pytest.raises(ValueError, match="no sweep folder"):
        load_sweeps([])


def test_read_curve_tolerates_bad_files(tmp_path: Path) -> None:
    good = tmp_path / "m.csv"
    good.write_text("step,epoch,train/loss,val/loss\n0,0,5.0,\n0,0,,4.5\n10,0,,nan\n20,0,,oops\n30,0,,3.9\n")
    assert read_curve(good, "val/loss") == [(0, 4.5), (30, 3.9)]
    assert read_curve(good, "val/ppl") == []
    assert read_curve(tmp_path / "absent.csv", "val/loss") == []
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert read_curve(binary, "val/loss") == []


def test_an_interrupted_job_is_listed_not_a_result(tmp_path: Path) -> None:
    write_job(tmp_path / "0", fmt="e4m3", optimizer="adamw", seed=0, final=None, status="interrupted", steps=30)
    (job,) = load_sweeps([tmp_path]).jobs
    assert job.state == "interrupted" and job.final_loss is None
    assert job.problem == "interrupted at step 30 (resume the sweep to finish it)"

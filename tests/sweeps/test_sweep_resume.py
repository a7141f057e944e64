"""+resume_sweep=true: which earlier runs count as finished, and a job dir holding another run is never reused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from altgrad.config import ConfigError
from altgrad.sweep.resume import config_differences, finished_run, skip_finished


def job_config(run_dir: Path, resume: bool = True, **changes: object) -> DictConfig:
    """A task config as a job sees it (a few sections are enough: the check compares whatever is there)."""
    cfg = OmegaConf.create({
        "seed": 1, "experiment_name": "manifold_ab", "run_name": "nano-e4m3-adamw-s1",
        "format": {"name": "e4m3", "grad": "e5m2"},
        "optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.99]},
        "quant": {"master": "fp32", "storage_rounding": "nearest"},
        "data": {"name": "embedded", "cache_dir": "/tmp/one-cache"},
        "trainer": {"max_steps": 300, "progress_refresh": 10},
        "paths": {"output_dir": str(run_dir)},
    })
    if resume:
        cfg.resume_sweep = True
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def write_summary(run_dir: Path, status: str, cfg: DictConfig | None = None) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    config = OmegaConf.to_container(cfg if cfg is not None else job_config(run_dir, resume=False), resolve=True)
    path = run_dir / "summary.json"
    path.write_text(json.dumps({"status": status, "final_val_loss": 2.5, "config": config}))
    return path


@pytest.mark.parametrize("status", ["completed", "diverged"])
def test_a_finished_run_is_skipped(tmp_path: Path, status: str, capsys: pytest.CaptureFixture) -> None:
    write_summary(tmp_path, status)
    assert finished_run(job_config(tmp_path))["status"] == status
    assert skip_finished(job_config(tmp_path))
    assert f"already {status}; skipped" in capsys.readouterr().out


def test_failed_missing_and_broken_runs_run_again(tmp_path: Path) -> None:
    assert finished_run(job_config(tmp_path / "never_ran")) is None
    write_summary(tmp_path / "failed", "failed")
    assert finished_run(job_config(tmp_path / "failed")) is None
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "summary.json").write_text('{"status": "compl')  # killed mid-write, say
    assert finished_run(job_config(tmp_path / "broken")) is None


def test_without_the_flag_every_job_runs(tmp_path: Path) -> None:
    write_summary(tmp_path, "completed")
    assert finished_run(job_config(tmp_path, resume=False)) is None
    assert not skip_finished(job_config(tmp_path, resume=False))


def test_storage_and_display_keys_do_not_count(tmp_path: Path) -> None:
    write_summary(tmp_path, "completed")
    moved = job_config(tmp_path, **{"data.cache_dir": "/elsewhere", "trainer.progress_refresh": 50,
                                     "run_name": "renamed"})
    assert finished_run(moved) is not None


def test_a_finished_run_of_another_config_is_an_error_not_overwritten(tmp_path: Path) -> None:
    path = write_summary(tmp_path, "completed")
    before = path.read_bytes()
    with pytest.raises(ConfigError, match=r"optimizer\.lr: 0\.001 → 0\.003.*new sweep dir"):
        finished_run(job_config(tmp_path, **{"optimizer.lr": 3e-3}))
    assert path.read_bytes() == before


def test_config_differences_lists_changed_added_and_removed_keys() -> None:
    stored = {"seed": 1, "optimizer": {"lr": 0.1, "betas": [0.9, 0.99]}, "paths": {"output_dir": "a"}}
    current = {"seed": 1, "optimizer": {"lr": 0.1, "betas": [0.9, 0.95]}, "trainer": {"max_steps": 5},
               "paths": {"output_dir": "b"}, "resume_sweep": True}
    assert config_differences(stored, current) == ["optimizer.betas: [0.9, 0.99] → [0.9, 0.95]",
                                                   "trainer.max_steps: None → 5"]

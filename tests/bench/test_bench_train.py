"""train(cfg) called directly: determinism by seed, summary.json contents, and how failures are recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from altgrad.config import ConfigError
from altgrad.train import train

from bench_helpers import REPO, TINY


def tiny_cfg(run_dir: Path, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("train", overrides=[*TINY, "logger=csv", "trainer.max_steps=6", "trainer.progress_refresh=100",
                                           "trainer.initial_validation=false", f"paths.output_dir={run_dir}",
                                           *overrides])


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt")["state_dict"]


class SummaryProbe(L.Callback):
    """Reports into run_summary the way diagnostics callbacks do."""

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        pl_module.run_summary["diagnostics"]["probe_steps"] = trainer.global_step


class Explode(L.Callback):
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        if trainer.global_step == 3:
            raise RuntimeError("boom at step 3")


class PoisonWeights(L.Callback):
    @torch.no_grad()
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        if trainer.global_step == 4:
            pl_module.model.lm_head.weight.fill_(float("nan"))


def test_same_seed_same_run_and_a_complete_summary(tmp_path: Path) -> None:
    # Run a also carries a callback reporting into run_summary; it must not change the training itself.
    a, b = tmp_path / "a", tmp_path / "b"
    summary = train(tiny_cfg(a, "seed=7", "+callbacks.probe._target_=test_bench_train.SummaryProbe",
                             "experiment_name=unit"))
    again = train(tiny_cfg(b, "seed=7"))
    assert summary["final_val_loss"] == again["final_val_loss"]
    wa, wb = weights(a), weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # (other seeds differ: see the multirun test)

    on_disk = json.loads((a / "summary.json").read_text())
    assert on_disk == summary
    assert summary["diagnostics"]["probe_steps"] == 6
    assert summary["status"] == "completed" and summary["steps"] == 6 and summary["seed"] == 7
    assert summary["experiment"] == "unit" and summary["lr"] == summary["config"]["optimizer"]["lr"]
    assert (summary["master"], summary["storage_rounding"], summary["layer_map"]) == ("fp32", "nearest", "uniform")
    assert summary["best_val_loss"] <= summary["final_val_loss"]
    assert summary["tokens_per_second"] > 0 and summary["tokens_seen"] == 6 * 4 * 32
    assert summary["config"]["model"]["n_embd"] == 32


def test_failure_mid_run_writes_status_failed_and_reraises(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="boom at step 3"):
        train(tiny_cfg(run_dir, "+callbacks.explode._target_=test_bench_train.Explode"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == "RuntimeError: boom at step 3"
    assert summary["wall_seconds"] > 0


def test_non_finite_validation_loss_means_diverged(tmp_path: Path) -> None:
    # callbacks=none: no divergence instrument, so train() itself must notice the non-finite loss.
    summary = train(tiny_cfg(tmp_path / "run", "callbacks=none",
                             "+callbacks.poison._target_=test_bench_train.PoisonWeights"))
    assert summary["status"] == "diverged" and summary["final_val_loss"] is None
    assert summary["divergence_cause"] == "non-finite validation loss" and summary["diverged_at_step"] == 6


def test_invalid_config_writes_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match="trainer.max_steps"):
        train(tiny_cfg(run_dir, "trainer.max_steps=-3"))
    assert not run_dir.exists()

"""End to end through the real entry point, `python -m altgrad.train`, in subprocesses."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from bench_helpers import run_cli


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def train_losses(run_dir: Path) -> dict[int, str]:
    with open(run_dir / "metrics.csv") as f:
        return {int(r["step"]): r["train/loss"] for r in csv.DictReader(f) if r["train/loss"]}


def test_default_run_for_20_steps_writes_every_output(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_cli("trainer.max_steps=20", "trainer.val_check_interval=10", "trainer.sample_tokens=20",
                   f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["steps"] == 20 and summary["error"] is None
    for key in ("final_val_loss", "best_val_loss", "tokens_per_second", "wall_seconds", "seed", "format",
                "optimizer", "layer_map", "model", "data"):
        assert summary[key] is not None, key
    assert (summary["format"], summary["optimizer"], summary["model"], summary["data"]) == \
        ("fp32", "adamw", "nano", "embedded")
    assert summary["initial_val_loss"] == pytest.approx(math.log(257), abs=0.1)
    assert summary["final_val_loss"] < summary["initial_val_loss"] - 0.5
    assert summary["config"]["paths"]["output_dir"] == str(run_dir)
    assert sorted(train_losses(run_dir)) == list(range(9, 20, 10))  # every log_every_n_steps=10
    with open(run_dir / "metrics.csv") as f:
        header = next(csv.reader(f))
    assert {"train/loss", "val/loss", "val/ppl", "lr", "train/tokens_per_s"} <= set(header)
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt")  # torch's default: weights_only=True
    assert ckpt["global_step"] == 20 and ckpt["TextDataModule"] == {"position": 20, "seed": summary["seed"]}
    offline_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1 and list(offline_runs[0].glob("run-*.wandb"))
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert "status: completed" in proc.stdout and "final_val_loss" in proc.stdout


@pytest.mark.parametrize(("args", "needles"), [
    (["format=e9m9"], ["format=e9m9", "valid:", "e4m3", "fp32"]),
    (["trainer.max_steps=abc"], ["trainer.max_steps='abc'", "expected an integer"]),
    (["data=local", "data.path=/no/such/corpus.txt"], ["data.path='/no/such/corpus.txt'", "matches no"]),
])
def test_bad_override_exits_nonzero_with_one_line(tmp_path: Path, args: list[str], needles: list[str]) -> None:
    run_dir = tmp_path / "run"
    proc = run_cli(*args, f"hydra.run.dir={run_dir}")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert all(n in lines[0] for n in needles), lines[0]
    assert not (run_dir / "summary.json").exists()


def test_failure_during_the_run_is_recorded_and_exits_nonzero(tmp_path: Path) -> None:
    # Offline with no Hugging Face cache: the dataset cannot load. One line on stderr, status failed on disk.
    run_dir = tmp_path / "run"
    proc = run_cli("data=eurlex", "data.tokenizer=bytes", "logger=csv", f"hydra.run.dir={run_dir}")
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    for needle in ("coastalcph/lex_glue", "HF_HUB_OFFLINE", "data=embedded"):
        assert needle in errors[0]
    summary = read_summary(run_dir)  # complete JSON, written atomically
    assert summary["status"] == "failed" and "coastalcph/lex_glue" in summary["error"]
    assert not list(run_dir.glob(".summary.json*"))

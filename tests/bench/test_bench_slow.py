"""Long end-to-end checks (`make test-slow`): the full default run learns; torch.compile trains the same model."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from bench_helpers import TINY, run_cli

pytestmark = pytest.mark.slow


def test_default_run_learns_well_below_the_uniform_loss(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    start = time.perf_counter()
    proc = run_cli(f"hydra.run.dir={run_dir}", "logger=csv")
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"default run: {elapsed:.0f} s wall, final val loss {summary['final_val_loss']:.3f}")
    assert summary["status"] == "completed" and summary["steps"] == 300
    assert summary["initial_val_loss"] == pytest.approx(math.log(257), abs=0.1)
    assert summary["final_val_loss"] < 0.5 * math.log(257)


def test_compiled_backbone_trains(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"  # force: the CPU preset refuses trainer.compile=true
    proc = run_cli(*TINY, "trainer.max_steps=6", "trainer.compile=force", "logger=csv", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_val_loss"] < summary["initial_val_loss"]

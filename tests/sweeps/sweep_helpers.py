"""Helpers of the sweep tests: run the real entry point, read a sweep folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONF_DIR = REPO / "conf"
FULL = ("format_ablation", "layer_sensitivity")
EXPERIMENTS = FULL + tuple(f"{name}_debug" for name in FULL)


def run_train(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m altgrad.train ARGS` from the repo root (no -m: experiments are multiruns by themselves)."""
    return subprocess.run([sys.executable, "-m", "altgrad.train", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def job_dirs(sweep_dir: Path) -> dict[str, Path]:
    """Job dirs directly below a sweep folder (Hydra's .submitit/ and multirun.yaml aside), by name."""
    return {p.name: p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")}


def summary(job_dir: Path) -> dict:
    return json.loads((job_dir / "summary.json").read_text())

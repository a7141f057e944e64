"""One code state per study: a committed record of study 2, rerun from its own overrides for its first logged
steps on this code, gives the same numbers bit for bit (initial weights, data order and the logged training loss;
the initial weights' fingerprint only where the record was not resumed: a resumed run records the weights it
resumed from).
Needs the eurlex-en files (--eurlex DIR); the records were computed with one thread, and so is the rerun."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RECORDS = REPO / "docs" / "results" / "study-ongrid" / "runs"
NOT_REPEATED = ("data.dir=", "+resume_sweep=", "resume_sweep=", "hydra.")


def one_record_per_stage() -> list[Path]:
    """The first completed record of each stage (evaluation stages first), as the study committed them."""
    if not RECORDS.is_dir():
        return []
    picked = []
    for stage in sorted(p for p in RECORDS.iterdir() if p.is_dir()):
        for job in sorted(stage.iterdir()):
            try:
                if json.loads((job / "summary.json").read_text())["status"] == "completed":
                    picked.append(job)
                    break
            except (OSError, ValueError, KeyError):
                continue
    return picked


def first_logged_loss(metrics: Path) -> tuple[int, str]:
    with open(metrics, newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("train/loss"):
                return int(row["step"]), row["train/loss"]
    raise AssertionError(f"{metrics} logs no train/loss")


@pytest.mark.parametrize("record", one_record_per_stage(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_committed_record_reruns_to_the_same_numbers(record: Path, eurlex: str, tmp_path: Path,
                                                       offline_env: dict[str, str]) -> None:
    summary = json.loads((record / "summary.json").read_text())
    step, loss = first_logged_loss(record / "metrics.csv")
    overrides = [o for o in yaml.safe_load((record / ".hydra" / "overrides.yaml").read_text())
                 if not o.startswith(NOT_REPEATED)]
    run = tmp_path / "run"
    command = [sys.executable, "-m", "altgrad.train", *overrides, f"data.dir={eurlex}", "hydra.mode=RUN",
               f"hydra.run.dir={run}", f"trainer.max_steps={step + 1}",
               f"schedule.decay_steps={summary['config']['trainer']['max_steps']}"]  # the record's own schedule
    done = subprocess.run(command, cwd=REPO, env={**offline_env, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    again = json.loads((run / "summary.json").read_text())
    assert again["data_files"] == summary["data_files"]
    if summary.get("resumed_at_step") is None:  # a resumed record's fingerprint is of the weights it resumed from
        assert again["fingerprint"]["init_params"] == summary["fingerprint"]["init_params"]
    assert first_logged_loss(run / "metrics.csv") == (step, loss)

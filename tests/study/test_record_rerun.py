"""One code state per study: a committed record of study 2, rerun from its own overrides for its first logged
steps on this code, gives the same numbers bit for bit (initial weights, data order, the step-0 validation loss and
the logged training loss; the initial weights' fingerprint only where the record was not resumed: a resumed run
records the weights it resumed from).
Needs the eurlex-en files (--eurlex DIR); the records were computed with one thread, and so is the rerun. The default
suite reruns one record of each evaluation stage (its seeds from the power calculation) holding an arm no earlier pick
covers: the P1 and P2 arms, AdamW on float32 masters, the 4H schedule; every other stage × arm (the pilot, the
ladder, the tuning runs: the same arms at other lrs, seeds and formats) runs with `make test-slow`."""

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
PLAN = REPO / "conf" / "study" / "ongrid.yaml"
NOT_REPEATED = ("data.dir=", "+resume_sweep=", "resume_sweep=", "hydra.")


def first_record_of_each_arm() -> dict[tuple[str, str], Path]:
    """The first completed record of each arm in each stage, as the study committed them: {(stage, arm): record},
    the arm as each run's summary names it (the pilot's fp32 runs carry the ladder's first rung, `stage_w`)."""
    picked: dict[tuple[str, str], Path] = {}
    if not RECORDS.is_dir():
        return picked
    for stage in sorted(p for p in RECORDS.iterdir() if p.is_dir()):
        for job in sorted(stage.iterdir()):
            try:
                summary = json.loads((job / "summary.json").read_text())
            except (OSError, ValueError):
                continue
            if summary.get("status") == "completed":
                picked.setdefault((stage.name, summary.get("arm") or ""), job)
    return picked


def evaluation_stages() -> list[str]:
    """The plan's evaluation stages in plan order: the sweeps whose seeds come from the power calculation."""
    return [stage["name"] for stage in yaml.safe_load(PLAN.read_text())["stages"]
            if stage["kind"] == "sweep" and stage.get("seeds") == "power"]


def reruns() -> list:
    """In the default suite, one record of each evaluation stage with an arm no earlier pick has (a stage whose arms
    are all covered adds none); every other (stage, arm) runs as slow."""
    records = first_record_of_each_arm()
    default: set[tuple[str, str]] = set()
    covered: set[str] = set()
    for stage in evaluation_stages():
        arm = next((a for st, a in records if st == stage and a not in covered), None)
        if arm is not None:
            default.add((stage, arm))
            covered.add(arm)
    return [pytest.param(record, id=f"{key[0]}/{record.name}", marks=[] if key in default else [pytest.mark.slow])
            for key, record in records.items()]


def first_logged_loss(metrics: Path) -> tuple[int, str]:
    with open(metrics, newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("train/loss"):
                return int(row["step"]), row["train/loss"]
    raise AssertionError(f"{metrics} logs no train/loss")


@pytest.mark.parametrize("record", reruns())
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
    assert again["initial_val_loss"] == summary["initial_val_loss"]  # a resumed record keeps its run's step-0 loss
    if summary.get("resumed_at_step") is None:  # a resumed record's fingerprint is of the weights it resumed from
        assert again["fingerprint"]["init_params"] == summary["fingerprint"]["init_params"]
    assert first_logged_loss(run / "metrics.csv") == (step, loss)

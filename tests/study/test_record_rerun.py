"""One code state per study: a committed record of study 2, rerun from its own overrides for its first logged
steps on this code, gives the same numbers bit for bit (initial weights, data order, the step-0 validation loss and
the logged training loss; the initial weights' fingerprint only where the record was not resumed: a resumed run
records the weights it resumed from). The losses are compared on the CPU kind the records were computed on
(docs/results/study-ongrid/machine.json); on another kind torch runs other matrix kernels, and the test checks the data
and the initial weights and skips with both pairs of losses named.
Needs the eurlex-en files (--eurlex DIR); the records were computed with one thread, and so is the rerun. The default
suite reruns two records (DEFAULT: between them ManifoldAdamW with stochastic storage on the grid under the 4H
schedule, and AdamW on float32 masters; ≈ 30 s each); every other stage × arm (the P1 and P2 arms at H, the pilot,
the ladder, the tuning runs) runs with `make test-slow`."""

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
MACHINE = REPO / "docs" / "results" / "study-ongrid" / "machine.json"  # the CPU kind the records were computed on
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


# (stage, arm) pairs the default suite reruns: the on-grid manifold step with stochastic storage at the 4H schedule,
# and the float32-master path; the other arms share their storage and schedule code and rerun with `make test-slow`.
DEFAULT = (("h4", "manifold_sr"), ("eval_why", "adamw_fm"))


def reruns() -> list:
    """Every committed (stage, arm)'s first record; those outside DEFAULT run as slow."""
    return [pytest.param(record, id=f"{key[0]}/{record.name}", marks=[] if key in DEFAULT else [pytest.mark.slow])
            for key, record in first_record_of_each_arm().items()]


def test_the_default_reruns_name_committed_records() -> None:
    """A renamed stage or arm would leave the default suite rerunning nothing."""
    records = first_record_of_each_arm()
    if records:
        assert set(DEFAULT) <= set(records), sorted(set(DEFAULT) - set(records))


def cpu_model() -> str:
    """This machine's CPU as /proc/cpuinfo names it ('' where it does not)."""
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return ""


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
    if summary.get("resumed_at_step") is None:  # a resumed record's fingerprint is of the weights it resumed from
        assert again["fingerprint"]["init_params"] == summary["fingerprint"]["init_params"]
    recorded_on, here = json.loads(MACHINE.read_text())["cpu_model"], cpu_model()
    if here != recorded_on:
        # another CPU kind runs other matrix kernels (oneDNN/MKL choose by CPU): the data and the initial weights above
        # hold anywhere, the losses (step 0's forward too) only where the records were computed
        pytest.skip(f"data and initial weights matched; the losses rerun bit for bit on the records' CPU "
                    f"({recorded_on}, {MACHINE.name}) only, and this is {here or 'an unnamed CPU'} (here: step-0 "
                    f"{again['initial_val_loss']}, step {step} {first_logged_loss(run / 'metrics.csv')[1]}; "
                    f"recorded {summary['initial_val_loss']}, {loss})")
    assert again["initial_val_loss"] == summary["initial_val_loss"]  # a resumed record keeps its run's step-0 loss
    assert first_logged_loss(run / "metrics.csv") == (step, loss)

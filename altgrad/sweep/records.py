"""A study's raw records: each job's small result files copied out of its multirun dir, so that a study's report
regenerates from the repository alone and nothing computed is lost when a long study stops.

A job's record is its ``summary.json``, ``metrics.csv``, ``layer_map.json`` and ``.hydra/overrides.yaml`` (what
``altgrad.report`` loads); checkpoints, logs and W&B folders stay behind. ``CopyRecords`` is a Hydra callback that
copies each job as it ends (``+hydra.callbacks.records._target_=altgrad.sweep.records.CopyRecords
+hydra.callbacks.records.dest=DIR``); ``collect`` copies a whole sweep folder (what a finished stage gets again).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from altgrad.atomic import copy_file

RECORD_FILES = ("summary.json", "metrics.csv", "layer_map.json", ".hydra/overrides.yaml")
"""The files of a job's record, relative to its job dir."""


def _same(a: Path, b: Path) -> bool:
    return b.is_file() and a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes()


def _copy_atomic(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    copy_file(src, dst, mode=0o644)  # committed records stay readable to others whatever the umask


def job_status(job_dir: Path) -> str | None:
    """The status a job's summary.json records (None: no readable summary yet)."""
    try:
        summary = json.loads((job_dir / "summary.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return summary.get("status") if isinstance(summary, dict) else None


def copy_job(job_dir: Path, dest: Path) -> int:
    """Copy a job's record files that exist and differ from the copies in ``dest``; return how many were copied.

    A job without a readable summary.json (still running, or killed before it wrote one) is not copied: a record
    always holds the summary its other files belong to. summary.json is copied last, so a record never holds a
    summary newer than its curve.
    """
    job_dir, dest = Path(job_dir), Path(dest)
    if job_status(job_dir) is None:
        return 0
    copied = 0
    for name in (*RECORD_FILES[1:], RECORD_FILES[0]):
        src = job_dir / name
        if src.is_file() and not _same(src, dest / name):
            _copy_atomic(src, dest / name)
            copied += 1
    return copied


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The job dirs directly below a sweep folder (those holding .hydra/overrides.yaml or summary.json)."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        return []
    return sorted(p for p in sweep_dir.iterdir()
                  if p.is_dir() and ((p / ".hydra" / "overrides.yaml").is_file() or (p / "summary.json").is_file()))


def collect(sweep_dir: Path, dest: Path) -> int:
    """Copy the record of every job of a sweep folder into ``dest/<job dir name>``; return the files copied."""
    return sum(copy_job(job, Path(dest) / job.name) for job in job_dirs(sweep_dir))


try:  # Hydra is a dependency of the package; the callback base only exists in Hydra ≥ 1.1
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover
    _HydraCallback = object  # type: ignore[assignment,misc]


class CopyRecords(_HydraCallback):  # type: ignore[misc,valid-type]
    """Hydra callback: when a job ends (finished, failed or skipped by +resume_sweep), copy its record into
    ``dest/<job dir name>``."""

    def __init__(self, dest: str) -> None:
        self.dest = Path(dest)

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        out = Path(str(config.hydra.runtime.output_dir))
        try:
            copy_job(out, self.dest / out.name)
        except OSError as err:  # a record that cannot be copied now is copied by the stage's collect
            print(f"warning: records: {out} not copied to {self.dest}: {err}", flush=True)

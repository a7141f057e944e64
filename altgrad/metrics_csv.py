"""metrics.csv across an in-place resume: the resumed run appends to the rows its checkpoint had seen.

Lightning's CSV writer deletes an existing metrics.csv when it starts; a run that resumes in its own folder would lose
every row before the resume step (the step-0 validation loss included). An interrupted run stopped right after its
checkpoint's step, so all its rows are kept; a killed one may have logged past its checkpoint, so its file is trimmed
to the rows of steps up to the checkpoint's (those after it are logged again by the resumed run).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from altgrad.atomic import write_with

METRICS = "metrics.csv"


def count_rows(path: Path) -> int:
    """Data rows of a CSV file (0 when it does not exist)."""
    if not path.is_file():
        return 0
    with path.open(newline="") as f:
        return max(sum(1 for _ in csv.reader(f)) - 1, 0)


def flush_and_count(loggers: list[Any], run_dir: Path) -> int | None:
    """Write the buffered rows of the CSV logger of run_dir and count metrics.csv's rows (None: no such logger)."""
    for logger in loggers:
        if isinstance(logger, CSVLogger) and Path(logger.log_dir).resolve() == run_dir.resolve():
            logger.save()
            return count_rows(Path(logger.log_dir) / METRICS)
    return None


class AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer, but an existing metrics.csv is kept, trimmed to the rows before the checkpoint."""

    def __init__(self, log_dir: str, keep_rows: int | None, before_step: int | None) -> None:
        self._keep_rows, self._before_step = keep_rows, before_step
        super().__init__(log_dir)

    # Overrides a private hook of Lightning's ExperimentWriter (Lightning 2.6: the writer's __init__ calls it, and
    # Lightning's version deletes metrics.csv); check that it still exists and is called when Lightning is upgraded.
    def _check_log_dir_exists(self) -> None:
        path = Path(self.metrics_file_path)
        if not path.is_file():
            return
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            header = list(reader.fieldnames or [])
            rows = list(reader)
        if self._before_step is not None:
            # Rows written before the checkpoint, then Lightning's rows of its own step (logged just after it, under
            # step - 1); the instruments' rows carry the optimizer step itself, so those after it are dropped.
            head = rows[: self._keep_rows or 0]
            rows = head + [r for r in rows[len(head):] if _step(r) < self._before_step]
        def write(tmp: Path) -> None:
            with tmp.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=header)
                writer.writeheader()
                writer.writerows(rows)

        write_with(path, write)  # a kill here leaves the old rows or the trimmed ones, never half a file
        self.metrics_keys = header


def _step(row: dict[str, str]) -> float:
    try:
        return float(row.get("step") or 0)
    except ValueError:
        return 0.0


def append_on_resume(loggers: list[Any], run_dir: Path, keep_rows: int | None, before_step: int | None) -> None:
    """Make the CSV logger of run_dir append to its metrics.csv instead of starting it over: all its rows
    (before_step None), or its first `keep_rows` and later ones logged under a step before `before_step`."""
    for logger in loggers:
        if isinstance(logger, CSVLogger) and Path(logger.log_dir).resolve() == run_dir.resolve():
            os.makedirs(logger.root_dir, exist_ok=True)
            logger._experiment = AppendingWriter(logger.log_dir, keep_rows, before_step)

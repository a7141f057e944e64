"""Read a sweep folder: every job dir's summary.json, metrics.csv, layer_map.json and .hydra/overrides.yaml.

A job dir is any folder holding summary.json, metrics.csv or .hydra/overrides.yaml (Hydra multirun jobs, single
runs, or job dirs nested deeper). Nothing here raises on a broken job: it is loaded with ``state`` saying what is
wrong, so the report can list it.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from altgrad.report.order import recorded_format_label

STATES = ("completed", "diverged", "failed", "interrupted", "missing", "corrupt")
"""completed/diverged/failed/interrupted come from summary.json (interrupted: stopped by a signal, resumable; not a
result yet); missing = no summary.json; corrupt = unreadable summary."""

_SKIP_DIRS = {".hydra", ".submitit", "wandb", "checkpoints", "lightning_logs", "__pycache__"}


@dataclass(frozen=True)
class Job:
    """One job of a sweep, as found on disk."""

    path: Path
    name: str
    state: str
    summary: dict[str, Any] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()
    curve: tuple[tuple[int, float], ...] = ()
    layer_map: Any = None
    problem: str | None = None

    def get(self, key: str) -> Any:
        """A summary field, falling back to the Hydra override of the same name (for jobs without a summary)."""
        value = self.summary.get(key)
        if value is None:
            value = _override_values(self.overrides).get(key)
        return value

    @property
    def format(self) -> str:
        """The format option's label as the run recorded it (bf16_ref, not bf16, for the wide reference)."""
        return str(recorded_format_label(self.get("format"), self.config.get("format")) or "?")

    @property
    def optimizer(self) -> str:
        return str(self.get("optimizer") or "?")

    @property
    def optimizer_label(self) -> str:
        return str(self.summary.get("optimizer_label") or self.optimizer)

    @property
    def arm(self) -> str:
        """The study arm the run recorded (``+arm=NAME``, conf/arm/), else its optimizer label: what an arm-labelled
        study (endpoint ``label: arm``) names and compares it by."""
        return str(self.summary.get("arm") or _override_values(self.overrides).get("arm") or self.optimizer_label)

    @property
    def master(self) -> str:
        return str(self.summary.get("master") or _override_values(self.overrides).get("quant.master") or "fp32")

    @property
    def storage(self) -> str:
        """``fp32 master`` or ``on-grid <rounding>`` (weights stored on the format's grid)."""
        if self.master == "none":
            rounding = self.summary.get("storage_rounding") or _override_values(self.overrides).get(
                "quant.storage_rounding") or "nearest"
            return f"on-grid {rounding}"
        return f"{self.master} master"

    @property
    def seed(self) -> int | None:
        value = self.get("seed")
        try:
            return int(value)
        except (TypeError, ValueError):
            return None

    @property
    def lr(self) -> float | None:
        value = self.get("lr")
        if value is None:
            value = _override_values(self.overrides).get("optimizer.lr")
        return as_float(value)

    @property
    def final_loss(self) -> float | None:
        """Final validation loss of a completed run; None for diverged/failed runs (not comparable)."""
        return as_float(self.summary.get("final_val_loss")) if self.state == "completed" else None

    @property
    def best_loss(self) -> float | None:
        return as_float(self.summary.get("best_val_loss")) if self.state == "completed" else None

    @property
    def diagnostics(self) -> dict[str, float]:
        diag = self.summary.get("diagnostics")
        if not isinstance(diag, dict):
            return {}
        return {str(k): v for k, v in ((k, as_float(v)) for k, v in diag.items()) if v is not None}

    @property
    def config(self) -> dict[str, Any]:
        cfg = self.summary.get("config")
        return cfg if isinstance(cfg, dict) else {}


@dataclass(frozen=True)
class Sweep:
    """All jobs found under one or more sweep folders."""

    roots: tuple[Path, ...]
    jobs: tuple[Job, ...]

    def by_state(self, *states: str) -> list[Job]:
        return [j for j in self.jobs if j.state in states]


def as_float(value: Any) -> float | None:
    """A finite float, or None for null / NaN / ±Inf / non-numbers."""
    if isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def find_job_dirs(root: Path) -> list[Path]:
    """Job dirs under root (root itself when it is a single run), in sorted order; never descends into a job."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if "summary.json" in filenames or "metrics.csv" in filenames or (here / ".hydra" / "overrides.yaml").is_file():
            found.append(here)
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
    return sorted(found, key=lambda p: _natural_key(p.relative_to(root).parts))


def load_job(path: Path, name: str) -> Job:
    """Load one job dir; the state says whether its summary was usable."""
    overrides = _read_overrides(path / ".hydra" / "overrides.yaml")
    curve = tuple(read_curve(_metrics_file(path), "val/loss"))
    layer_map = _read_json(path / "layer_map.json")[0]
    summary_path = path / "summary.json"
    if not summary_path.is_file():
        return Job(path, name, "missing", overrides=overrides, curve=curve, layer_map=layer_map,
                   problem="no summary.json (the job crashed hard, was killed, or is still running)")
    summary, error = _read_json(summary_path)
    if error is not None or not isinstance(summary, dict):
        why = error or f"summary.json holds {type(summary).__name__}, not an object"
        return Job(path, name, "corrupt", overrides=overrides, curve=curve, layer_map=layer_map,
                   problem=f"unreadable summary.json: {why}")
    status = summary.get("status")
    if status not in ("completed", "diverged", "failed", "interrupted"):
        return Job(path, name, "corrupt", summary=summary, overrides=overrides, curve=curve, layer_map=layer_map,
                   problem=f"summary.json status {status!r} is not one of completed, diverged, failed, interrupted")
    problem = None
    if status == "failed":
        problem = str(summary.get("error") or "failed without an error message")
    elif status == "diverged":
        problem = str(summary.get("divergence_cause") or "diverged (no cause recorded)")
    elif status == "interrupted":
        problem = f"interrupted at step {summary.get('steps')} (resume the sweep to finish it)"
    return Job(path, name, status, summary, overrides, curve, layer_map, problem)


def load_sweeps(roots: Sequence[str | os.PathLike[str]]) -> Sweep:
    """Load every job under the given sweep folders. Raises ValueError for a missing folder or one with no jobs."""
    paths = tuple({Path(r).resolve(): Path(r) for r in roots}.values())  # the same folder twice counts once
    if not paths:
        raise ValueError("no sweep folder given; pass a Hydra multirun folder such as multirun/DATE/TIME")
    for root in paths:
        if not root.is_dir():
            raise ValueError(f"sweep folder {str(root)!r} does not exist or is not a folder; pass a Hydra "
                             "multirun folder (multirun/DATE/TIME) or a single run folder")
    jobs: list[Job] = []
    for root, prefix in zip(paths, _distinct_prefixes(paths)):
        dirs = find_job_dirs(root)
        if not dirs:
            raise ValueError(f"no jobs in {str(root)!r}: no folder below it holds summary.json, metrics.csv or "
                             ".hydra/overrides.yaml")
        for d in dirs:
            rel = d.relative_to(root).as_posix()
            jobs.append(load_job(d, prefix + (rel if rel != "." else root.name)))
    return Sweep(paths, tuple(jobs))


def _distinct_prefixes(paths: Sequence[Path]) -> list[str]:
    """Job-name prefixes that tell several sweeps apart: the shortest distinct path tails (none for one sweep)."""
    if len(paths) < 2:
        return [""] * len(paths)
    parts = [p.resolve().parts for p in paths]
    k = 1
    while len({p[-k:] for p in parts}) < len(parts):  # ends: resolved paths of distinct folders differ
        k += 1
    return ["/".join(p[-k:]) + "/" for p in parts]


def read_curve(path: Path | None, metric: str) -> list[tuple[int, float]]:
    """(step, value) pairs of one metric from a Lightning CSVLogger metrics.csv; [] when absent or unreadable."""
    if path is None:
        return []
    points = []
    try:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None or metric not in reader.fieldnames or "step" not in reader.fieldnames:
                return []
            for row in reader:
                value, step = as_float(row.get(metric)), as_float(row.get("step"))
                if value is not None and step is not None:
                    points.append((int(step), value))
    except (OSError, csv.Error, UnicodeDecodeError):
        return []
    return points


def _metrics_file(path: Path) -> Path | None:
    """metrics.csv in the job dir, else the first one a CSVLogger version folder below it holds."""
    direct = path / "metrics.csv"
    if direct.is_file():
        return direct
    nested = sorted(path.glob("**/metrics.csv"))
    return nested[0] if nested else None


def _read_json(path: Path) -> tuple[Any, str | None]:
    if not path.is_file():
        return None, None
    try:
        return json.loads(path.read_text()), None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def _read_overrides(path: Path) -> tuple[str, ...]:
    if not path.is_file():
        return ()
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return ()
    return tuple(str(x) for x in data) if isinstance(data, list) else ()


def _override_values(overrides: Iterable[str]) -> dict[str, str]:
    """``key=value`` overrides as a dict (``+``/``++``/``~`` prefixes dropped)."""
    out = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep:
            out[key.lstrip("+~")] = value
    return out


def _natural_key(parts: Sequence[str]) -> list[tuple[int, int | str]]:
    """Sort job dirs 0, 1, 2, …, 10 rather than 0, 1, 10, 2."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in parts]

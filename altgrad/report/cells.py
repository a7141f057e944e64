"""Group jobs into cells (same configuration, different seeds) and order them the way the report reads."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from altgrad.report.load import Job
from altgrad.report.order import FORMAT_ORDER, OPTIMIZER_ORDER, STAGE_ORDER, STORAGE_ORDER, rank
from altgrad.report.stages import stage_of
from altgrad.report.stats import Summary, summarize

CONTEXT_FIELDS = ("experiment", "model", "data", "layer_map", "format", "storage", "stage")
"""What must match for two cells to be compared (everything but optimizer and learning rate)."""
CELL_FIELDS = CONTEXT_FIELDS + ("optimizer_label", "lr")
SHOWN_ALWAYS = ("format", "optimizer_label", "storage")

BASELINE_OPTIMIZER = "adamw"


def job_field(job: Job, name: str) -> Any:
    """The value of one cell field for a job."""
    if name == "stage":
        return stage_of(job)
    if name in ("format", "optimizer_label", "storage", "lr"):
        return getattr(job, name)
    value = job.get(name)
    return None if value is None else str(value)


@dataclass(frozen=True)
class Cell:
    """Jobs sharing every CELL_FIELDS value; losses are per seed (duplicates of a seed averaged)."""

    key: tuple[tuple[str, Any], ...]
    jobs: tuple[Job, ...]

    def __getitem__(self, name: str) -> Any:
        return dict(self.key)[name]

    @property
    def context(self) -> tuple[tuple[str, Any], ...]:
        return tuple((k, v) for k, v in self.key if k in CONTEXT_FIELDS)

    @property
    def is_baseline(self) -> bool:
        return any(j.optimizer == BASELINE_OPTIMIZER for j in self.jobs)

    def count(self, *states: str) -> int:
        return sum(j.state in states for j in self.jobs)

    def losses_by_seed(self, which: str = "final") -> dict[int, float]:
        per_seed: dict[int, list[float]] = {}
        for job in self.jobs:
            loss = job.final_loss if which == "final" else job.best_loss
            if loss is not None and job.seed is not None:
                per_seed.setdefault(job.seed, []).append(loss)
        return {s: sum(v) / len(v) for s, v in per_seed.items()}

    def loss_summary(self, which: str = "final") -> Summary:
        return summarize(list(self.losses_by_seed(which).values()))

    def diagnostic_summary(self, name: str) -> Summary:
        return summarize([j.diagnostics[name] for j in self.jobs if name in j.diagnostics])


def group_cells(jobs: Iterable[Job]) -> list[Cell]:
    """Cells of the jobs that have a summary (completed, diverged, failed), sorted by report order."""
    groups: dict[tuple[tuple[str, Any], ...], list[Job]] = {}
    for job in jobs:
        if job.state in ("completed", "diverged", "failed"):
            key = tuple((f, job_field(job, f)) for f in CELL_FIELDS)
            groups.setdefault(key, []).append(job)
    cells = [Cell(k, tuple(v)) for k, v in groups.items()]
    return sorted(cells, key=lambda c: sort_key(dict(c.key)))


def varying_fields(cells: Sequence[Cell], fields: Sequence[str] = CELL_FIELDS) -> list[str]:
    """The fields a table must show: the always-shown ones plus any that take more than one value."""
    return [f for f in fields if f in SHOWN_ALWAYS or len({c[f] for c in cells}) > 1]


def sort_key(values: dict[str, Any]) -> tuple:
    """Report order: canonical formats, optimizers, storages and stages first, then by name; lr ascending."""
    return (
        tuple(str(values.get(f) or "") for f in ("experiment", "model", "data", "layer_map")),
        rank(FORMAT_ORDER, values.get("format")),
        rank(STORAGE_ORDER, values.get("storage")),
        rank(STAGE_ORDER, values.get("stage")),
        rank(OPTIMIZER_ORDER, values.get("optimizer_label")),
        values.get("lr") if values.get("lr") is not None else float("inf"),
    )


def describe(values: dict[str, Any], fields: Sequence[str]) -> str:
    """A short label such as ``manifold[update], on-grid nearest, lr=0.003`` for the given fields."""
    parts = []
    for f in fields:
        v = values.get(f)
        if v is None:
            continue
        parts.append(f"lr={v:g}" if f == "lr" else (f"{f}={v}" if f in ("experiment", "model", "data") else str(v)))
    return ", ".join(parts)

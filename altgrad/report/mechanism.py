"""Mechanism evidence per configuration: update sizes in ULPs (from the runs' ``updates`` diagnostics) and how fast
each run reaches a common quality target (steps until its validation loss is within 5 % of fp32's final loss).

Speed and final quality are different questions: two arms may end at the same loss while one of them got there in
half the steps. The target is the mean final loss of AdamW in fp32 (or, when no fp32 run exists, in the first wide
reference format run) in the same experiment, model and data, times ``factor``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from altgrad.report.cells import BASELINE_OPTIMIZER, Cell
from altgrad.report.order import REFERENCE_FORMATS
from altgrad.report.stats import summarize

UPDATE_KEYS = ("ulp_update_q10", "ulp_update_q50", "ulp_update_q90", "sub_half_ulp_share")
"""Run-level aggregates the UpdateCallback writes into summary.json["diagnostics"]."""
DECILE_PREFIX = "rel_update_d"
"""rel_update_d1 … rel_update_d10: median |Δw|/|w| in each |w| decile (1 = smallest weights)."""
TARGET_FACTOR = 1.05


@dataclass(frozen=True)
class Target:
    """The quality target: factor × the reference arm's mean final loss."""

    value: float
    reference: str
    factor: float


def _group(cell: Cell) -> tuple:
    return tuple(cell[f] for f in ("experiment", "model", "data"))


def targets(cells: Sequence[Cell], factor: float = TARGET_FACTOR) -> dict[tuple, Target]:
    """Per (experiment, model, data): the target from fp32 AdamW, else the first reference format's AdamW."""
    out: dict[tuple, Target] = {}
    for fmt in REFERENCE_FORMATS:
        for cell in cells:
            key = _group(cell)
            if key in out or cell["format"] != fmt or not cell.is_baseline or cell["storage"] != "fp32 master":
                continue
            mean = cell.loss_summary().mean
            if mean is not None:
                out[key] = Target(factor * mean, f"{fmt} {BASELINE_OPTIMIZER}", factor)
    return out


def first_step_at(curve: Sequence[tuple[int, float]], target: float) -> int | None:
    """The first logged step whose validation loss is at or below target; None if never."""
    return next((step for step, value in curve if value <= target), None)


@dataclass(frozen=True)
class Speed:
    """Steps to the target over a cell's runs: median over the runs that reached it, and how many did."""

    target: Target
    median_steps: float | None
    reached: int
    runs: int


def speeds(cells: Sequence[Cell], factor: float = TARGET_FACTOR) -> dict[tuple, Speed]:
    """Per cell key: steps to reach the target of its group (runs without a validation curve are not counted)."""
    goal = targets(cells, factor)
    out = {}
    for cell in cells:
        target = goal.get(_group(cell))
        if target is None:
            continue
        curves = [j.curve for j in cell.jobs if j.curve]
        hits = [s for s in (first_step_at(c, target.value) for c in curves) if s is not None]
        out[cell.key] = Speed(target, statistics.median(hits) if hits else None, len(hits), len(curves))
    return out


def decile_ratio(cell: Cell) -> float | None:
    """Mean over runs of median |Δw|/|w| in the top |w| decile ÷ the bottom one: 1 for a step ∝ |w| (relative or
    ULP-aware within a binade), ≪ 1 for a step that ignores |w| (Adam's)."""
    top, bottom = cell.diagnostic_summary(f"{DECILE_PREFIX}10").mean, cell.diagnostic_summary(f"{DECILE_PREFIX}1").mean
    if top is None or bottom is None or bottom == 0:
        return None
    return top / bottom


def has_updates(cells: Sequence[Cell]) -> bool:
    return any(k in j.diagnostics for c in cells for j in c.jobs for k in UPDATE_KEYS)


def update_summary(cell: Cell, key: str) -> float | None:
    return summarize([j.diagnostics[key] for j in cell.jobs if key in j.diagnostics]).mean

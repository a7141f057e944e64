"""The ULP-aware benefit: Δ final validation loss of each optimizer against AdamW, paired by seed.

Comparisons are made within one context (same experiment, model, data, layer map, format, weight storage and
failure stage). When a context ran an optimizer at several learning rates (an lr scan), the lr with the lowest mean
final loss (among those with the most seeds) stands for it, on each side; the table says so. When a storage has no
AdamW run (e.g. grid-only on-grid storage), the fp32-master AdamW of the same format is the baseline, and the table
says that too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from altgrad.report.cells import Cell, sort_key
from altgrad.report.stats import PairedDifference, paired_difference


@dataclass(frozen=True)
class Benefit:
    """treatment − AdamW for one (context, optimizer_label)."""

    treatment: Cell
    baseline: Cell
    diff: PairedDifference
    treatment_lrs: int
    baseline_lrs: int
    baseline_fallback: bool

    @property
    def improves(self) -> bool:
        """Significantly lower loss than AdamW (95% CI entirely below zero)."""
        return self.diff.significant and (self.diff.diff.mean or 0.0) < 0

    @property
    def worsens(self) -> bool:
        return self.diff.significant and (self.diff.diff.mean or 0.0) > 0


def best_lr_cell(cells: Sequence[Cell]) -> Cell:
    """The cell (one per lr) with the lowest mean final loss among those with the most seeds (a mean over one seed
    is not set against a mean over five); cells without any loss rank last."""
    def key(c: Cell) -> tuple[int, int, float, float]:
        s = c.loss_summary()
        return (s.mean is None, -s.n, s.mean if s.mean is not None else 0.0, c["lr"] if c["lr"] is not None else 0.0)

    return min(cells, key=key)


def ulp_benefits(cells: Sequence[Cell]) -> list[Benefit]:
    """One Benefit per non-AdamW optimizer_label per context that has an AdamW baseline."""
    by_context: dict[tuple, dict[str, list[Cell]]] = {}
    for cell in cells:
        by_context.setdefault(cell.context, {}).setdefault(cell["optimizer_label"], []).append(cell)

    out = []
    for context, by_label in by_context.items():
        baselines = [c for cs in by_label.values() for c in cs if c.is_baseline]
        fallback = False
        if not baselines and dict(context).get("storage") != "fp32 master":
            master = tuple((k, "fp32 master" if k == "storage" else v) for k, v in context)
            baselines = [c for cs in by_context.get(master, {}).values() for c in cs if c.is_baseline]
            fallback = bool(baselines)
        if not baselines:
            continue
        baseline = best_lr_cell(baselines)
        for label_cells in by_label.values():
            if any(c.is_baseline for c in label_cells):
                continue
            treatment = best_lr_cell(label_cells)
            diff = paired_difference(treatment.losses_by_seed(), baseline.losses_by_seed())
            out.append(Benefit(treatment, baseline, diff, len(label_cells), len(baselines), fallback))
    return sorted(out, key=lambda b: sort_key(dict(b.treatment.key)))


@dataclass(frozen=True)
class StabilityThreshold:
    """Over an lr scan: the largest lr at which no seed diverged, and the smallest at which one did."""

    context_cell: Cell
    lrs: tuple[float, ...]
    largest_stable: float | None
    smallest_diverged: float | None


def stability_thresholds(cells: Sequence[Cell]) -> list[StabilityThreshold]:
    """Per (context, optimizer_label) that ran more than one learning rate."""
    groups: dict[tuple, list[Cell]] = {}
    for cell in cells:
        if cell["lr"] is not None:
            groups.setdefault((cell.context, cell["optimizer_label"]), []).append(cell)
    out = []
    for group in groups.values():
        if len(group) < 2:
            continue
        group = sorted(group, key=lambda c: c["lr"])
        stable = [c["lr"] for c in group if c.count("diverged") == 0 and c.count("completed") > 0]
        diverged = [c["lr"] for c in group if c.count("diverged") > 0]
        out.append(StabilityThreshold(group[0], tuple(c["lr"] for c in group),
                                      max(stable) if stable else None, min(diverged) if diverged else None))
    return sorted(out, key=lambda s: sort_key(dict(s.context_cell.key)))

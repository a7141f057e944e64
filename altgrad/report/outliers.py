"""Runs far above the rest of their cell (a seed that stalls on a plateau while its cell's other seeds learn), and
what each paired comparison says without them: an undeclared, descriptive look beside the declared analysis.

A t-test of a mean Δ over a handful of seeds is ruled by one stalled run: its paired SD, and so its interval and the
seeds an equivalence test needs, are the stall's. This look names such runs by a fixed rule and repeats each paired
comparison without the seeds that hold one, so a reader sees whether a Δ is the stall or the bulk of the seeds.

A run is *outlying* when its endpoint value exceeds its cell's median by more than the declared tie margin and its
modified z-score 0.6745 · (x − median) / MAD is above 3.5 (Iglewicz & Hoaglin 1993; MAD: the median absolute
deviation from the median). Both parts matter: the z-score scales with the cell's own spread (a failing cell spread
over a nat flags nothing), the margin keeps a cell that agrees to 0.005 nats from flagging a 0.02-nat seed. Only
runs above the median are flagged: a seed that learns faster than its cell is not a stall. Cells with fewer than
three seeds flag nothing. None of this is tested or corrected: the declared families above are what to quote.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from altgrad.report.caveats import loss_at
from altgrad.report.endpoint import Contrast
from altgrad.report.ladder import cell_values, ladder, recovery
from altgrad.report.load import Job
from altgrad.report.stats import TTest, t_test
from altgrad.report.study import StudyResult

Z_LIMIT = 3.5
MAD_TO_Z = 0.6745      # the normal's MAD over its SD: makes the modified z-score comparable to a z-score


@dataclass(frozen=True)
class CellSpread:
    """One cell's per-seed values, its median, and its outlying seeds."""

    format: str
    arm: str
    part: str                        # "evaluation" (a contrast's arm), "recovery" (the recovery reference, or a
                                     # recovery arm in no contrast) or "ladder" (a failure-stage rung)
    values: dict[int, float]
    median: float
    outlying: tuple[int, ...]
    midway: dict[int, float] = field(default_factory=dict)   # per seed: val loss at the last logged step ≤ H/2
    midway_step: int | None = None                          # that step (≤ H/2), None without a horizon


@dataclass(frozen=True)
class Trimmed:
    """One paired comparison repeated without the seeds that hold an outlying run in either of its cells."""

    name: str                        # as the tables name it: "P2: manifold_sr − adamw_sr", "stage_w − fp32 stage_w"
    format: str
    contrast: Contrast | None        # the declared contrast; None for a ladder rung
    full: TTest
    dropped: tuple[int, ...]
    kept: TTest


def outlying_seeds(values: Mapping[int, float], margin: float) -> tuple[int, ...]:
    """Seeds whose value is more than ``margin`` above the median and whose modified z-score exceeds ``Z_LIMIT``."""
    if len(values) < 3:
        return ()
    median = statistics.median(values.values())
    mad = statistics.median(abs(v - median) for v in values.values())
    out = []
    for seed, v in sorted(values.items()):
        if v - median <= margin:
            continue
        z = math.inf if mad == 0 else MAD_TO_Z * (v - median) / mad
        if z > Z_LIMIT:
            out.append(seed)
    return tuple(out)


def spreads(result: StudyResult) -> list[CellSpread]:
    """Every cell of the declaration with values: its contrasts' arms in the family's formats, the recovery cells no
    contrast names, then the ladder's reference and rungs."""
    ep = result.endpoint
    cells: list[tuple[str, str, str, dict[int, float], Sequence[Job]]] = [
        (fmt, label, "evaluation", dict(arm.values), arm.jobs) for (fmt, label), arm in result.arms.items()
        if fmt in result.formats]
    if ep.recovery is not None and ep.label == "arm":
        # the recovery reference (adamw_fm) is in no contrast: a stall there rules every recovery row of its format
        named = {(fmt, arm) for fmt, arm, *_ in cells}
        for fmt in result.formats:
            for arm in (ep.recovery.reference, *ep.recovery.arms):
                if (fmt, arm) not in named:
                    named.add((fmt, arm))
                    cells.append((fmt, arm, "recovery", cell_values(result, result.jobs, fmt, arm)[0],
                                  [j for j in result.jobs if j.format == fmt and j.arm == arm]))
    if ep.stages is not None and ep.label == "arm":
        jobs = (*result.jobs, *result.ladder_jobs)
        ref = ep.stages.reference_format, ep.stages.reference_arm
        for fmt, arm in (ref, *((f, a) for f in result.formats for a in ep.stages.arms)):
            cells.append((fmt, arm, "ladder", cell_values(result, jobs, fmt, arm)[0],
                          [j for j in jobs if j.format == fmt and j.arm == arm]))
    mid = ep.horizon // 2 if ep.horizon is not None else None
    every = [j for *_, members in cells for j in members]
    logged = [s for j in every for s, _ in j.curve if mid is not None and s <= mid]
    step = max(logged) if logged else None       # the validation step the runs logged at or before H/2
    return [CellSpread(fmt, arm, part, values, statistics.median(values.values()),
                       outlying_seeds(values, ep.tie_margin), _midway(members, step), step)
            for fmt, arm, part, values, members in cells if values]


def _midway(jobs: Sequence[Job], step: int | None) -> dict[int, float]:
    """Per seed, the validation loss at the last logged step ≤ ``step`` (seeds without one are left out)."""
    if step is None:
        return {}
    out = {}
    for job in jobs:
        v = loss_at(job.curve, step)
        if job.seed is not None and v is not None:
            out[job.seed] = v
    return out


def _trim(name: str, fmt: str, contrast: Contrast | None, deltas: Mapping[int, float], full: TTest,
          flagged: set[int]) -> Trimmed | None:
    """The comparison without the flagged seeds (its own variance), or None when it pairs none of them."""
    dropped = tuple(s for s in sorted(deltas) if s in flagged)
    if not dropped:
        return None
    return Trimmed(name, fmt, contrast, full, dropped, t_test([d for s, d in deltas.items() if s not in flagged]))


def trimmed(result: StudyResult, cells: Sequence[CellSpread]) -> list[Trimmed]:
    """Each declared contrast (primary, secondary, controls), recovery row and ladder rung that pairs a seed with an
    outlying run in either cell, with and without those seeds."""
    flagged = {(c.format, c.arm): set(c.outlying) for c in cells}
    out = []
    for c in (*result.comparisons, *result.secondary, *result.controls):
        if c.treatment is None or c.reference is None or not c.deltas:
            continue  # an interaction, or nothing paired
        seeds = flagged.get((c.format, c.treatment.label), set()) | flagged.get((c.format, c.reference.label), set())
        name = f"{c.contrast.label}: {c.contrast.name}" if c.contrast.label else c.contrast.name
        row = _trim(name, c.format, c.contrast, c.deltas, c.test, seeds)
        if row is not None:
            out.append(row)
    reference = result.endpoint.recovery.reference if result.endpoint.recovery is not None else None
    for rec in recovery(result):
        row = _trim(f"{rec.arm} − {reference}", rec.format, None, rec.deltas, rec.test,
                    flagged.get((rec.format, rec.arm), set()) | flagged.get((rec.format, reference), set()))
        if row is not None:
            out.append(row)
    lad = ladder(result)
    if lad is not None:
        ref = flagged.get((lad.reference_format, lad.reference_arm), set())
        for rung in lad.rungs:
            row = _trim(f"{rung.arm} − {lad.reference_format} {lad.reference_arm}", rung.format, None,
                        rung.deltas, rung.vs_reference, ref | flagged.get((rung.format, rung.arm), set()))
            if row is not None:
                out.append(row)
    return out


def delta_text(t: TTest, confidence: float) -> str:
    """``+0.0123 [-0.0100, +0.0346]``: a mean Δ with its CI (the mean alone without one, ``—`` without a mean)."""
    ci = t.ci(confidence)
    if t.mean is None:
        return "—"
    return f"{t.mean:+.4f}" + ("" if ci is None else f" [{ci[0]:+.4f}, {ci[1]:+.4f}]")


def finding_lines(result: StudyResult) -> list[str]:
    """The Findings' lines: how many runs are outlying, per arm, and the primary contrast without them."""
    ep = result.endpoint
    cells = spreads(result)
    if not any(len(c.values) >= 3 for c in cells):
        return []
    confidence = 1.0 - ep.alpha
    total = sum(len(c.values) for c in cells)
    flagged = sum(len(c.outlying) for c in cells)
    head = (f"Outlying runs (undeclared and descriptive, outside the families and their correction; a run more than "
            f"the tie margin above its cell's median with a modified z-score above {Z_LIMIT:g}): ")
    if not flagged:
        return [head + f"none among {total} runs in {len(cells)} cells."]
    by_arm: dict[str, list[int]] = {}
    for c in cells:
        count = by_arm.setdefault(c.arm, [0, 0])
        count[0] += len(c.outlying)
        count[1] += len(c.values)
    tally = ", ".join(f"{arm} {k} of {n}" for arm, (k, n) in by_arm.items())
    lines = [head + f"{flagged} of {total} runs; per arm over its formats: {tally} (table: Outlying runs)."]
    primary = [r for r in trimmed(result, cells) if r.contrast == ep.primary_contrast]
    if primary:
        moved = "; ".join(f"{r.format} {delta_text(r.kept, confidence)} over {r.kept.n} pairs (all {r.full.n}: "
                          f"{delta_text(r.full, confidence)})" for r in primary)
        lines.append(f"Without the seeds that hold an outlying run, the primary contrast "
                     f"{ep.primary_contrast.name} (Δ, {100 * confidence:g}% CI, uncorrected; descriptive): {moved}.")
    return lines

"""A study's records beside its declared tests: the horizon (the same contrasts at H and at a longer horizon, and
the pilot's loss at H against 4H), the tuning (lr–loss per format × arm, the pick and whether the scan brackets it),
the power record (``power.json``), and whether the mechanism is active (per arm and format, the share of updates
below half a ULP, the median update in ULPs, stalls and flips). All descriptive except where a declared test is
quoted; nothing here enters a family or its correction.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from altgrad.report import stats
from altgrad.report.load import Job
from altgrad.report.order import FORMAT_ORDER, rank
from altgrad.report.study import Comparison, StudyResult

PILOT = "pilot"
TUNE = "tune"
"""Experiments whose name holds these words are a study's pilot and tuning runs (ongrid_pilot, ongrid_tune_ref)."""
HORIZON_FACTOR = 4
STALL_SHARE = 0.5
"""A stall story (updates lost to round-to-nearest) is told only where the nearest-storage arms' median share of
updates below ½ ULP is at least this."""
MECHANISM_KEYS = (("sub_half_ulp_share", "share < ½ ULP"), ("ulp_update_q50", "median |Δw|/ULP"),
                  ("mean_stall_ratio", "stall ratio"), ("final_flip_rate", "flip rate"))


def _experiment(job: Job) -> str:
    return str(job.get("experiment") or "")


def _median(values: Sequence[float]) -> float | None:
    xs = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return statistics.median(xs) if xs else None


# --- horizon -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HorizonPair:
    """One contrast in one format at the shorter horizon and at the longer one."""

    label: str
    format: str
    short: Comparison
    long: Comparison
    h_short: int
    h_long: int

    tie_margin: float = 0.0

    @property
    def sign_change(self) -> str | None:
        """How the contrast moved between the horizons: ``significant`` when both are corrected differences of
        opposite sign; ``verdict`` when one horizon shows a tie and the other a difference (both established);
        ``point`` when only the point estimates' signs differ and at least one lies beyond the tie margin;
        ``margin`` when a tie at one horizon meets, at the other, an estimate of the same sign beyond the tie margin
        that is not established; None otherwise (the same sign without a tie, one missing, or two estimates inside
        the tie margin, where a sign means nothing)."""
        a, b = self.short.test.mean, self.long.test.mean
        if a is None or b is None:
            return None
        verdicts, differences = {self.short.verdict, self.long.verdict}, {"benefit", "harm"}
        if verdicts == differences:
            return "significant"
        if "tie" in verdicts and verdicts & differences:
            return "verdict"
        if (a < 0) != (b < 0) and max(abs(a), abs(b)) > self.tie_margin:
            return "point"
        if "tie" in verdicts and max(abs(a), abs(b)) > self.tie_margin:
            return "margin"
        return None


def horizon_pairs(results: Sequence[StudyResult]) -> list[HorizonPair]:
    """The contrasts (by treatment and reference) that two arm-labelled declarations of different horizons share,
    per format both analysed."""
    out = []
    declared = [r for r in results if r.endpoint.label == "arm" and r.endpoint.horizon is not None]
    for short in declared:
        for long in declared:
            hs, hl = short.endpoint.horizon, long.endpoint.horizon
            if not hs < hl:
                continue
            for c in long.comparisons:
                mate = next((s for s in short.comparisons if s.format == c.format
                             and (s.contrast.treatment, s.contrast.reference)
                             == (c.contrast.treatment, c.contrast.reference)), None)
                if mate is not None:
                    out.append(HorizonPair(c.contrast.label or c.contrast.name, c.format, mate, c, hs, hl,
                                           long.endpoint.tie_margin))
    return out


def horizon_lines(results: Sequence[StudyResult]) -> list[str]:
    """The decisive contrasts at H beside the longer horizon; a sign change is a horizon effect."""
    pairs = horizon_pairs(results)
    if not pairs:
        return []
    parts = []
    for p in pairs:
        a, b = p.short.test.mean, p.long.test.mean
        text = (f"{p.label} {p.format}: {'—' if a is None else f'{a:+.4f}'} ({p.short.verdict}) at {p.h_short} → "
                f"{'—' if b is None else f'{b:+.4f}'} ({p.long.verdict}) at {p.h_long}")
        if p.sign_change == "significant":
            text += " — **the sign changes: a horizon effect**"
        elif p.sign_change == "verdict":
            text += " — **a tie at one horizon, a difference at the other: a horizon effect**"
        elif p.sign_change == "point":
            text += (f" — the point estimate changes sign, beyond the tie margin (±{p.tie_margin:g}) at one horizon, "
                     "and not both are established: a possible horizon effect")
        elif p.sign_change == "margin":
            text += (f" — a tie at one horizon; at the other the estimate lies beyond the tie margin "
                     f"(±{p.tie_margin:g}), not established: a possible horizon effect")
        parts.append(text)
    return ["Horizon (the same contrasts, each run's schedule ending at its own horizon; each horizon's verdicts "
            "under its own declaration): " + "; ".join(parts) + "."]


def pilot_rows(jobs: Sequence[Job], horizons: Sequence[int]) -> list[tuple[Job, int, float, float]]:
    """(pilot run, H, loss at H, loss at 4H) for each completed pilot run long enough for 4H, for each H (the
    declared horizons; none declared: a quarter of the run)."""
    from altgrad.sweep.horizon import loss_at

    rows = []
    for job in jobs:
        if PILOT not in _experiment(job) or job.state != "completed" or not job.curve:
            continue
        last = max(step for step, _ in job.curve) + 1
        for h in (horizons or [last // HORIZON_FACTOR]):
            at_h, at_end = loss_at(job.curve, h), loss_at(job.curve, HORIZON_FACTOR * h)
            if HORIZON_FACTOR * h <= last and at_h is not None and at_end is not None:
                rows.append((job, h, at_h, at_end))
    return sorted(rows, key=lambda r: (r[1], r[0].lr or 0.0, r[0].name))


# --- tuning --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TunedCell:
    """One (format, arm) lr scan: mean final loss per lr over its tuning seeds, the failed lrs, and the pick."""

    format: str
    arm: str
    losses: dict[float, float | None]     # lr → mean over completed seeds (None: every seed failed)
    failed: dict[float, int]              # lr → failed (diverged or crashed) seeds
    seeds: tuple[int, ...]
    pick: float | None
    pick_source: str                      # "evaluation" (the lr the evaluation ran) or "lowest mean"

    @property
    def bracketed(self) -> bool | None:
        """Whether a scanned lr lies on each side of the pick (None without a pick)."""
        if self.pick is None:
            return None
        lrs = sorted(self.losses)
        return any(x < self.pick and not math.isclose(x, self.pick) for x in lrs) and any(
            x > self.pick and not math.isclose(x, self.pick) for x in lrs)

    def flat(self, margin: float) -> bool:
        """Whether the scan cannot resolve its pick: ≥ 3 lrs with a loss, and their mean losses span less than
        ``margin`` (the tie margin), so every scanned lr ties with the pick and the scan shows no rise either side."""
        values = [m for m in self.losses.values() if m is not None]
        return len(values) >= 3 and max(values) - min(values) < margin


def tuning_jobs(jobs: Sequence[Job]) -> list[Job]:
    """The tuning scans' runs (experiments named ``*tune*``) that ran an lr and finished or failed."""
    return [j for j in jobs if TUNE in _experiment(j) and j.lr is not None
            and j.state in ("completed", "diverged", "failed")]


def tuning(jobs: Sequence[Job], evaluated: Sequence[Job] = ()) -> list[TunedCell]:
    """Every tuning scan (experiments named ``*tune*``) per (format, arm), in report order; the pick is the lr the
    evaluation ran that arm at where it has run, else the lowest mean loss among lrs without a failed seed."""
    by: dict[tuple[str, str], dict[float, list[Job]]] = {}
    for job in tuning_jobs(jobs):
        by.setdefault((job.format, job.arm), {}).setdefault(job.lr, []).append(job)
    ran = {(j.format, j.arm): j.lr for j in evaluated if j.lr is not None}
    out = []
    for (fmt, arm), scans in by.items():
        losses = {lr: (statistics.fmean(v) if (v := [j.final_loss for j in js if j.final_loss is not None]) else None)
                  for lr, js in sorted(scans.items())}
        failed = {lr: sum(j.state != "completed" for j in js) for lr, js in scans.items()}
        seeds = tuple(sorted({j.seed for js in scans.values() for j in js if j.seed is not None}))
        pick, source = ran.get((fmt, arm)), "evaluation"
        if pick is None:
            clean = [(m, lr) for lr, m in losses.items() if m is not None and not failed[lr]]
            pick, source = (min(clean)[1], "lowest mean") if clean else (None, "none")
        out.append(TunedCell(fmt, arm, losses, failed, seeds, pick, source))
    return sorted(out, key=lambda c: (rank(FORMAT_ORDER, c.format), c.arm))


def tuning_lines(cells: Sequence[TunedCell], margin: float | None = None) -> list[str]:
    """The scans' summary: edge picks (not bracketed), then, given the tie margin, the flat scans."""
    if not cells:
        return []
    edge = [c for c in cells if c.bracketed is False]
    text = (f"Tuning: {len(cells)} lr scan(s) (format × arm) on seeds "
            + ", ".join(map(str, sorted({s for c in cells for s in c.seeds}))) + "; ")
    if edge:
        text += ("the pick sits at the edge of its scan (not bracketed) in " + ", ".join(
            f"{c.format} {c.arm} (lr {c.pick:g})" for c in edge) + ": the best lr may lie beyond it")
    else:
        text += "every pick is bracketed by a scanned lr on each side"
    flat = [c for c in cells if margin is not None and c.flat(margin)]
    if flat:
        def span(c: TunedCell) -> str:
            values = {lr: m for lr, m in c.losses.items() if m is not None}
            return (f"{c.format} {c.arm} ({min(values.values()):.4f}–{max(values.values()):.4f} over lrs "
                    f"{min(values):g}–{max(values):g})")
        text += ("; the scan is flat (its mean losses span less than the tie margin ±"
                 f"{margin:g}) in " + ", ".join(span(c) for c in flat) + ": every scanned lr ties with the pick, so "
                 "the scan does not resolve it, and what an lr outside the scan would give is not known")
    return [text + "."]


# --- power ---------------------------------------------------------------------------------------------------------

def read_power(roots: Sequence[Path]) -> dict[str, Any] | None:
    """The power stage's record (``power.json`` in a records root), None when absent or unreadable."""
    for root in roots:
        path = Path(root) / "power.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


def power_line(record: dict[str, Any] | None) -> str:
    if record is None:
        return "Power: no power record (power.json) yet: the evaluation's number of seeds is not chosen."
    sd, df, needed, n = (record.get(k) for k in ("paired_sd", "df", "needed", "seeds"))
    sd_text = f"pooled paired SD {sd:.4f} on {df} df" if isinstance(sd, (int, float)) else "no paired SD"
    return (f"Power (power.json): {sd_text}; to detect ±{record.get('margin')} at α = {record.get('alpha')}/"
            f"{record.get('family')} with power {record.get('power')}: n = {needed} → {n} evaluation seeds"
            + (" — **underpowered** (capped at max_seeds)" if record.get("underpowered") else "") + ".")


def power_check_line(record: dict[str, Any] | None, result: StudyResult) -> str | None:
    """The power plan's paired SD against the SDs the evaluation's primary family met, and the seeds the plan's own
    calculation asks for at those: a plan drawn on less noise than the evaluation showed is a caveat, computed."""
    planned = None if record is None else record.get("paired_sd")
    if not isinstance(planned, (int, float)) or not planned > 0:
        return None
    margin, alpha, family, power = (record.get(k) for k in ("margin", "alpha", "family", "power"))
    observed = [(c, c.paired_sd) for c in result.comparisons if len(c.deltas) >= 2 and c.paired_sd is not None]
    if not observed or not all(isinstance(v, (int, float)) for v in (margin, alpha, family, power)):
        return None
    by_contrast: dict[str, list[str]] = {}
    for c, sd in observed:
        n = stats.seeds_needed(sd, margin, alpha / family, power, max_n=1000)
        name = f"{c.contrast.label} ({c.contrast.name})" if c.contrast.label else c.contrast.name
        by_contrast.setdefault(name, []).append(f"{c.format} {sd:.3g} → n {'> 1000' if n is None else f'= {n}'}")
    sds = [sd for _, sd in observed]
    ran = sorted({len(c.deltas) for c, _ in observed})
    lo, hi = f"{min(sds) / planned:.2g}", f"{max(sds) / planned:.2g}"
    needed, seeds = record.get("needed"), record.get("seeds")
    plan = f", n = {needed} → {seeds} seeds" if isinstance(needed, int) and isinstance(seeds, int) else ""
    return (f"The power plan against the evaluation: the plan's pooled paired SD was {planned:.4f} (tuning seeds, "
            f"{record.get('df')} df){plan}; the evaluation's "
            f"paired SD per format lies at {lo if lo == hi else f'{lo}–{hi}'} × it "
            f"({sum(sd > planned for sd in sds)} of {len(sds)} above), and at each the plan's calculation (±{margin} "
            f"at α = {alpha}/{family}, power {power}) asks for: "
            + "; ".join(f"{name}: {', '.join(parts)}" for name, parts in by_contrast.items())
            + f" seed pairs ({'/'.join(map(str, ran))} ran).")

# --- mechanism -----------------------------------------------------------------------------------------------------

def mechanism_by_arm(result: StudyResult) -> list[tuple[str, str, str, int, list[float | None]]]:
    """(format, arm, storage, runs, medians over its runs of MECHANISM_KEYS) per arm and format that recorded any."""
    cells: dict[tuple[str, str], list[Job]] = {}
    for job in (*result.jobs, *result.ladder_jobs):
        cells.setdefault((job.format, job.arm), []).append(job)
    out = []
    for (fmt, arm), jobs in sorted(cells.items(), key=lambda kv: (rank(FORMAT_ORDER, kv[0][0]), kv[0][1])):
        values = [_median([j.diagnostics[k] for j in jobs if k in j.diagnostics]) for k, _ in MECHANISM_KEYS]
        if any(v is not None for v in values):
            out.append((fmt, arm, jobs[0].storage, len(jobs), values))
    return out


def mechanism_lines(result: StudyResult) -> list[str]:
    """Whether the stall mechanism is active: the nearest-storage arms' share of updates below ½ ULP per format."""
    rows = mechanism_by_arm(result)
    nearest = [(fmt, arm, v[0]) for fmt, arm, storage, _, v in rows
               if storage == "on-grid nearest" and v[0] is not None]
    if not nearest:
        return []
    large = [f"{fmt} {arm} {share:.2f}" for fmt, arm, share in nearest if share >= STALL_SHARE]
    small = [f"{fmt} {arm} {share:.2f}" for fmt, arm, share in nearest if share < STALL_SHARE]
    text = (f"Mechanism (descriptive, median over runs): the share of updates below ½ ULP under nearest storage is "
            f"≥ {STALL_SHARE:g} in " + (", ".join(large) if large else "no arm and format"))
    if small:
        text += f" and below it in {', '.join(small)} (there a stall story does not apply)"
    return [text + "."]


# --- tables --------------------------------------------------------------------------------------------------------

def pilot_table(rows: Sequence[tuple[Job, int, float, float]]) -> str:
    from altgrad.report.tables import markdown_table

    return markdown_table(["pilot run", "lr", "seed", "H", "loss at H", f"loss at {HORIZON_FACTOR}H",
                           f"loss(H) / loss({HORIZON_FACTOR}H) − 1"],
                          [[j.name, "—" if j.lr is None else f"{j.lr:g}", j.seed, h, f"{a:.4f}", f"{b:.4f}",
                            f"{100 * (a / b - 1):+.1f} %"] for j, h, a, b in rows])


def tuning_table(cells: Sequence[TunedCell]) -> str:
    from altgrad.report.tables import markdown_table

    rows = []
    for c in cells:
        scan = ", ".join(f"{lr:g}: " + ("failed" if m is None else f"{m:.4f}")
                         + (f" ({c.failed[lr]} failed)" if c.failed[lr] and m is not None else "")
                         for lr, m in c.losses.items())
        rows.append([c.format, c.arm, len(c.seeds), scan, "—" if c.pick is None else f"{c.pick:g}", c.pick_source,
                     {True: "yes", False: "**no (edge)**", None: "—"}[c.bracketed]])
    return markdown_table(["format", "arm", "seeds", "lr: mean final loss", "pick", "pick from", "bracketed"], rows)


def mechanism_table(result: StudyResult) -> str:
    from altgrad.report.tables import markdown_table, sig

    return markdown_table(["format", "arm", "storage", "runs", *(label for _, label in MECHANISM_KEYS)],
                          [[f, a, s, n, *(sig(v) for v in values)] for f, a, s, n, values in mechanism_by_arm(result)])

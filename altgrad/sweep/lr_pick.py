"""The tuned learning rate of every (format, arm) cell of lr-scan sweeps, merged into a tuned-lr table.

A scanned lr is a candidate when every run of it in the cell completed (none diverged, failed or is missing); its
score is the mean final validation loss over seeds. The pick is the candidate with the lowest score. A pick is
refused (nothing is written, exit 2) when

- it sits at an edge of the scanned grid (the lowest lr, or the highest with no diverged lr above it), so the
  optimum may lie outside, or no lr is stable at all; ``--extend FILE`` then writes the commands of an extension
  scan (two more lrs beyond the edge at the grid's own ratio, below the grid when nothing was stable; same tuning
  seeds, into the same sweep folder, resumable), or
- fewer lrs were scanned than ``--min-lrs``, or the cell's lrs ran on different seeds, or
- a tuning run's seed is also an evaluation seed (``--eval-seeds``), or
- an arm's tuning runs stepped their grid-less parameters at another lr than the plain arm's pick in that format
  (the plain groups must step as the baseline does: tune the plain arm, AdamW by default, first, then the other
  arms with ``baseline.lr=${tuned_lr.${format.label}.plain}``), or the plain arm has no pick in that format yet.

A job's arm is its study arm (``arm``, conf/arm/) where it has one, else its optimizer (NAME-ongrid_ROUNDING with
weights stored on the grid). ``--table FILE`` merges the picks into a tuned-lr table (altgrad.sweep.lr_table: the
plain arm's pick, ``--plain-arm``, also becomes the format's ``plain`` lr); without it the picks are printed only.

    python -m altgrad.sweep.lr_pick SWEEP_DIR... [--table FILE] [--eval-seeds 1,2,3] [--min-lrs N] [--extend FILE]
        [--plain-arm ARM]
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from altgrad.report.load import Job, as_float, load_sweeps
from altgrad.sweep.lr_table import PLAIN_KEY, Table, read_table, write_table


@dataclass(frozen=True)
class LrPick:
    """The chosen lr of one (format, arm) cell (None: no candidate), its score, the candidates, the lrs at which
    some run did not complete (diverged, failed, or missing), and why the pick cannot be used (``refusal``; None:
    usable)."""

    optimizer_label: str
    format: str
    arm: str
    lr: float | None
    score: float | None
    candidates: tuple[float, ...]
    unstable: tuple[float, ...]
    scanned: tuple[float, ...] = ()
    seeds: tuple[int, ...] = ()
    edge: str | None = None
    refusal: str | None = None
    plain_lr: float | None = None
    jobs: tuple[Job, ...] = field(default=(), repr=False, compare=False)
    extendable: bool = False  # refused only for its edge: an extension scan can settle it

    @property
    def cell(self) -> str:
        return f"{self.arm} in {self.format}"

    def describe(self) -> str:
        if self.lr is None:
            return f"{self.cell}: no lr completed (unstable: {[f'{x:g}' for x in self.unstable]})"
        return (f"{self.cell}: lr={self.lr:g} (mean final val loss {self.score:.4f} over seeds {list(self.seeds)}; "
                f"{len(self.candidates)} stable lrs of {len(self.scanned)} scanned "
                f"[{', '.join(f'{x:g}' for x in self.scanned)}], unstable: {[f'{x:g}' for x in self.unstable]})")


def arm_key(job: Job) -> str:
    """The table key of a job's arm: its study arm (``arm``, conf/arm/) where it has one; else optimizer.name for
    fp32 master weights, NAME-ongrid_ROUNDING on the grid."""
    if job.get("arm"):
        return str(job.get("arm"))
    if job.master == "none":
        rounding = job.summary.get("storage_rounding") or "nearest"
        return f"{job.optimizer}-ongrid_{rounding}"
    return job.optimizer


def plain_lr_of(job: Job) -> float | None:
    """The lr a run stepped its grid-less parameters at (None: the optimizer has no plain groups, e.g. AdamW)."""
    groups = job.summary.get("optimizer_groups")
    if isinstance(groups, dict) and "plain_lr" in groups:
        return as_float(groups["plain_lr"])
    return as_float((job.config.get("optimizer") or {}).get("plain_lr"))


def edge_of(best: float, scanned: Sequence[float]) -> str | None:
    """``low``/``high`` when the best lr is the lowest or the highest lr scanned in its cell; None when a scanned
    lr lies on either side (a diverged lr above it brackets it too: the stability limit)."""
    scanned = sorted(scanned)
    if best == scanned[0]:
        return "low"
    if best == scanned[-1]:
        return "high"
    return None


def _score_cell(by_lr: dict[float, list[Job]]) -> tuple[dict[float, float], list[float]]:
    """The mean final validation loss of every lr whose runs all completed, and the lrs where some did not."""
    scores: dict[float, float] = {}
    unstable = []
    for lr, js in sorted(by_lr.items()):
        if any(j.state != "completed" or j.final_loss is None for j in js):
            unstable.append(lr)
        else:
            scores[lr] = sum(float(j.final_loss) for j in js) / len(js)
    return scores, unstable


def _pick(label: str, by_lr: dict[float, list[Job]], fmt: str, arm: str, eval_seeds: frozenset[int],
          min_lrs: int) -> LrPick:
    scores, unstable = _score_cell(by_lr)
    jobs = tuple(j for js in by_lr.values() for j in js)
    seeds = tuple(sorted({j.seed for j in jobs if j.seed is not None}))
    best = min(scores, key=lambda lr: (scores[lr], lr)) if scores else None
    plain = sorted({x for x in (plain_lr_of(j) for j in jobs) if x is not None})
    scanned = tuple(sorted(by_lr))
    edge = edge_of(best, scanned) if best is not None else None
    refusals = []  # the edge's first: it alone can be cured by an extension scan
    if edge is not None:
        refusals.append(f"the best lr {best:g} is at the {edge} edge of the scanned grid "
                        f"[{', '.join(f'{x:g}' for x in scanned)}]; scan beyond it (--extend FILE writes the jobs)")
    elif best is not None and len(scanned) < min_lrs:
        refusals.append(f"only {len(scanned)} lrs scanned; at least {min_lrs} are needed (--min-lrs)")
    overlap = sorted(set(seeds) & eval_seeds)
    if overlap:
        refusals.append(f"tuning runs use seed(s) {overlap}, which are evaluation seeds {sorted(eval_seeds)}; tune "
                        "on seeds disjoint from the evaluation seeds")
    if len({tuple(sorted(j.seed for j in js if j.seed is not None)) for js in by_lr.values()}) > 1:
        refusals.append("its lrs were run on different seeds; run every lr on the same tuning seeds")
    if len(plain) > 1:
        refusals.append(f"its runs stepped the grid-less parameters at different lrs {plain}; one plain lr per cell")
    return LrPick(label, fmt, arm, best, scores.get(best) if best is not None else None, tuple(sorted(scores)),
                  tuple(unstable), scanned, seeds, edge, "; and ".join(refusals) or None,
                  plain[0] if len(plain) == 1 else None, jobs, extendable=edge is not None and len(refusals) == 1)


def pick_per_format(jobs: Iterable[Job], *, eval_seeds: Iterable[int] = (), min_lrs: int = 1
                    ) -> dict[tuple[str, str], LrPick]:
    """The pick of every (format, arm) cell among the jobs, keyed by (format, arm key)."""
    runs: dict[tuple[str, str], dict[float, list[Job]]] = defaultdict(lambda: defaultdict(list))
    labels: dict[tuple[str, str], str] = {}
    for job in jobs:
        if job.lr is not None:
            key = (job.format, arm_key(job))
            runs[key][job.lr].append(job)
            labels[key] = job.optimizer_label
    seeds = frozenset(int(s) for s in eval_seeds)
    picks = {}
    for key, by_lr in sorted(runs.items()):
        pick = _pick(labels[key], by_lr, key[0], key[1], seeds, min_lrs)
        if pick.lr is None and pick.refusal is None:  # a table needs every cell: look below the unstable lrs
            refusal = "no scanned lr completed on every tuning seed; scan lower (--extend FILE writes the jobs)"
            pick = replace(pick, edge="low", extendable=True, refusal=refusal)
        picks[key] = pick
    return picks


# -- the tuned-lr table ---------------------------------------------------------------------------------------------
def table_updates(picks: dict[tuple[str, str], LrPick], table: Table, sweeps: Sequence[str],
                  plain_arm: str = "adamw") -> tuple[Table, list[str]]:
    """The table with the usable picks merged in, and the refusals of the plain-lr rule (one line each).

    The pick of ``plain_arm`` (AdamW's by default) also becomes the format's ``plain`` lr; every other arm must
    have been tuned at that plain lr.
    """
    new = {fmt: dict(arms) for fmt, arms in table.items()}
    for (fmt, arm), pick in picks.items():
        if arm == plain_arm and pick.lr is not None and pick.refusal is None:
            note = _note(pick, sweeps)
            new.setdefault(fmt, {})[arm] = (pick.lr, note)
            new[fmt][PLAIN_KEY] = (pick.lr, f"= {arm}: the lr of every arm's grid-less parameters")
    problems = []
    for (fmt, arm), pick in picks.items():
        if arm == plain_arm or pick.lr is None or pick.refusal is not None:
            continue
        plain = new.get(fmt, {}).get(PLAIN_KEY)
        if plain is None and pick.plain_lr is None:  # its optimizer steps every tensor itself (AdamW): no plain lr
            new.setdefault(fmt, {})[arm] = (pick.lr, _note(pick, sweeps))
        elif plain is None:
            problems.append(f"{pick.cell}: {plain_arm} has no pick in {fmt} yet; tune {plain_arm} first, then this "
                            "arm with baseline.lr=${tuned_lr.${format.label}.plain}")
        elif pick.plain_lr is not None and not math.isclose(pick.plain_lr, plain[0], rel_tol=1e-9):
            problems.append(f"{pick.cell}: its runs stepped the grid-less parameters at lr {pick.plain_lr:g}, but "
                            f"{plain_arm}'s pick in {fmt} is {plain[0]:g}; rerun its scan with "
                            "baseline.lr=${tuned_lr.${format.label}.plain}")
        else:
            new[fmt][arm] = (pick.lr, _note(pick, sweeps))
    return new, problems


def _shown(path: str | Path) -> str:
    """A sweep folder as the table's comments name it: relative to the working directory when inside it (a
    committed table should not carry one machine's absolute paths)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _note(pick: LrPick, sweeps: Sequence[str]) -> str:
    return (f"{len(pick.candidates)}/{len(pick.scanned)} lrs {pick.scanned[0]:g}…{pick.scanned[-1]:g} stable, seeds "
            f"{list(pick.seeds)}: final val loss {pick.score:.4f} ({', '.join(sweeps)})")


# -- extension scans ------------------------------------------------------------------------------------------------
def extension_lrs(pick: LrPick, n: int = 2) -> list[float]:
    """``n`` lrs beyond the pick's edge at the grid's mean ratio (√10 when one lr was scanned); a half-decade grid
    goes on along its 1-3-10 ladder."""
    scanned = pick.scanned
    ratio = (scanned[-1] / scanned[0]) ** (1 / (len(scanned) - 1)) if len(scanned) > 1 else math.sqrt(10)
    half_decades = abs(math.log10(ratio) - 0.5) < 0.05
    fifth_decades = abs(math.log10(ratio) - 0.2) < 0.02  # a ×1.585 ladder, 10^(k/5) to three digits
    x, out = (scanned[0], []) if pick.edge == "low" else (scanned[-1], [])
    for _ in range(n):
        x = x / ratio if pick.edge == "low" else x * ratio
        if half_decades:  # snap to 1·10^k or 3·10^k
            k = math.floor(math.log10(x))
            mantissa = min((1.0, 3.0, 10.0), key=lambda m: abs(math.log10(x / 10**k) - math.log10(m)))
            x = mantissa * 10**k
        if fifth_decades:  # snap to the ladder: the grid's own values stay its values
            x = float(f"{10 ** (round(5 * math.log10(x)) / 5):.3g}")
        out.append(float(f"{x:.4g}"))
    return out


_NOT_REPEATED = ("seed", "resume_sweep", "+resume_sweep", "hydra.")


def extension_command(pick: LrPick) -> str:
    """One `python -m altgrad.train` command that runs the extension lrs on the cell's tuning seeds, into the
    same sweep folder (a job dir's parent; job dirs named as Hydra names the scan's own), skipping what already
    finished (+resume_sweep=true). The lrs go to the key the scan swept: optimizer.lr, or baseline.lr (AdamW's
    lr) where a scan swept that instead."""
    job = next((j for j in pick.jobs if j.overrides), None)
    if job is None:
        raise ValueError(f"{pick.cell}: no job has .hydra/overrides.yaml to repeat; run its extension by hand with "
                         f"optimizer.lr={','.join(f'{x:g}' for x in extension_lrs(pick))}")
    if job.path.name.isdigit():
        raise ValueError(f"{pick.cell}: its sweep numbers its job dirs ({job.path}), so extension jobs would take "
                         "the numbers of finished ones; scan as a named experiment (job dirs named by their "
                         "overrides, e.g. experiment=study_cpu_tune), or run the extension into a new folder by hand")
    keys = [o.split("=", 1)[0] for o in job.overrides]
    lr_key = "baseline.lr" if "baseline.lr" in keys and "optimizer.lr" not in keys else "optimizer.lr"  # AdamW's
    kept = [o for o, k in zip(job.overrides, keys) if not k.startswith((*_NOT_REPEATED, lr_key))]
    lrs = ",".join(f"{x:g}" for x in extension_lrs(pick))
    seeds = ",".join(str(s) for s in pick.seeds)
    args = [*kept, f"{lr_key}={lrs}", f"seed={seeds}", f"hydra.sweep.dir={job.path.parent}", "+resume_sweep=true"]
    named_experiment = any(o.startswith("experiment=") for o in kept)  # experiments are multiruns by themselves
    return "python -m altgrad.train " + ("" if named_experiment else "-m ") + " ".join(shlex.quote(a) for a in args)


def write_extension(path: Path, picks: Iterable[LrPick]) -> int:
    """Write a bash script of extension commands for the picks at an edge; return how many it holds."""
    commands = [f"# {p.cell}: {'no stable lr' if p.lr is None else f'best lr {p.lr:g}'} at the {p.edge} edge\n"
                f"{extension_command(p)}" for p in picks if p.extendable]
    if commands:
        path.write_text("#!/usr/bin/env bash\n# Extension scans written by altgrad.sweep.lr_pick: rerunnable (finished "
                        "jobs are skipped); then run lr_pick again.\nset -e\n" + "\n".join(commands) + "\n")
    return len(commands)


# -- command line ---------------------------------------------------------------------------------------------------
def _seed_list(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integer seeds") from None


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m altgrad.sweep.lr_pick", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dirs", nargs="+", metavar="SWEEP_DIR", help="lr-scan multirun folder(s)")
    parser.add_argument("--table", type=Path, help="merge the picks into this tuned-lr table (else: print them)")
    parser.add_argument("--eval-seeds", type=_seed_list, default=[], help="refuse tuning runs on these seeds")
    parser.add_argument("--min-lrs", type=int, default=1, help="refuse cells with fewer scanned lrs")
    parser.add_argument("--extend", type=Path, help="write the extension scans of edge picks to this script")
    parser.add_argument("--plain-arm", default="adamw",
                        help="--table: the arm whose pick is each format's plain lr (default adamw)")
    args = parser.parse_args(list(argv))
    try:
        sweep = load_sweeps(args.sweep_dirs)
        picks = pick_per_format(sweep.jobs, eval_seeds=args.eval_seeds, min_lrs=args.min_lrs)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not picks:
        print("error: no job with a learning rate in the given sweep folders", file=sys.stderr)
        return 2
    for pick in picks.values():
        print(pick.describe())
    refused = [p for p in picks.values() if p.refusal is not None]
    for pick in refused:
        print(f"error: {pick.cell}: {pick.refusal}", file=sys.stderr)
    if args.extend:
        try:
            n = write_extension(args.extend, refused)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"{n} extension scan(s) written to {args.extend}" if n else "no pick refused for its edge alone: "
              "nothing to extend")
    if refused:
        print("nothing written: resolve the refusals above first", file=sys.stderr)
        return 2
    note_sweeps = [_shown(d) for d in args.sweep_dirs]
    if args.table:
        try:
            table, problems = table_updates(picks, read_table(args.table), note_sweeps, args.plain_arm)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        if problems:
            for line in problems:
                print(f"error: {line}", file=sys.stderr)
            print("nothing written: resolve the refusals above first", file=sys.stderr)
            return 2
        write_table(args.table, table)
        print(f"written to {args.table}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

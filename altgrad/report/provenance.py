"""What the records say about their own inputs: the data files' sha256 (one set across a study, or not), the code
commits the runs name, the records per stage folder, and the failures per cell.

A study's runs are comparable only when they read the same data and ran one code state; both are recorded in every
summary.json (``data_files``: file name → sha256; ``code``: {commit, dirty}), so the report checks them instead of
trusting them. Failures are counted, never dropped: a diverged or never-learning run enters a declared Δ at its
initial loss (altgrad/report/study.py), and here each cell says how many it had.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from altgrad.provenance import CODE_PATHS, PACKAGE_ROOT, code_tree
from altgrad.report.load import Job

NEVER_LEARNED = "never learned"
"""The divergence callback's cause for a run whose training loss never fell enough (altgrad/callbacks/divergence.py)."""


@dataclass(frozen=True)
class DataSet:
    """One set of data files (name, sha256) and the runs that read it."""

    files: tuple[tuple[str, str], ...]
    jobs: tuple[Job, ...]


def data_sets(jobs: Sequence[Job]) -> tuple[list[DataSet], list[Job]]:
    """(the distinct sets of data files the runs recorded, most runs first; the runs with a summary that recorded
    none: generated or hub data, or runs older than the record)."""
    sets: dict[tuple[tuple[str, str], ...], list[Job]] = {}
    without = []
    for job in jobs:
        if not job.summary:
            continue
        files = job.summary.get("data_files")
        if isinstance(files, Mapping) and files:
            key = tuple(sorted((str(name).rsplit("/", 1)[-1], str(sha)) for name, sha in files.items()))
            sets.setdefault(key, []).append(job)
        else:
            without.append(job)
    ordered = sorted(sets.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return [DataSet(k, tuple(v)) for k, v in ordered], without


def code_commits(jobs: Sequence[Job]) -> tuple[dict[str, list[Job]], list[Job]]:
    """(commit → its runs, a ``+dirty`` suffix where tracked files were modified; the runs that name no commit)."""
    commits: dict[str, list[Job]] = {}
    without = []
    for job in jobs:
        if not job.summary:
            continue
        code = job.summary.get("code")
        commit = code.get("commit") if isinstance(code, Mapping) else None
        if not commit:
            without.append(job)
            continue
        commits.setdefault(str(commit) + ("+dirty" if code.get("dirty") else ""), []).append(job)
    return dict(sorted(commits.items(), key=lambda kv: (-len(kv[1]), kv[0]))), without


def stage_folder(job: Job) -> str:
    """The first folder of a job's name below the records' root (its stage in a study's records), else ``.``."""
    head, sep, _ = job.name.partition("/")
    return head if sep else "."


def by_stage(jobs: Sequence[Job]) -> dict[str, dict[str, int]]:
    """Per stage folder (in the order found): how many jobs in each state."""
    out: dict[str, dict[str, int]] = {}
    for job in jobs:
        counts = out.setdefault(stage_folder(job), {})
        counts[job.state] = counts.get(job.state, 0) + 1
    return out


def failure_kind(job: Job) -> str | None:
    """``never learned`` or ``diverged`` for a diverged run (by its recorded cause), ``crashed`` for a failed one."""
    if job.state == "diverged":
        cause = str(job.summary.get("divergence_cause") or "")
        return NEVER_LEARNED if cause.startswith(NEVER_LEARNED) else "diverged"
    if job.state == "failed":
        return "crashed"
    return None


def failures_by_cell(jobs: Sequence[Job]) -> list[tuple[str, str, str, float | None, dict[str, int], int]]:
    """(stage folder, format, arm, lr, {kind: count}, runs) for every cell (folder × format × arm × lr) with a
    failure, in the order found."""
    cells: dict[tuple[str, str, str, float | None], list[Job]] = {}
    for job in jobs:
        if job.summary:
            cells.setdefault((stage_folder(job), job.format, job.arm, job.lr), []).append(job)
    out = []
    for (folder, fmt, arm, lr), members in cells.items():
        kinds: dict[str, int] = {}
        for job in members:
            kind = failure_kind(job)
            if kind is not None:
                kinds[kind] = kinds.get(kind, 0) + 1
        if kinds:
            out.append((folder, fmt, arm, lr, kinds, len(members)))
    return out


def code_states(commits: Mapping[str, Sequence[Job]], root: Path = PACKAGE_ROOT) -> list[list[str]]:
    """The named commits grouped by the code they hold (CODE_PATHS' git objects): a study whose records were
    committed as they finished names several commits of one code state. A dirty commit, or one git cannot resolve
    here, is a state of its own. Groups and commits keep ``commits``' order."""
    groups: dict[object, list[str]] = {}
    for name in commits:
        tree = None if name.endswith("+dirty") else code_tree(name, root)
        groups.setdefault(tree if tree is not None else name, []).append(name)
    return list(groups.values())


def _runs(n: int) -> str:
    return f"{n} run" + ("" if n == 1 else "s")


def applies(jobs: Sequence[Job]) -> bool:
    """Whether the records carry what this section reads: data files' sha256 or study arms (study 2 onwards)."""
    return any(isinstance(j.summary.get("data_files"), Mapping) and j.summary.get("data_files")
               or j.summary.get("arm") for j in jobs)


def provenance_lines(jobs: Sequence[Job], root: Path = PACKAGE_ROOT) -> list[str]:
    """The provenance section's bullets: data, code (commits grouped by the code they hold, in the git checkout at
    ``root``), stage folders, failures."""
    lines = []
    sets, no_data = data_sets(jobs)
    recorded = sum(len(s.jobs) for s in sets)
    if not sets:
        lines.append("Data: no run recorded its data files' sha256 (generated or hub data, or older records).")
    elif len(sets) == 1:
        files = ", ".join(f"{name} sha256 {sha}" for name, sha in sets[0].files)
        lines.append(f"Data: one set of data files across the {recorded} runs that record it: {files}."
                     + (f" {len(no_data)} run(s) record none." if no_data else ""))
    else:
        lines.append(f"Data: **not one set** — the runs read {len(sets)} different sets of data files, so runs of "
                     "different sets are not comparable:")
        for k, s in enumerate(sets, 1):
            folders = sorted({stage_folder(j) for j in s.jobs})
            lines.append(f"  - set {k} ({_runs(len(s.jobs))}; folders {', '.join(folders)}): "
                         + ", ".join(f"{name} {sha[:16]}…" for name, sha in s.files))
        if no_data:
            lines.append(f"  - {len(no_data)} run(s) record no data files")
    commits, no_code = code_commits(jobs)
    if not commits:
        lines.append("Code: no run names its code commit (records older than the code record).")
    else:
        states = code_states(commits, root)
        names = "; ".join(" = ".join(f"{c} ({_runs(len(commits[c]))})" for c in state) for state in states)
        one = len(states) == 1 and not any(c.endswith("+dirty") for c in commits)
        same = (f" (“=” joins commits whose {', '.join(CODE_PATHS)} are identical, study plans and tuned-lr "
                "tables aside: records and tables committed as they were written)"
                ) if any(len(state) > 1 for state in states) else ""
        lines.append(("Code: one code state, " if one else f"Code: {len(states)} code states — ") + names
                     + (f"; {len(no_code)} run(s) name none (older records)" if no_code else "") + same + ".")
    stages = by_stage(jobs)
    if len(stages) > 1 or "." not in stages:
        lines.append("Records per folder: " + "; ".join(
            f"{folder}: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
            for folder, counts in stages.items()) + ".")
    failed = failures_by_cell(jobs)
    if failed:
        lines.append("Failures per cell (each counts: a diverged or never-learning run enters a declared Δ at its "
                     "initial loss; a crashed run leaves its seed unpaired): " + "; ".join(
                         f"{folder} {fmt} {arm}" + (f" lr {lr:g}" if lr is not None else "") + ": "
                         + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) + f" of {runs}"
                         for folder, fmt, arm, lr, kinds, runs in failed) + ".")
    else:
        lines.append("Failures: none (no run diverged, never learned or crashed).")
    return lines

"""The job bench's raw record: one JSON line per finished job, so a stopped bench loses nothing and rounds measured in
several sittings (whenever the machine is quiet) pool into one verdict.

Lines pool only when they share a *key*: the code measured (a hash of the files under ``altgrad/`` and ``conf/``
that a timed job can import or compose: the bench, report and study packages aside, the bench's plain loop kept;
the experiments and study plans aside unless ``--set`` selects an experiment), the bench's
extra overrides, the machine and the library versions. Changes to docs, tests, reports or the bench's reporting keep
the key, so a page can be regenerated on top of earlier rounds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import time
from pathlib import Path
from typing import Any

CODE_PATHS = ("altgrad", "conf")
# packages no timed job imports (tests/bench/test_bench_record_key.py checks it on the bench's own jobs): the bench,
# the report and the study driver; except the plain loop the bench times as a reference (and its package's init)
UNTIMED = ("altgrad/bench/", "altgrad/report/", "altgrad/study/")
TIMED_BENCH = ("altgrad/bench/_reference_loop.py", "altgrad/bench/__init__.py")
SUFFIXES = (".py", ".yaml", ".cpp", ".h", ".txt", ".json")
# config groups a job composes only when an override selects them: the studies' experiments (their tuned-lr tables
# change as a study runs) and the study plans
UNCOMPOSED = ("conf/experiment/", "conf/study/")


def selects_experiment(sets: list[str]) -> bool:
    """Whether the bench's extra overrides compose an experiment (then its files are part of what a job runs)."""
    return any(s.lstrip("+~").startswith("experiment") for s in sets)


def keyed_files(repo: Path, experiments: bool = False) -> list[Path]:
    """The files the code key hashes: sources and configs under altgrad/ and conf/, the UNTIMED packages left out
    but the bench's plain reference loop kept, and the UNCOMPOSED groups left out unless ``experiments``."""
    files = sorted(p for base in CODE_PATHS for p in (repo / base).rglob("*")
                   if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts)
    left_out = UNTIMED if experiments else UNTIMED + UNCOMPOSED
    return [p for p in files if not p.relative_to(repo).as_posix().startswith(left_out)
            or p.relative_to(repo).as_posix() in TIMED_BENCH]


def code_state(repo: Path, experiments: bool = False) -> str:
    """A hash of the code a job runs: every keyed file's path and content. Content, not git, so it holds on a copy
    of the tree without .git (a lent GPU machine) and counts uncommitted changes."""
    digest = hashlib.sha256()
    for path in keyed_files(repo, experiments):
        digest.update(path.relative_to(repo).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def make_key(repo: Path, sets: list[str], machine: str, versions: str) -> dict[str, Any]:
    """What must match for two jobs' timings to pool: code, extra overrides, machine, Python and library versions."""
    return {"code": code_state(repo, selects_experiment(sets)), "sets": list(sets), "machine": machine,
            "python": platform.python_version(), "versions": versions}


def load(path: Path, key: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The record's entries under ``key`` and how many lines were left out (other keys). A line that is not JSON
    stops with its line number: a record is written one whole line at a time, so a bad line means an edited file."""
    if not path.exists():
        return [], 0
    kept, other = [], 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            same = entry["key"] == key
            missing = [f for f in ("setting", "job", "round", "sample") if f not in entry]
            if same and missing:
                raise KeyError(", ".join(missing))
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise SystemExit(f"error: --record {path}: line {number} is not a bench record entry ({err}); "
                             "fix or remove that line") from None
        if same:
            kept.append(entry)
        else:
            other += 1
    return kept, other


def append(path: Path, key: dict[str, Any], setting: dict[str, Any], job: str, round_: int, sample: Any,
           commit: str | None = None) -> None:
    """Add one finished job (a dataclass sample) as one line, flushed before the next job starts; ``commit`` names
    the checkout it ran at (provenance only: pooling goes by the key)."""
    entry = {"key": key, "setting": setting, "job": job, "round": round_, "sample": dataclasses.asdict(sample),
             "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")

"""The job bench's raw record: one JSON line per finished job, so a stopped bench loses nothing and rounds measured in
several sittings (whenever the machine is quiet) pool into one verdict.

Lines pool only when they share a *key*: the code measured (git trees of ``altgrad/`` and ``conf/``, plus a hash of
any uncommitted change under them), the bench's extra overrides, the machine and the library versions. Commits that
touch only docs or tests keep the key, so a page can be regenerated on top of earlier rounds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

CODE_PATHS = ("altgrad", "conf")


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def code_state(repo: Path) -> dict[str, str | None]:
    """The code a job runs: the committed trees of altgrad/ and conf/ and a hash of uncommitted changes to them."""
    state: dict[str, str | None] = {p: _git(repo, "rev-parse", f"HEAD:{p}") or None for p in CODE_PATHS}
    diff = _git(repo, "diff", "HEAD", "--", *CODE_PATHS)
    untracked = _git(repo, "ls-files", "--others", "--exclude-standard", "--", *CODE_PATHS)
    state["local_changes"] = (hashlib.sha256((diff + "\n" + untracked).encode()).hexdigest()[:16]
                              if diff or untracked else None)
    return state


def make_key(repo: Path, sets: list[str], machine: str, versions: str) -> dict[str, Any]:
    """What must match for two jobs' timings to pool: code, extra overrides, machine, Python and library versions."""
    return {"code": code_state(repo), "sets": list(sets), "machine": machine, "python": platform.python_version(),
            "versions": versions}


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


def append(path: Path, key: dict[str, Any], setting: dict[str, Any], job: str, round_: int, sample: Any) -> None:
    """Add one finished job (a dataclass sample) as one line, flushed before the next job starts."""
    entry = {"key": key, "setting": setting, "job": job, "round": round_, "sample": dataclasses.asdict(sample),
             "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")

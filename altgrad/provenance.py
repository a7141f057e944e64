"""Which code a run ran: the git commit of the checkout the `altgrad` package is imported from, and whether its
tracked code files were modified. Recorded in summary.json (`code`), so a study can tell runs of different code apart.

One `git status` call per process (cached); a package that is not a git checkout, a missing git, or a slow one
records nulls and never stops a run.
"""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the folder holding altgrad/ (a checkout's root)
GIT_TIMEOUT_S = 10
CODE_PATHS = ("altgrad", "conf", "pyproject.toml", "Makefile")
"""What a run's numbers can depend on; a commit that changes none of them (records, docs, tests) is the same code."""
STUDY_FILES = ("conf/experiment/optim/tuned/", "conf/study/")
"""Below CODE_PATHS but not what a run computes: the tuned-lr tables a study writes as it runs (the lrs a run took
from one are in its own config, optimizer.lr and baseline.lr), and the study plans, which decide which runs happen
(each run's own config records what it ran), so a plan amended mid-study leaves its runs one code state."""


def _git(root: Path, *args: str) -> str | None:
    """``git -C root ARGS``'s output, or None where git cannot answer: no checkout at ``root`` (an installed package,
    or a folder inside some other repository), no git, a timeout, or a non-zero exit."""
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def is_code(path: str) -> bool:
    """Whether a repository path is code a run's numbers can depend on: below CODE_PATHS, not a study's table or
    plan."""
    return any(path == c or path.startswith(c + "/") for c in CODE_PATHS) and not path.startswith(STUDY_FILES)


def _changed_paths(status: str) -> list[str]:
    """The paths of ``git status --porcelain=v2 -z``'s change entries (both paths of a rename or copy)."""
    fields = status.split("\0")
    paths: list[str] = []
    i = 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if entry.startswith("1 "):            # ordinary: "1 XY sub mH mI mW hH hI path"
            paths.append(entry.split(" ", 8)[8])
        elif entry.startswith("2 "):          # renamed or copied: "... X<score> path", then the original path
            paths.append(entry.split(" ", 9)[9])
            if i < len(fields):
                paths.append(fields[i])
                i += 1
        elif entry.startswith("u "):          # unmerged: "u XY sub m1 m2 m3 mW h1 h2 h3 path"
            paths.append(entry.split(" ", 10)[10])
    return paths


@functools.lru_cache(maxsize=None)
def code_state(root: Path = PACKAGE_ROOT) -> dict[str, Any]:
    """{"commit": HEAD's sha or None, "dirty": whether a tracked file of the code (``is_code``) differs from it, or
    None when unknown}. A changed record, doc, test, study plan or tuned-lr table (a study writes its table, then
    runs from it: each run's config holds the lrs it took) leaves the code as committed, as ``code_tree`` reads
    it too."""
    unknown: dict[str, Any] = {"commit": None, "dirty": None}
    out = _git(root, "status", "--porcelain=v2", "--branch", "--untracked-files=no", "-z")
    if out is None:
        return unknown
    commit = next((f.split()[2] for f in out.split("\0") if f.startswith("# branch.oid ")), None)
    if commit is None or commit == "(initial)":
        return unknown
    return {"commit": commit, "dirty": any(is_code(p) for p in _changed_paths(out))}


def code_tree(commit: str, root: Path = PACKAGE_ROOT) -> tuple[str, ...] | None:
    """The files of CODE_PATHS at ``commit`` as "object id path" (equal for two commits whose code is the same), less
    STUDY_FILES; None where git cannot tell (no checkout, an unknown commit, a shallow clone without it)."""
    if not re.fullmatch(r"[0-9a-f]{4,64}", commit):  # a sha, never an option or a revision expression
        return None
    out = _git(root, "ls-tree", "-r", "--full-tree", commit, "--", *CODE_PATHS)
    if not out:
        return None
    files = (line.split(None, 2)[2].split("\t", 1) for line in out.splitlines())  # "mode type oid\tpath"
    return tuple(f"{oid} {path}" for oid, path in files if not path.startswith(STUDY_FILES))

"""Which code a run ran: the git commit of the checkout the `altgrad` package is imported from, and whether its
tracked files were modified. Recorded in summary.json (`code`), so a study can tell runs of different code apart.

One `git status` call per process (cached); a package that is not a git checkout, a missing git, or a slow one
records nulls and never stops a run.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the folder holding altgrad/ (a checkout's root)
GIT_TIMEOUT_S = 10


@functools.lru_cache(maxsize=None)
def code_state(root: Path = PACKAGE_ROOT) -> dict[str, Any]:
    """{"commit": HEAD's sha or None, "dirty": whether tracked files differ from it, or None when unknown}."""
    unknown: dict[str, Any] = {"commit": None, "dirty": None}
    if not (root / ".git").exists():  # an installed package, or a folder inside some other repository
        return unknown
    try:
        out = subprocess.run(["git", "-C", str(root), "status", "--porcelain=v2", "--branch", "--untracked-files=no"],
                             capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return unknown
    if out.returncode != 0:
        return unknown
    lines = out.stdout.splitlines()
    commit = next((line.split()[2] for line in lines if line.startswith("# branch.oid ")), None)
    if commit is None or commit == "(initial)":
        return unknown
    return {"commit": commit, "dirty": any(not line.startswith("#") for line in lines)}

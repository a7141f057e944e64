"""One run, one folder: a run claims its run dir with a lock held for its lifetime, and never starts over another run.

The claim is `fcntl.flock` on `<run dir>/.run.lock` (released by the kernel when the process ends, however it ends),
so a live run is detected without trusting stale files. A folder whose summary.json says `completed`, `diverged` or
`interrupted` holds another run's results (an interrupted one also its checkpoint): a new run refuses it unless it
resumes that very run (`ckpt_path` inside the folder). Folders of failed or killed runs may be reused, as a rerun
of a sweep does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO

LOCK = ".run.lock"
TAKEN = ("completed", "diverged", "interrupted")
EXIT_CODE = 2


class RunDirError(RuntimeError):
    """The run dir is in use or holds another run; the message is one line saying what to do."""


def _summary_status(run_dir: Path) -> tuple[str | None, int | None]:
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None, None
    if not isinstance(summary, dict):
        return None, None
    return summary.get("status"), summary.get("steps")


def resumes_here(run_dir: Path, ckpt_path: str | os.PathLike | None) -> bool:
    """Whether `ckpt_path` (a resolved checkpoint file) lies inside run_dir: the run continues in its own folder."""
    if not ckpt_path:
        return False
    try:
        Path(ckpt_path).resolve().relative_to(run_dir.resolve())
    except ValueError:
        return False
    return True


def check_free(run_dir: Path, ckpt_path: str | os.PathLike | None) -> None:
    """Raise RunDirError when run_dir holds another finished or interrupted run that this one does not resume."""
    status, steps = _summary_status(run_dir)
    if status in TAKEN and not resumes_here(run_dir, ckpt_path):
        hint = (f"resume it with ckpt_path={run_dir} hydra.run.dir={run_dir}, or give another hydra.run.dir"
                if status == "interrupted" else "give another hydra.run.dir (or leave it unset for a fresh folder)")
        raise RunDirError(f"run dir {run_dir} already holds a {status} run ({steps} steps); {hint}")


class RunDirClaim:
    """The lock on a run dir, held until `release()` (or the process's end)."""

    def __init__(self, run_dir: Path, handle: IO[str]) -> None:
        self.run_dir, self._handle = run_dir, handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file drops the flock
            self._handle = None


def claim(run_dir: Path, ckpt_path: str | os.PathLike | None) -> RunDirClaim:
    """Lock run_dir for this process and check it holds no other run; RunDirError (one line) if it cannot."""
    import fcntl

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = open(run_dir / LOCK, "a+")  # noqa: SIM115 (held open for the run's lifetime)
    except OSError as err:
        raise RunDirError(f"run dir {run_dir} cannot be written ({err.strerror}); give a writable hydra.run.dir "
                          "(or paths.output_dir)") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        owner = handle.read().strip() or "another process"
        handle.close()
        raise RunDirError(f"run dir {run_dir} is in use by a live run ({owner}); give another hydra.run.dir, "
                          "or wait for that run to end") from None
    try:
        check_free(run_dir, ckpt_path)
    except RunDirError:
        handle.close()
        raise
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
    handle.flush()
    return RunDirClaim(run_dir, handle)


def writable(run_dir: Path) -> bool:
    """Whether run_dir can be created or written: its nearest existing ancestor is a writable folder."""
    probe = run_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)


def probe(run_dir: Path, ckpt_path: str | os.PathLike | None) -> None:
    """The checks of `claim` without taking the folder: run before Hydra writes `.hydra/` into an explicit run dir,
    so a refused run leaves the other run's folder untouched. Raises RunDirError (one line)."""
    import fcntl

    if not writable(run_dir):
        raise RunDirError(f"run dir {run_dir} cannot be written (permission denied); give a writable hydra.run.dir")
    lock = run_dir / LOCK
    if lock.is_file():
        try:
            with open(lock) as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except OSError:
                    owner = handle.read().strip() or "another process"
                    raise RunDirError(f"run dir {run_dir} is in use by a live run ({owner}); give another "
                                      "hydra.run.dir, or wait for that run to end") from None
        except OSError:
            pass  # unreadable lock: claim() decides
    check_free(run_dir, ckpt_path)

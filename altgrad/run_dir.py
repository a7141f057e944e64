"""One run, one folder: a run claims its run dir with a lock held for its lifetime, and never starts over another run.

The claim is `fcntl.flock` on `<run dir>/.run.lock` (released by the kernel when the process ends, however it ends),
so a live run is detected without trusting stale files. A folder holds another run's work when its summary.json says
`completed` or `diverged`, or when it holds a checkpoint of a run that did not finish (interrupted, failed or killed):
a new run refuses it unless it resumes that very run (`ckpt_path` inside the folder). A folder whose run left no
checkpoint (failed or interrupted before its first step) may be reused, as a rerun does.

Claiming writes nothing into a folder that already holds files: the lock file is only created where missing, and
the claimant's pid is written once the run has passed its checks (`RunDirClaim.commit`), so a refused command leaves
every existing file as it was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

LOCK = ".run.lock"
FINISHED = ("completed", "diverged")
CHECKPOINT = Path("checkpoints") / "last.ckpt"
EXIT_CODE = 2


class RunDirError(RuntimeError):
    """The run dir is in use or holds another run; the message is one line saying what to do."""


def read_summary(run_dir: Path) -> dict:
    """The run dir's summary.json as a dict ({} when missing or unreadable)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return summary if isinstance(summary, dict) else {}


def _article(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


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
    """Raise RunDirError when run_dir holds another run's results or unfinished work that this one does not resume."""
    if resumes_here(run_dir, ckpt_path):
        return
    summary = read_summary(run_dir)
    status, steps = summary.get("status"), summary.get("steps")
    if status in FINISHED:
        raise RunDirError(f"run dir {run_dir} already holds {_article(str(status))} run ({steps} steps); give another "
                          "hydra.run.dir (or leave it unset for a fresh folder)")
    if (run_dir / CHECKPOINT).is_file():
        what = (f"{_article(str(status))} run ({steps} steps)" if status in ("interrupted", "failed")
                else "a run that ended without a summary (killed)")
        raise RunDirError(f"run dir {run_dir} already holds {what} and its checkpoint; resume it with "
                          f"ckpt_path={run_dir} hydra.run.dir={run_dir} (or +resume_sweep=true), or give another "
                          "hydra.run.dir")


class RunDirClaim:
    """The lock on a run dir, held until `release()` (or the process's end).

    fresh: the folder held nothing before this claim (besides the lock and Hydra's log), so writing into it at once
    damages nothing."""

    def __init__(self, run_dir: Path, handle: IO[str], fresh: bool) -> None:
        self.run_dir, self._handle, self.fresh = run_dir, handle, fresh

    def commit(self) -> None:
        """The run passed its checks and now owns the folder: say who holds it, and clear the temporary files a
        killed writer left (no other writer can be in this folder while the lock is held)."""
        if self._handle is not None:
            self._handle.seek(0)
            self._handle.truncate()
            self._handle.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
            self._handle.flush()
        remove_stale_temporaries(self.run_dir)

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file drops the flock
            self._handle = None


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Delete the temporary files of atomic writes (`altgrad.atomic`) that a killed process left in run_dir and its
    checkpoints/ folder; return them. Only safe while holding the run dir's lock."""
    from altgrad.atomic import is_temporary

    removed = []
    for folder in (run_dir, run_dir / CHECKPOINT.parent):
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for path in entries:
            if is_temporary(path) and path.is_file():
                try:
                    path.unlink()
                    removed.append(path)
                except OSError:
                    pass
    return removed


# Files that do not make a folder "used": the lock itself and the log file Hydra opens before the task starts.
_HOUSEKEEPING = (LOCK, "train.log")


def _is_fresh(run_dir: Path) -> bool:
    try:
        return all(p.name in _HOUSEKEEPING for p in run_dir.iterdir())
    except OSError:
        return False


def claim(run_dir: Path, ckpt_path: str | os.PathLike | None) -> RunDirClaim:
    """Lock run_dir for this process and check it holds no other run; RunDirError (one line) if it cannot.
    Nothing existing is written: `commit()` once the run's own checks have passed."""
    import fcntl

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fresh = _is_fresh(run_dir)
        handle = open(run_dir / LOCK, "a+")  # noqa: SIM115 (held open for the run's lifetime; created if missing)
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
    return RunDirClaim(run_dir, handle, fresh)


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


HYDRA_RECORD = ".hydra"


def record_job(run_dir: Path, cfg: Any) -> None:
    """Write the job's `.hydra/` (config.yaml, hydra.yaml, overrides.yaml, as Hydra writes them) into run_dir.

    conf/train.yaml sets `hydra.output_subdir: null`, so Hydra, which writes them before the task runs, leaves an
    existing folder alone; the run writes them here once it owns the folder. Nothing outside a Hydra job, or when
    the user set `hydra.output_subdir` (Hydra has then written its own).
    """
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from altgrad.atomic import write_text

    if not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.instance().cfg
    if hydra_cfg is None or hydra_cfg.hydra.output_subdir is not None:
        return
    folder = run_dir / HYDRA_RECORD
    folder.mkdir(parents=True, exist_ok=True)
    for name, node in (("config.yaml", cfg), ("hydra.yaml", hydra_cfg),
                       ("overrides.yaml", hydra_cfg.hydra.overrides.task)):
        write_text(folder / name, OmegaConf.to_yaml(node))

"""A parallel sweep stops as one, and a sweep stopped by a refusal leaves its folder as it was.

Under `hydra/launcher=joblib` the jobs run in worker processes: a signal to the sweep's own process does not reach
them, and raising there would make the process pool kill every worker mid-step. `SweepStop` (a Hydra callback,
conf/train.yaml) makes the launcher's process only note a signal and write `<sweep dir>/.stop`, naming itself and
the signal. Each job reads it at every step boundary (`InterruptGuard.external`) and stops there with a checkpoint,
as if signalled itself; a job that has not started does not start. Once the pool is done the launcher's process
exits 128 + signal with the line that resumes the sweep. A second signal stops it at once.

A job that `+resume_sweep=true` refuses (its folder holds another configuration's run) stops the sweep too: no
further job starts, and the `multirun.yaml` that Hydra rewrote at launch is put back as it was.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from altgrad.atomic import write_json
import altgrad.sweep.naming  # noqa: F401  (registers the job-dir resolver the sweep configs use)
from altgrad.interrupts import GUARD

MARKER = ".stop"
MULTIRUN_RECORD = "multirun.yaml"
SIGNAL, REFUSED = "signal", "refused"


@dataclass
class SweepState:
    """The sweep this process launches (launcher's process only)."""

    sweep_dir: Path
    parallel: bool
    multirun_record: bytes | None  # multirun.yaml as it was before this launch (None: there was none)


ACTIVE: SweepState | None = None
_REFUSED_HERE = False


def parallel_launcher(launcher_target: Any) -> bool:
    """Whether a Hydra launcher runs jobs in worker processes of this machine (joblib); the basic launcher runs them
    in its own process, and a cluster launcher's jobs get the cluster's signals themselves."""
    return "joblib" in str(launcher_target or "").lower()


def write_marker(sweep_dir: Path, kind: str, signum: int | None, launcher_pid: int) -> None:
    """Tell the workers of `launcher_pid` to stop (kind signal: at their next step boundary) or not to start."""
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_json(sweep_dir / MARKER, {"pid": launcher_pid, "kind": kind, "signal": signum})
    except OSError as err:  # called from a signal handler: never raise there
        print(f"warning: cannot write {sweep_dir / MARKER} ({err.strerror}): the sweep's jobs do not learn of the "
              "stop; send the signal again to stop them at once", flush=True)


def read_marker(sweep_dir: Path, kinds: tuple[str, ...] = (SIGNAL, REFUSED)) -> dict[str, Any] | None:
    """The marker this worker's launcher wrote (its pid is our parent's), if of one of `kinds`; a marker another
    process left (a killed launcher's) is ignored."""
    path = sweep_dir / MARKER
    if not path.exists():  # the common case, at every step: one stat
        return None
    try:
        marker = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(marker, dict) or marker.get("pid") != os.getppid() or marker.get("kind") not in kinds:
        return None
    return marker


def remove_marker(sweep_dir: Path) -> None:
    (sweep_dir / MARKER).unlink(missing_ok=True)


def enter_worker(sweep_dir: Path) -> bool:
    """In a worker process, before a job: keep our signal handling for the worker's lifetime (a noted signal, not an
    exception the pool would take for a crash), poll the launcher's marker at step boundaries, and say whether the
    job may start (False: the sweep is stopping)."""
    GUARD.install()
    GUARD.note_only = True

    def launcher_signal() -> int | None:
        marker = read_marker(sweep_dir, (SIGNAL,))
        return int(marker["signal"]) if marker is not None and marker.get("signal") is not None else None

    GUARD.external = launcher_signal
    return not GUARD.requested and read_marker(sweep_dir) is None


def refuse_in_worker(sweep_dir: Path) -> None:
    """A worker's job was refused by the resume check: no further job of this sweep starts."""
    write_marker(sweep_dir, REFUSED, None, os.getppid())


def note_refused() -> None:
    """A job of this process refused the sweep (basic launcher: it ends the command at once)."""
    global _REFUSED_HERE
    _REFUSED_HERE = True


def finish() -> tuple[str, int | None] | None:
    """In the launcher's process, once the sweep returned or raised: put multirun.yaml back when a job refused the
    sweep, remove the marker, and say how the sweep ended: (REFUSED, None), (SIGNAL, signal number) for a parallel
    sweep stopped by a signal, or None."""
    global ACTIVE
    state, ACTIVE = ACTIVE, None
    if state is None:
        return None
    refused = _REFUSED_HERE or _kind(state.sweep_dir) == REFUSED
    if refused and state.multirun_record is not None:
        from altgrad.atomic import write_bytes

        write_bytes(state.sweep_dir / MULTIRUN_RECORD, state.multirun_record)
    if state.parallel:
        remove_marker(state.sweep_dir)
        GUARD.note_only, GUARD.on_signal = False, None
    if refused:
        return REFUSED, None
    if state.parallel and GUARD.signum is not None:
        return SIGNAL, GUARD.signum
    return None


def _kind(sweep_dir: Path) -> str | None:
    try:
        marker = json.loads((sweep_dir / MARKER).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return marker.get("kind") if isinstance(marker, dict) and marker.get("pid") == os.getpid() else None


try:  # Hydra is a dependency of the package; the callback base only exists in Hydra >= 1.1
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover
    _HydraCallback = object  # type: ignore[assignment,misc]


class SweepStop(_HydraCallback):  # type: ignore[misc,valid-type]
    """Hydra callback of every `python -m altgrad.train` (conf/train.yaml): prepares the launcher's process of a
    multirun (see the module docstring). A single run is left alone."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        global ACTIVE
        sweep_dir = Path(str(config.hydra.sweep.dir))
        record = sweep_dir / MULTIRUN_RECORD
        try:
            before = record.read_bytes() if record.is_file() else None
        except OSError:
            before = None
        parallel = parallel_launcher(config.hydra.launcher.get("_target_"))
        ACTIVE = SweepState(sweep_dir, parallel, before)
        if parallel:
            remove_marker(sweep_dir)  # a killed launcher's (its workers are gone: pids differ anyway)
            GUARD.install()
            GUARD.note_only = True
            pid = os.getpid()
            GUARD.on_signal = lambda signum: write_marker(sweep_dir, SIGNAL, signum, pid)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        GUARD.note_only = False  # the pool is done: a signal now stops the command at once
        GUARD.on_signal = None

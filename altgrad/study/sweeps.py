"""Running a stage's sweeps: up to N `python -m altgrad.train -m` processes at once, each into the stage's folder,
stopped with a checkpoint at the end of a time budget or when the driver itself is signalled.

The sweeps run in their own sessions, so a Ctrl-C at the terminal reaches the driver alone, which forwards one
SIGTERM to each running sweep (its running job checkpoints and records `interrupted`) and waits for them; on Linux
a sweep is also sent SIGTERM when the driver dies without that chance (SIGKILL), so no sweep outlives its driver.
"""

from __future__ import annotations

import ctypes
import itertools
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

STOP_GRACE_S = 120.0
"""How long a stopped sweep may take to checkpoint its running job before it is killed."""
POLL_S = 1.0
"""How often the driver looks at its running sweeps when several run at once."""


class DriverInterrupted(Exception):
    """The driver got SIGTERM or SIGINT; its running sweeps were stopped with a checkpoint."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to send this process SIGTERM when its parent (the driver) dies (prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def start(command: Sequence[str], *, cwd: str, env: dict[str, str] | None) -> subprocess.Popen:
    """Start one sweep process in its own session (a terminal's Ctrl-C reaches only the driver)."""
    return subprocess.Popen(list(command), cwd=cwd, env=env, start_new_session=True,
                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)


def stop(running: Sequence[subprocess.Popen], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every running sweep (its running job checkpoints), then wait; kill what outlasts the grace."""
    for proc in running:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    end = time.monotonic() + grace_s
    for proc in running:
        try:
            proc.wait(timeout=max(end - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class SignalGuard:
    """While active, SIGTERM and SIGINT raise DriverInterrupted in the driver (once: a second signal during the
    stop is ignored, so the sweeps' checkpoints are not cut short)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum = signum
            raise DriverInterrupted(signum)

    def __enter__(self) -> SignalGuard:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]


def wait_any(running: Sequence[subprocess.Popen], deadline: float | None) -> None:
    """Block until one of the running sweeps ends or the deadline (time.monotonic) passes."""
    if len(running) == 1:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            running[0].wait(timeout=left)
        except subprocess.TimeoutExpired:
            pass
        return
    while all(p.poll() is None for p in running):
        if deadline is not None and time.monotonic() >= deadline:
            return
        time.sleep(POLL_S)


def run_all(pending: list[list[str]], launch: Callable[[list[str]], subprocess.Popen], *, jobs: int,
            deadline: float | None, on_end: Callable[[subprocess.Popen], None],
            before_start: Callable[[], None]) -> tuple[bool, bool]:
    """Run the pending sweeps, ``jobs`` at a time; returns (a sweep ended with a configuration error (exit 2),
    the deadline passed). A configuration error starts no further sweep; at the deadline, or on any exception
    (DriverInterrupted included), every running sweep is stopped with a checkpoint before this returns/raises."""
    running: list[subprocess.Popen] = []
    config_error = False
    try:
        while True:
            for proc in [p for p in running if p.poll() is not None]:
                running.remove(proc)
                on_end(proc)
                config_error |= proc.returncode == 2
            while pending and len(running) < jobs and not config_error:
                before_start()
                running.append(launch(pending.pop(0)))
            if not running:
                return config_error, False
            if deadline is not None and time.monotonic() >= deadline:
                stop(running)
                for proc in running:
                    on_end(proc)
                return config_error, True
            wait_any(running, deadline)
    except BaseException:
        stop(running)
        for proc in running:
            on_end(proc)
        raise


def split_lists(args: Sequence[str]) -> list[list[str]]:
    """A sweep's command line as one command line per job of its command-line lists (``a=1,2 b=x,y`` → four, in
    Hydra's launch order); values are spelt as Hydra spells them in job dirs (``3e-3`` → ``0.003``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    choices: list[list[str]] = []
    for arg in args:
        override = parser.parse_override(arg) if "=" in arg and not arg.startswith("hydra.") else None
        if override is not None and override.is_discrete_sweep():
            key = arg.split("=", 1)[0]
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            choices.append([arg])
    return [list(combination) for combination in itertools.product(*choices)]


def key_of(override: str) -> str:
    """An override's key without its + / ++ / ~ prefix (``+resume_sweep=true`` → ``resume_sweep``)."""
    return override.split("=", 1)[0].lstrip("+~")


def with_overrides(args: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``args`` with each of ``extra`` replacing the override of the same key (or appended)."""
    keys = {key_of(e) for e in extra}
    return [*(a for a in args if key_of(a) not in keys), *extra]

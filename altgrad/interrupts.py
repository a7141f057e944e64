"""Interrupts as a result: SIGTERM, SIGINT, SIGUSR1 and SIGUSR2 end a run with a checkpoint, not a traceback.

Before training starts (set-up, data, sanity check) a signal stops the run at once: there is no state to save. Once
training runs, the first signal is only noted: `LastCheckpoint` saves `checkpoints/last.ckpt` after the current
optimizer step (weights, optimizer, data position and RNG agree, on-grid weights are back on their grid) and stops
the run before the next batch, once that step's metrics and validation are logged. A second signal stops at once.
`train()` records status `interrupted` with the signal and the step; the command exits 128 + the signal number, as
shells and schedulers expect.

Lightning installs its own SIGTERM handler (which raises mid-validation and is not told about SIGINT/SIGUSR);
`LastCheckpoint` calls `install()` again when training starts, and Lightning restores ours when it tears down.

A sweep whose jobs run in worker processes (`altgrad.sweep.stop`) sets `note_only` in the launcher's process and in
each worker (a signal there is noted: raising would make the process pool kill every worker mid-step), and gives
the workers an `external` request to poll: the launcher's stop marker, read at every step boundary.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = tuple(s for s in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2") if hasattr(signal, s))
log = logging.getLogger(__name__)


class RunInterrupted(BaseException):
    """Raised where a signal has to stop the process at once (a BaseException, like KeyboardInterrupt, so no
    `except Exception` in a library swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal_name(signum)}")
        self.signum = signum


def signal_name(signum: int) -> str:
    """`SIGTERM` for 15, and so on."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_code(signum: int) -> int:
    """What a shell reports for a process ended by `signum`: 128 + its number."""
    return 128 + int(signum)


class InterruptGuard:
    """The process's handlers for SIGNALS: raise at once, or (while `deferring`) note the first signal only."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.deferring = False
        self.note_only = False  # outside training too, note the first signal instead of raising (sweep processes)
        self.on_signal: Callable[[int], None] | None = None  # called with the first signal noted (note_only)
        self.external: Callable[[], int | None] | None = None  # a stop request from elsewhere (a signal number)
        self._previous: dict[int, Any] = {}
        self._first: dict[int, Any] = {}  # the handlers found at the first install, kept after uninstall

    @property
    def requested(self) -> bool:
        """Whether a signal arrived, here or (`external`) at the launcher of this sweep: the run must stop at the next
        step boundary."""
        if self.signum is None and self.external is not None:
            signum = self.external()
            if signum is not None:
                self.signum = signum
                log.warning("the sweep was interrupted by %s: stopping after this step with a checkpoint",
                            signal_name(signum))
        return self.signum is not None

    def install(self) -> bool:
        """Make our handler the one for every signal in SIGNALS; True when none of them was ours before (the
        caller then owns the handlers and `uninstall`s them)."""
        if threading.current_thread() is not threading.main_thread():
            return False  # signal.signal only works in the main thread; a threaded launcher keeps its own handling
        fresh = not self._previous
        for name in SIGNALS:
            signum = getattr(signal, name)
            current = signal.getsignal(signum)
            if current != self._handle:
                self._previous.setdefault(signum, current)
                self._first.setdefault(signum, current)
                signal.signal(signum, self._handle)
        return fresh

    def handler_before(self, signum: int) -> Any:
        """The Python handler a launcher had installed for `signum` before ours (None: a default one). A cluster
        launcher's handler (submitit's requeue, say) gets the signal once the run has saved and stopped."""
        handler = self._first.get(signum)
        if callable(handler) and handler is not signal.default_int_handler:
            return handler
        return None

    def uninstall(self) -> None:
        """Put back the handlers that were there before `install`."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def reset(self) -> None:
        """Forget a signal (a new run in the same process, e.g. the next job of a sweep, starts clean)."""
        self.signum = None
        self.deferring = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if (self.deferring or self.note_only) and self.signum is None:
            self.signum = signum
            if self.deferring:
                log.warning("%s received: stopping after this step with a checkpoint (send it again to stop at once)",
                            signal_name(signum))
            if self.on_signal is not None:
                self.on_signal(signum)
            return
        if self.signum is None:
            self.signum = signum
        raise RunInterrupted(signum)


GUARD = InterruptGuard()

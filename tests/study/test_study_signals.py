"""A signalled driver stops its sweeps with a checkpoint and exits with one line; no sweep outlives its driver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from altgrad.study import sweeps as runner
from altgrad.study.driver import Study
from altgrad.study.plan import load_plan

# a stand-in sweep: on SIGTERM it "checkpoints" (writes a file) and exits 143 like a stopped altgrad sweep
SWEEP = textwrap.dedent("""
    import pathlib, signal, sys, time
    out = pathlib.Path(sys.argv[1])
    def stop(signum, frame):
        (out / ("stopped-" + sys.argv[2])).write_text(str(signum))
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    (out / ("started-" + sys.argv[2])).write_text("")
    time.sleep(60)
""")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_driver_stops_every_running_sweep_once_and_starts_no_more(
        tmp_path: Path, monkeypatch, signum: int) -> None:
    st = Study(load_plan("study_cpu"), tmp_path / "root", tmp_path / "runs", tmp_path / "out")
    st.jobs = 2
    monkeypatch.setattr(st, "launch", lambda stage, args: runner.start(
        [sys.executable, "-c", SWEEP, str(tmp_path), args[0]], cwd=str(tmp_path), env=None))
    monkeypatch.setattr(st, "finished", lambda stage, args: False)
    monkeypatch.setattr(st, "cells", lambda args: [list(args)])
    timer = threading.Timer(3.0, os.kill, (os.getpid(), signum))
    timer.start()
    start = time.monotonic()
    with runner.SignalGuard(), pytest.raises(runner.DriverInterrupted) as stop:
        st.train_all("eval", [["a"], ["b"], ["c"]])
    timer.cancel()
    assert stop.value.signum == signum and time.monotonic() - start < 30
    assert sorted(p.name for p in tmp_path.glob("started-*")) == ["started-a", "started-b"]
    assert {p.name: p.read_text() for p in tmp_path.glob("stopped-*")} == {
        "stopped-a": str(int(signal.SIGTERM)), "stopped-b": str(int(signal.SIGTERM))}  # one SIGTERM each


def test_the_cli_exits_128_plus_the_signal_with_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    from altgrad.study import __main__ as cli

    def interrupted(self, until):
        raise runner.DriverInterrupted(signal.SIGTERM)

    monkeypatch.setattr(Study, "run", interrupted)
    assert cli.main(["study_cpu", "--root", str(tmp_path / "r"), "--records", str(tmp_path / "runs")]) == 143
    assert capsys.readouterr().err == ("error: interrupted by SIGTERM: the running jobs were stopped with a "
                                       "checkpoint; rerun the same command to continue\n")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_sweep_gets_sigterm_when_its_driver_is_killed(tmp_path: Path) -> None:
    driver = textwrap.dedent(f"""
        import sys, time
        from altgrad.study import sweeps
        sweeps.start([sys.executable, "-c", {SWEEP!r}, {str(tmp_path)!r}, "orphan"], cwd={str(tmp_path)!r}, env=None)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", driver])
    deadline = time.monotonic() + 60
    while not (tmp_path / "started-orphan").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    while not (tmp_path / "stopped-orphan").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (tmp_path / "stopped-orphan").read_text() == str(int(signal.SIGTERM))

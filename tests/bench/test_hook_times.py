"""The hook timer (altgrad.bench._hook_times): kinds of step, per-hook summaries, the wrappers' undo, a real job."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from altgrad.bench import _hook_times as ht
from altgrad.module import AltGradModule

from bench_helpers import REPO, TINY


def test_a_step_is_of_the_largest_interval_it_is_a_multiple_of() -> None:
    assert [ht.kind(s, [10, 50]) for s in (1, 9, 10, 20, 49, 50, 100)] == [0, 0, 1, 1, 0, 2, 2]
    assert ht.kind(4, [2, 3]) == 1 and ht.kind(6, [2, 3]) == 2


def test_hooks_called_once_a_step_get_a_median_per_kind() -> None:
    steps = 100
    once = [0.020 if s % 50 == 0 else 0.005 if s % 10 == 0 else 0.001 for s in range(1, steps + 1)]
    record = {"A.on_train_batch_end": once, "Base.on_train_batch_start": [0.0001] * (3 * steps)}
    rows = ht.summarize(record, steps, [10, 50])
    assert [r[0] for r in rows] == ["A.on_train_batch_end", "Base.on_train_batch_start"]  # largest first
    label, per_step, medians, calls = rows[0]
    assert medians == pytest.approx([1.0, 5.0, 20.0]) and calls == steps
    assert per_step == pytest.approx(1000 * sum(once) / steps)
    assert rows[1][2] is None and rows[1][1] == pytest.approx(0.3)  # three calls a step: a total only
    assert "| `A.on_train_batch_end` |" in ht.table(rows, [10, 50])
    with pytest.raises(ValueError, match="steps=0"):
        ht.summarize(record, 0, [10])


def test_the_wrappers_time_each_call_and_come_off() -> None:
    class Probe:
        def on_train_batch_end(self, x: int) -> int:
            return x + 1

        def helper(self) -> None:  # not a hook: left alone
            pass

    original, clipping = Probe.on_train_batch_end, AltGradModule.configure_gradient_clipping
    record: dict[str, list[float]] = {"Probe.on_train_batch_end": []}
    undo = ht.install(record, [Probe])
    assert Probe().on_train_batch_end(1) == 2 and len(record["Probe.on_train_batch_end"]) == 1
    assert AltGradModule.configure_gradient_clipping is not clipping
    undo()
    assert Probe.on_train_batch_end is original and AltGradModule.configure_gradient_clipping is clipping


def test_bad_intervals_are_one_line_and_exit_2(tmp_path, capsys) -> None:
    assert ht.main([str(tmp_path / "o.json"), "--every", "ten"]) == 2
    assert "--every 'ten' is not valid" in capsys.readouterr().err
    assert ht.main([str(tmp_path / "missing" / "o.json")]) == 2
    assert "no folder" in capsys.readouterr().err


def test_a_real_job_through_the_entry_point(tmp_path) -> None:
    out = tmp_path / "hooks.json"
    cmd = [sys.executable, "-m", "altgrad.bench._hook_times", str(out), "--every", "2", "--",
           *TINY, "trainer.max_steps=4", "format=e4m3", "logger=csv", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert len(got["step_seconds"]) == 4
    assert len(got["hooks"]["FlipCallback.on_train_batch_end"]) == 4
    assert len(got["hooks"]["module.configure_gradient_clipping"]) == 4
    assert "| `FlipCallback.on_train_batch_end` |" in proc.stdout

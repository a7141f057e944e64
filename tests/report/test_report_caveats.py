"""The report's caveats are computed from the runs: scale, hardware, whether the loss still fell at the horizon,
a longer run of the same model, and the tuning seeds."""

from __future__ import annotations

from pathlib import Path

from altgrad.report.caveats import STILL_LEARNING, caveat_lines
from altgrad.report.load import Job

CONFIG = {"model": {"n_layer": 4, "n_embd": 128, "block_size": 128},
          "trainer": {"accelerator": "cpu", "precision": "32-true"}}


def job(seed: int, curve: list[tuple[int, float]], *, fmt: str = "e4m3", optimizer: str = "adamw",
        lr: float = 3e-3, steps: int | None = None) -> Job:
    summary = {"steps": steps or curve[-1][0], "seed": seed, "format": fmt, "optimizer": optimizer,
               "optimizer_label": optimizer, "model": "nano", "data": "embedded", "lr": lr, "n_params": 820480,
               "tokens_seen": 1228800, "config": CONFIG, "status": "completed"}
    return Job(Path(f"/x/{fmt}-{optimizer}-{seed}"), f"{seed}", "completed", summary, (), tuple(curve))


def falling(end: float, last_quarter_fall: float, steps: int = 400) -> list[tuple[int, float]]:
    """A curve every 100 steps whose loss at 3/4 of ``steps`` is (1 + fall) × its final value."""
    at_3q = end * (1 + last_quarter_fall)
    return [(0, 5.5), (steps // 2, at_3q * 1.2), (steps * 3 // 4, at_3q), (steps, end)]


def test_runs_still_falling_at_the_horizon_are_said_to_be_still_learning() -> None:
    scope = [job(s, falling(1.0, 0.10)) for s in (1, 2, 3)]
    lines = caveat_lines(scope, scope)
    horizon = next(line for line in lines if line.startswith("Horizon"))
    assert "H = 400 steps" in horizon and "still learning" in horizon and "10.0 %" in horizon


def test_flat_runs_are_said_to_be_close_to_settled() -> None:
    scope = [job(s, falling(1.0, STILL_LEARNING / 3)) for s in (1, 2)]
    horizon = next(line for line in caveat_lines(scope, scope) if line.startswith("Horizon"))
    assert "close to settled" in horizon and "still learning" not in horizon


def test_scale_hardware_longer_run_and_tuning_seeds_are_stated() -> None:
    scope = [job(s, falling(1.0, 0.10)) for s in (1, 2)]
    pilot = job(101, [(0, 5.5), (400, 0.8), (1600, 0.2)], fmt="fp32")
    tuning = [job(101, falling(1.1, 0.1), lr=lr) for lr in (1e-3, 1e-2)]
    lines = caveat_lines([*scope, pilot, *tuning], scope)
    text = "\n".join(lines)
    assert "one model, nano (0.82 M parameters: 4 layers, width 128, context 128)" in text
    assert "Hardware: cpu, precision 32-true" in text
    assert "validation loss 0.800 at step 400, 0.200 at step 1600 (75 % lower)" in text
    assert "picked on seed 101 (2 tuning runs), disjoint from the 2 evaluation seeds" in text


def test_without_a_declared_study_there_is_no_tuning_line() -> None:
    jobs = [job(s, falling(1.0, 0.1)) for s in (1, 2)] + [job(101, falling(1.0, 0.1))]
    assert not any(line.startswith("Tuning") for line in caveat_lines(jobs))
    assert caveat_lines([]) == []

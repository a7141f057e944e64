"""The job bench (`python -m altgrad.bench job`): whole jobs through the real entry point, and the run's own timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from altgrad.bench.job import JOBS, Sample, folder, table, verdict
from altgrad.bench.job import Results as JobResults
from altgrad.module import JobClock, process_start_unix
from bench_helpers import REPO, TINY

TINY_SET = [a for o in [*TINY, "logger=csv"] for a in ("--set", o)]


def bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "altgrad.bench", "job", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env=env or dict(os.environ))


def test_steady_throughput_is_the_second_half_of_the_steps() -> None:
    clock = JobClock()
    clock.steps = [(10.0, 100), (1.0, 100), (0.5, 100), (0.5, 300)]  # the first steps (compiles) are left out
    assert clock.steady_tokens_per_second() == 400 / 1.0
    clock.steps = [(3.0, 64)]
    assert clock.steady_tokens_per_second() is None  # one step: no steady state to speak of
    clock.steps = [(2.0, 64), (0.25, 64), (0.25, 64)]  # odd: the later half includes the middle step
    assert clock.steady_tokens_per_second() == 128 / 0.5


def test_timing_summary_counts_from_the_process_start() -> None:
    clock = JobClock()
    start = clock.process_start
    assert start is not None and start <= time.time()  # (Linux: /proc)
    assert start == process_start_unix()
    clock.fit_start, clock.first_step_done, clock.first_step_seconds = start + 2.0, start + 5.0, 1.5
    clock.steps, clock.validation_seconds = [(1.5, 64), (0.5, 64)], 0.75
    timing = clock.summary(fit_end=start + 9.0)
    assert timing["startup_seconds"] == pytest.approx(2.0)
    assert timing["warmup_seconds"] == pytest.approx(5.0)
    assert timing["fit_end_seconds"] == pytest.approx(9.0)
    assert timing["first_step_seconds"] == 1.5 and timing["steps_seconds"] == 2.0
    assert timing["validation_seconds"] == 0.75 and timing["steady_tokens_per_second"] == 128.0


def test_verdicts_and_folder_names() -> None:
    assert verdict("wall<=1.15", 1.149, None) == "wall<=1.15: met"
    assert verdict("wall<=1.15", 1.151, None) == "wall<=1.15: missed"
    assert verdict("tps>=0.95", None, 0.9) == "tps>=0.95: missed"
    assert verdict("tps>=0.95", None, None) == "tps>=0.95: unmeasured"
    assert verdict(None, 1.0, 1.0) == ""
    assert folder("e4m3 sweep job 2 (joblib)") == "e4m3_sweep_job_2__joblib"


def test_table_ratios_are_per_round_pairs() -> None:
    def s(wall: float, tps: float) -> Sample:
        return Sample(wall, 1.0, tps, 0.5, 0.1, wall / 2, 0.2, 0.3)

    results = JobResults(samples={"fp32": [s(10, 100), s(20, 100), s(30, 100)],
                                  "e4m3": [s(11, 90), s(30, 80), s(33, 90)]},
                         ratios={"fp32": [1.0, 1.0, 1.0], "e4m3": [1.1, 1.5, 1.1]})
    text = table(results, [j for j in JOBS if j.name in ("fp32", "e4m3")], rounds_done=3)
    e4m3 = next(line for line in text.splitlines() if line.startswith("e4m3 "))
    # median wall 30.0 (spread 11.0–33.0), ratio median of the pairs 1.100, tokens/s 90 = 0.900 of fp32's
    assert e4m3.split()[1:8] == ["30.0", "11.0–33.0", "1.100", "1.0", "+0.0", "90", "0.900"]
    assert e4m3.endswith("wall<=1.15: met")


def test_bench_runs_whole_jobs_and_prints_its_table(tmp_path: Path) -> None:
    env = dict(os.environ, ALTGRAD_COMPILE="0")  # eager quantizers: the table, not the compiler, is under test
    md, keep = tmp_path / "job.md", tmp_path / "runs"
    proc = bench("--rounds", "1", "--steps", "4", "--only", "plain PyTorch loop,e4m3 sweep job 2 (basic)",
                 "--markdown", str(md), "--keep", str(keep), *TINY_SET, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    overview = proc.stdout.split("Whole jobs")[-1].split("Phases")[0]
    rows = {line.split("  ")[0]: line for line in overview.splitlines()}
    for name in ("fp32", "plain PyTorch loop", "e4m3 sweep job 2 (basic)"):
        assert name in rows, proc.stdout
    assert " 1.000 " in rows["fp32"]
    assert "× plain loop tok/s" in rows["fp32"]
    text = md.read_text()
    assert "| e4m3 sweep job 2 (basic) |" in text and "| configuration | start-up s |" in text
    # the run recorded its own phases, in order, counted from its process start
    timing = json.loads((keep / "round0" / "fp32" / "summary.json").read_text())["timing"]
    assert timing["process_start_unix"] <= timing["first_step_unix"] <= timing["fit_end_unix"]
    assert 0 < timing["startup_seconds"] < timing["warmup_seconds"] < timing["fit_end_seconds"]
    assert timing["steps_seconds"] > 0 and timing["validation_seconds"] > 0
    assert timing["steady_tokens_per_second"] > 0
    ref = json.loads((keep / "round0" / "plain_PyTorch_loop" / "summary.json").read_text())
    assert ref["steps"] == 4 and ref["final_val_loss"] < ref["initial_val_loss"]
    sweep = keep / "round0" / "e4m3_sweep_job_2__basic"
    assert json.loads((sweep / "1" / "summary.json").read_text())["seed"] == 1338


def test_bench_refuses_an_unknown_configuration() -> None:
    proc = bench("--only", "e9m9")
    assert proc.returncode != 0
    assert "error: --only 'e9m9': no such configuration; valid: fp32," in proc.stderr
    proc = bench("--set", "trainer.max_steps=3")
    assert proc.returncode != 0 and "use --steps" in proc.stderr


def test_cpu_preset_refuses_compile_with_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ALTGRAD_CPU_COMPILE"}
    proc = subprocess.run([sys.executable, "-m", "altgrad.train", "trainer.compile=true",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: trainer.compile=true is off on the CPU"), proc.stderr
    assert "valid: trainer.compile=false, or trainer=gpu" in lines[0]
    assert not (tmp_path / "run").exists()  # refused before anything was written

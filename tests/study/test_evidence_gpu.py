"""make evidence-gpu's parts on the CPU: the offline token preparation, the choice of the CPU study's best and worst
formats from its records, and (slow) the whole command at a tiny size on a local text file, in time-budgeted chunks
that stop with a checkpoint and resume until it is done."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from altgrad.study.driver import best_and_worst

REPO = Path(__file__).resolve().parents[2]
ENDPOINT = {"metric": "final_val_loss", "horizon": 5, "primary": 0, "formats": ["e4m3", "e5m2", "e7m0"],
            "contrasts": [{"treatment": "manifold[update]", "reference": "adamw"},
                          {"treatment": "manifold[update]", "reference": "relative"}],
            "storage": "fp32 master", "correction": "holm", "alpha": 0.05, "tie_margin": 0.02,
            "pooled_variance": False, "failure_value": "initial_val_loss"}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    from altgrad.data.corpus import iter_documents

    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(itertools.islice(iter_documents(0, 60_000), 1000)))
    return {**os.environ, "ALTGRAD_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "offline",
            "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HYDRA_FULL_ERROR": "0", "OMP_NUM_THREADS": "1",
            "ALTGRAD_EVIDENCE_TEXT": str(text)}


def run(module: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_prepare_writes_the_token_cache_a_run_then_reads(env: dict[str, str], tmp_path: Path) -> None:
    done = run("altgrad.data.prepare", ["experiment=evidence_gpu_tune_debug"], env)
    assert done.returncode == 0, done.stderr
    cached = sorted((tmp_path / "cache" / "tokens").glob("local-bytes-*.bin"))
    assert len(cached) == 1 and f"tokens: {cached[0]} (" in done.stdout
    meta = json.loads(cached[0].with_suffix(".json").read_text())
    assert meta["vocab_size"] == 257 and meta["n_tokens"] == cached[0].stat().st_size // 2 > 60_000
    before = cached[0].stat().st_mtime_ns
    assert run("altgrad.data.prepare", ["experiment=evidence_gpu_tune_debug"], env).returncode == 0
    assert cached[0].stat().st_mtime_ns == before  # a second prepare finds the cache and leaves it


def test_prepare_reports_a_bad_override_in_one_line(env: dict[str, str]) -> None:
    done = run("altgrad.data.prepare", ["experiment=evidence_gpu_tune_debug", "data.tokenizer=nonsense"], env)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith("error: data.tokenizer='nonsense' is not valid; valid: bytes")


def write_eval(root: Path, deltas: dict[str, float], seeds=(1, 2, 3)) -> None:
    """Evaluation records of a declared study whose manifold[update] − adamw is ``deltas[format]`` per seed."""
    labels = {"adamw": "adamw", "manifold": "manifold[update]", "relative": "relative"}
    for fmt, delta in deltas.items():
        for opt, seed in itertools.product(labels, seeds):
            loss = 2.0 + 0.01 * seed + (delta + 0.001 * seed if opt == "manifold" else 0.0)
            job = root / f"format={fmt},optimizer={opt},seed={seed}"
            (job / ".hydra").mkdir(parents=True)
            (job / ".hydra" / "overrides.yaml").write_text(f"- format={fmt}\n- optimizer={opt}\n- seed={seed}\n")
            (job / "summary.json").write_text(json.dumps({
                "status": "completed", "steps": 5, "final_val_loss": loss, "best_val_loss": loss,
                "initial_val_loss": 5.5, "format": fmt, "optimizer": opt, "optimizer_label": labels[opt],
                "seed": seed, "lr": 1.0, "master": "fp32", "experiment": "s",
                "config": {"endpoint": ENDPOINT, "experiment_name": "s"}}))


def test_best_and_worst_by_the_primary_contrast(tmp_path: Path) -> None:
    write_eval(tmp_path / "eval", {"e4m3": -0.05, "e5m2": -0.2, "e7m0": 0.1})
    assert best_and_worst(tmp_path / "eval") == ("e5m2", "e7m0")


def test_best_and_worst_refuses_an_unfinished_study(tmp_path: Path) -> None:
    write_eval(tmp_path / "eval", {"e4m3": -0.05, "e5m2": -0.2})
    with pytest.raises(ValueError, match="no runs of e7m0 yet; finish that study or pass --formats A,B"):
        best_and_worst(tmp_path / "eval")
    with pytest.raises(ValueError, match="does not exist: run that study first"):
        best_and_worst(tmp_path / "nowhere")


@pytest.mark.slow  # ≈ 40 five-step jobs over several budgeted rounds: 1-3 minutes on 2 cores
def test_the_command_runs_in_budgeted_chunks_to_the_end(env: dict[str, str], tmp_path: Path) -> None:
    args = ["evidence_gpu_debug", "--formats", "e4m3", "--root", str(tmp_path / "root"),
            "--records", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--budget-s", "75"]
    assert run("altgrad.data.prepare", ["experiment=evidence_gpu_tune_debug"], env).returncode == 0
    codes, interrupted = [], False
    for _ in range(12):
        done = run("altgrad.study", args, env)
        codes.append(done.returncode)
        interrupted |= "the running jobs were stopped with a checkpoint" in done.stderr
        if done.returncode != 3:
            break
    assert codes[-1] == 0, (codes, done.stderr[-2000:])
    assert "[study] formats: bf16_ref, e4m3" in done.stdout
    evaluation = sorted(p.name for p in (tmp_path / "runs" / "eval").iterdir())
    assert evaluation == [f"format={f},optimizer={o},seed={s}" for f in ("bf16_ref", "e4m3")
                          for o in ("adamw", "manifold", "relative") for s in (1, 2)]
    for stage in ("tune", "tune_arms", "eval"):
        for record in (tmp_path / "runs" / stage).iterdir():
            summary = json.loads((record / "summary.json").read_text())
            assert summary["status"] in ("completed", "diverged") and summary["steps"] <= 5, record
            assert summary["config"]["model"]["n_layer"] == 1 and summary["config"]["data"]["tokenizer"] == "bytes"
    assert (tmp_path / "out" / "report.md").is_file()
    if len(codes) > 1:  # a chunk ended by the budget: its job resumed from the checkpoint it saved
        assert interrupted or all(c == 3 for c in codes[:-1])


def test_the_gpu_experiments_plan_their_grids() -> None:
    from altgrad.sweep.plan import plan

    formats = "format=bf16_ref,e4m3,e7m0"  # what the driver adds: the reference + the CPU study's best and worst
    assert len(plan(["experiment=evidence_gpu_tune", formats])) == 3 * 3  # AdamW: 3 lrs × 3 formats, seed 101
    arms = plan(["experiment=evidence_gpu_tune_arms", formats, "optimizer=manifold", "optimizer.lr=0.3,1.0,3.0"])
    assert len(arms) == 3 * 3 and all(j.subdir.endswith("seed=101") for j in arms)
    evaluation = plan(["experiment=evidence_gpu", formats])
    assert len(evaluation) == 3 * 3 * 3 and {j.subdir.rsplit("=", 1)[1] for j in evaluation} == {"1", "2", "3"}

"""Diagnostics end-to-end through the real entry point (`python -m altgrad.train`): a diverging E7M0 run and an
E4M3 run with callbacks=full. Each is a subprocess of a few minutes on a shared CPU, hence `slow`."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
    "data.batch_size=4", "data.corpus_chars=200000", "data.val_batches=2",
    "trainer.max_steps=20", "trainer.val_check_interval=10", "trainer.checkpoint_every_n_steps=5",
    "trainer.log_every_n_steps=5", "trainer.sample_tokens=0", "trainer.initial_validation=false",
]
LAYERS = ["transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj", "transformer.h.0.mlp.c_fc",
          "transformer.h.0.mlp.c_proj", "transformer.h.1.attn.c_attn", "transformer.h.1.attn.c_proj",
          "transformer.h.1.mlp.c_fc", "transformer.h.1.mlp.c_proj", "lm_head"]


def run_train(run_dir: Path, cache: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ALTGRAD_CACHE": str(cache), "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "altgrad.train", *TINY, *overrides, f"hydra.run.dir={run_dir}"]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("token-cache")


@pytest.mark.slow
def test_a_diverging_e7m0_run_stops_cleanly_with_a_cause_and_a_usable_checkpoint(tmp_path, cache):
    run_dir = tmp_path / "e7m0"
    proc = run_train(run_dir, cache, "format=e7m0", "quant.master=none", "optimizer.lr=1e4", "logger=csv")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "diverged"
    assert isinstance(summary["diverged_at_step"], int) and summary["diverged_at_step"] < 20
    assert summary["divergence_cause"]
    assert summary["steps"] == summary["diverged_at_step"] + 1  # stopped right after the bad step
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)  # loads: usable
    assert ckpt["global_step"] <= summary["steps"]
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())


@pytest.mark.slow
def test_an_e4m3_run_with_callbacks_full_logs_every_metric_name(tmp_path, cache):
    run_dir = tmp_path / "full"
    proc = run_train(run_dir, cache, "format=e4m3", "callbacks=full", "logger=default")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(run_dir / "metrics.csv") as f:
        columns = set(next(csv.reader(f)))
    expected = {"train/loss", "val/loss", "val/ppl", "lr", "train/tokens_per_s"}
    for layer in LAYERS:
        expected |= {f"stability/{layer}/{role}/{stat}" for role in ("weight", "input", "grad")
                     for stat in ("frac_saturated", "frac_zero", "frac_subnormal", "nonfinite", "amax", "scale")}
        expected |= {f"stability/{layer}/weight/range_use", f"act/{layer}/input/kurtosis",
                     f"act/{layer}/input/range_use", f"grads/{layer}/weight/norm",
                     f"grads/{layer}/weight/zero_update_frac", f"gradfid/{layer}/grad/cosine",
                     f"gradfid/{layer}/grad/snr_db", f"bits/{layer}/weight/effective_bits",
                     f"bits/{layer}/weight/grad_stiffness_corr", f"rank/{layer}/weight/stable_rank_rel",
                     f"rank/{layer}/weight/eff_rank_rel"}
        expected |= {f"flips/{layer}/weight/{m}" for m in ("flip_rate", "stall_ratio", "oscillation_rate",
                                                           "descent_cos")}
        expected |= {f"bits/{layer}/weight/log2_stiffness_{s}" for s in ("mean", "std", "min", "max")}
    for i in range(2):
        expected |= {f"act/transformer.h.{i}/output/kurtosis", f"act/transformer.h.{i}.mlp.c_fc/output/dead_frac"}
        expected |= {f"attn/transformer.h.{i}.attn/head{k}/entropy" for k in range(2)}
    assert expected <= columns, sorted(expected - columns)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    diag = summary["diagnostics"]
    for key in ("mean_stall_ratio", "final_flip_rate", "mean_oscillation_rate", "min_grad_cosine",
                "mean_effective_bits", "max_kurtosis", "min_stable_rank_rel", "min_attn_entropy"):
        assert isinstance(diag.get(key), float), key
    assert 0.9 < diag["min_grad_cosine"] <= 1.0
    assert 0.0 < diag["mean_effective_bits"] <= 8.0
    assert list((run_dir / "wandb").glob("offline-run-*")), "the W&B offline run holds histograms and tables"


def metric_rows(run_dir: Path) -> list[dict[str, str]]:
    """metrics.csv without the columns that measure time."""
    with open(run_dir / "metrics.csv") as f:
        return [{k: v for k, v in row.items() if "tokens_per_s" not in k} for row in csv.DictReader(f)]


@pytest.mark.slow
def test_statistics_on_demand_log_exactly_what_statistics_on_every_call_log(tmp_path, cache):
    """quant.stats=demand (the default) against quant.stats=always, every consumer of the statistics on."""
    consumers = ["format=e4m3", "logger=csv", "callbacks.fallback.enabled=true", "callbacks.range_clip.enabled=true",
                 "callbacks.fallback.check_every_n_steps=3"]
    runs = {}
    for stats in ("always", "demand"):
        run_dir = tmp_path / stats
        proc = run_train(run_dir, cache, *consumers, f"quant.stats={stats}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[stats] = run_dir
    rows = metric_rows(runs["always"])
    assert rows == metric_rows(runs["demand"])
    stability = [r for r in rows if r.get(f"stability/{LAYERS[0]}/input/amax")]
    assert [int(r["step"]) for r in stability] == [5, 10, 15, 20]  # every trainer.log_every_n_steps
    assert any(r.get(f"flips/{LAYERS[0]}/weight/flip_rate") for r in rows)
    assert any(r.get(f"clip/{LAYERS[0]}/grad/clipped") for r in rows)
    summaries = {k: json.loads((d / "summary.json").read_text()) for k, d in runs.items()}
    for key in ("status", "steps", "final_val_loss", "diagnostics", "fallbacks"):
        assert summaries["always"][key] == summaries["demand"][key], key
    assert summaries["demand"]["config"]["quant"]["stats"] == "demand"


def test_the_step_metrics_are_logged_at_every_logging_step_and_only_there(tmp_path, cache):
    """train/loss, lr and train/tokens_per_s reach metrics.csv at steps n·log_every_n_steps − 1 (Lightning's step
    index), each such step once: the module hands them to ``self.log`` only on those steps, which are the only ones
    Lightning writes. With trainer.profiler=simple the run dir holds Lightning's profile of every hook."""
    run_dir = tmp_path / "cadence"
    proc = run_train(run_dir, cache, "format=e4m3", "logger=csv", "trainer.max_steps=17",
                     "trainer.log_every_n_steps=4", "trainer.profiler=simple")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    for key in ("train/loss", "lr", "train/tokens_per_s"):
        steps = [int(r["step"]) for r in rows if r.get(key)]
        assert steps == [3, 7, 11, 15], (key, steps)
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert all(0.0 < v < 10.0 for v in losses)
    profile = (run_dir / "fit-profile.txt").read_text()
    assert "[Callback]FlipCallback.on_train_batch_end" in profile and "run_training_batch" in profile


def test_the_pytorch_profiler_records_mid_run_steps_and_the_run_completes(tmp_path, cache):
    """trainer.profiler=pytorch: torch.profiler's operator table of 20 steps from mid-run in fit-profile.txt, and a
    closing validation off the validation cadence (step 45 of 10-step intervals) still runs; with a peak the summary
    gives the steady MFU beside the whole-run one, in the ratio of their throughputs."""
    run_dir = tmp_path / "torch-profile"
    proc = run_train(run_dir, cache, "format=e4m3", "logger=csv", "trainer.max_steps=45", "trainer.peak_flops=1e12",
                     "trainer.profiler=pytorch", "trainer.sample_tokens=5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    profile = (run_dir / "fit-profile.txt").read_text()
    assert "ProfilerStep*" in profile and "aten::mm" in profile
    calls = next(line for line in profile.splitlines() if line.strip().startswith("ProfilerStep*")).split()[-1]
    assert calls == "20"
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "completed" and s["final_val_step"] == 45 and s["sample"]
    steady = s["timing"]["steady_tokens_per_second"]
    assert s["steady_mfu"] == pytest.approx(s["mfu"] * steady / s["tokens_per_second"], rel=1e-9)
    spread, timing = s["timing"]["steady_step_seconds"], s["timing"]
    assert 0 < spread["median"] <= spread["p90"] <= spread["max"] <= timing["steps_seconds"]
    assert 0 <= timing["gc_seconds"] < timing["fit_end_seconds"] and len(timing["gc_collections"]) == 3
    assert 0 <= timing["steady_gc_seconds"] <= timing["gc_seconds"]


def test_the_step_profile_times_every_hook_over_its_window(tmp_path, cache):
    """bench.step_profile.StepProfile as a run adds it: steps [5, 9) profiled through the real entry point, every
    overriding hook a range with one call a step, per-step counts written; a window the run ends inside keeps what
    it profiled (steps 10 and 11 of a 12-step run)."""
    cb = "+callbacks.step_profile"
    run_dir = tmp_path / "step-profile"
    proc = run_train(run_dir, cache, "format=e4m3", "logger=csv", "trainer.max_steps=12", "trainer.sample_tokens=0",
                     f"{cb}._target_=altgrad.bench.step_profile.StepProfile", f"{cb}.start=5", f"{cb}.steps=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads((run_dir / "step-profile" / "step-profile.json").read_text())
    assert got["steps"] == 4 and got["wall_ms_per_step"] > 0
    assert set(got["per_step"]) >= {"cudaStreamSynchronize", "aten::_local_scalar_dense"}
    hooks = got["hooks"]
    for name in ("hook:FlipCallback.on_train_batch_end", "hook:FlipCallback.on_before_optimizer_step",
                 "hook:module.training_step (forward)", "hook:strategy.backward"):
        assert hooks[name]["calls_per_step"] == 1.0 and hooks[name]["host_ms_per_step"] > 0, name
    forward_and_backward = (hooks["hook:module.training_step (forward)"]["host_ms_per_step"]
                            + hooks["hook:strategy.backward"]["host_ms_per_step"])
    assert forward_and_backward < got["wall_ms_per_step"]
    assert "hook:FlipCallback.on_train_batch_end" in (run_dir / "step-profile" / "hooks.txt").read_text()
    assert (run_dir / "step-profile" / "host_ops.txt").is_file()
    ended = tmp_path / "ended-inside"
    proc = run_train(ended, cache, "format=e4m3", "logger=csv", "trainer.max_steps=12", "trainer.sample_tokens=0",
                     f"{cb}._target_=altgrad.bench.step_profile.StepProfile", f"{cb}.start=10", f"{cb}.steps=50")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((ended / "step-profile" / "step-profile.json").read_text())["steps"] == 2

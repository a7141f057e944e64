"""End-to-end through the real entry point: per-layer quantization, layer_map.json, storage policy, fair ablations."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from altgrad.quant import QuantSpec

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
    "data.batch_size=4", "data.corpus_chars=200000", "data.val_batches=2",
    "trainer.max_steps=20", "trainer.val_check_interval=10", "trainer.checkpoint_every_n_steps=10",
    "trainer.log_every_n_steps=5", "trainer.sample_tokens=0", "trainer.initial_validation=false",
    "logger=csv", "callbacks=none",
]


def run_train(run_dir: Path, *overrides: str, cache: Path) -> subprocess.CompletedProcess:
    # the path `make train` takes (quant.kernel=auto: the native CPU kernel, no compile)
    env = {**os.environ, "ALTGRAD_CACHE": str(cache), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "altgrad.train", *TINY, *overrides, f"hydra.run.dir={run_dir}"]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("token-cache")


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def formats_of(layer_map: dict, name: str) -> tuple:
    roles = layer_map[name]
    return tuple(None if roles[r] is None else roles[r]["format"]["name"] for r in ("weight", "input", "grad"))


CASES = {
    "e4m3": (["format=e4m3"], {"transformer.h.0.attn.c_attn": ("e4m3", "e4m3", "e5m2"),
                               "lm_head": ("e4m3", "e4m3", "e5m2")}),
    "e7m0_attn_bf16": (["format=e7m0", "layer_map=attn_bf16"],
                       {"transformer.h.1.attn.c_proj": ("bf16", "bf16", "bf16"),
                        "transformer.h.1.mlp.c_fc": ("e7m0", "e7m0", "e5m2")}),
    "cli_rule": (["format=e4m3", '+layer_map.rules=[{match: "*.mlp.*", weight: e7m0, input: e5m2}]'],
                 {"transformer.h.0.mlp.c_proj": ("e7m0", "e5m2", "e5m2"),
                  "transformer.h.0.attn.c_attn": ("e4m3", "e4m3", "e5m2")}),
}


@pytest.fixture(scope="module")
def case_runs(tmp_path_factory, cache) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """Each CASES run once for the module (a subprocess run costs seconds of imports on a 2-core machine)."""
    runs = {}
    for case, (overrides, _) in CASES.items():
        run_dir = tmp_path_factory.mktemp(case)
        runs[case] = (run_dir, run_train(run_dir, *overrides, cache=cache))
    return runs


@pytest.mark.parametrize("case", sorted(CASES))
def test_quantized_run_writes_layer_map_and_trains(case, case_runs):
    run_dir, proc = case_runs[case]
    assert proc.returncode == 0, proc.stderr[-3000:]
    layer_map = json.loads((run_dir / "layer_map.json").read_text())
    assert len(layer_map) == 9  # 4 Linears per block x 2 + lm_head
    for name, formats in CASES[case][1].items():
        assert formats_of(layer_map, name) == formats
    QuantSpec.from_dict(layer_map["lm_head"]["weight"])  # the JSON round-trips into a spec
    assert layer_map["lm_head"]["tied"] is True
    summary = summary_of(run_dir)
    assert summary["status"] in {"completed", "diverged"}
    if summary["status"] == "completed":
        assert math.isfinite(summary["final_val_loss"])
    assert proc.stdout.lower().count("layer precision") == 1  # the table is shown once, through the logger


def test_runs_differing_only_in_format_share_init_and_batches(case_runs, cache, tmp_path):
    fingerprints = [summary_of(case_runs[c][0])["fingerprint"] for c in ("e4m3", "e7m0_attn_bf16")]
    assert fingerprints[0]["init_params"] == fingerprints[1]["init_params"]
    assert fingerprints[0]["batches"] == fingerprints[1]["batches"]
    assert len(fingerprints[0]["batches"]) == 64
    # and the fingerprint does see a different seed
    other = run_train(tmp_path, "format=e4m3", "seed=2", "trainer.max_steps=4", cache=cache)
    assert other.returncode == 0, other.stderr[-3000:]
    seed2 = summary_of(tmp_path)["fingerprint"]
    assert seed2["init_params"] != fingerprints[0]["init_params"] and seed2["batches"] != fingerprints[0]["batches"]


def test_master_none_checkpoint_weights_are_on_the_grid(tmp_path, cache):
    proc = run_train(tmp_path, "format=e5m2", "quant.master=none", "quant.storage_rounding=stochastic",
                     cache=cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    layer_map = json.loads((tmp_path / "layer_map.json").read_text())
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu")["state_dict"]
    from altgrad.quant import quantize

    checked = 0
    for name, roles in layer_map.items():
        if roles["weight"] is None or roles["tied"]:
            continue
        spec = QuantSpec.from_dict(roles["weight"])
        w = state[f"model.{name}.weight"]
        # tensor scaling with a power-of-two scale: the grid at w is {v / s} with s from w's own amax
        amax = w.abs().max()
        s = torch.exp2(torch.floor(torch.log2(torch.tensor(spec.format.max) / amax)))
        assert torch.equal(quantize(w * s, spec.format) / s, w), name
        checked += 1
    assert checked == 8


def test_unmatched_rule_fails_cleanly(tmp_path, cache):
    proc = run_train(tmp_path, "format=e4m3", '+layer_map.rules=[{match: "*.ffn.*", weight: e7m0}]', cache=cache)
    assert proc.returncode != 0
    assert "matches no Linear" in proc.stderr and "transformer.h.0.mlp.c_fc" in proc.stderr
    assert not (tmp_path / "summary.json").exists() or summary_of(tmp_path)["status"] == "failed"

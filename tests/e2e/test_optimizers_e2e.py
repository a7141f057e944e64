"""Every optimizer through the real entry point on a quantized model (one Hydra multirun, so imports happen once)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
    "data.batch_size=4", "data.corpus_chars=200000", "data.val_batches=2",
    "trainer.max_steps=20", "trainer.val_check_interval=10", "trainer.checkpoint_every_n_steps=20",
    "trainer.log_every_n_steps=5", "trainer.sample_tokens=0", "trainer.initial_validation=false",
    "logger=csv", "callbacks=none",
]
OPTIMIZERS = ("sgd", "manifold", "manifold_grad", "madam", "grid")


@pytest.mark.slow  # ≈80 s of CPU: `make test-slow`; the optimizers' numerics are in tests/optim
def test_every_optimizer_trains_e7m0_weights_stored_on_the_grid(tmp_path):
    env = {**os.environ, "ALTGRAD_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "offline",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "altgrad.train", "-m", *TINY, "format=e7m0", "quant.master=none",
           f"optimizer={','.join(OPTIMIZERS)}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = {json.loads(p.read_text())["optimizer"]: json.loads(p.read_text())
                 for p in (tmp_path / "sweep").glob("*/summary.json")}
    assert set(summaries) == set(OPTIMIZERS)
    for name, summary in summaries.items():
        assert summary["steps"] == 20, name
        assert summary["status"] in {"completed", "diverged"}, (name, summary.get("error"))
        if summary["status"] == "completed":
            assert math.isfinite(summary["final_val_loss"]), name
        else:
            assert summary["diverged_at_step"] is not None and summary["divergence_cause"], name
        groups = summary["optimizer_groups"]
        if name == "sgd":
            assert groups["plain_params"] == []  # torch's SGD: one rule for everything
        else:
            # unquantized tensors (position embedding, LayerNorm gains) go to the plain AdamW group
            assert "transformer.wpe.weight" in groups["plain_params"] and groups["rule_tensors"] >= 8, name
    assert summaries["manifold"]["optimizer_label"] == "manifold[update]"
    assert summaries["manifold_grad"]["optimizer_label"] == "manifold[grad]"

"""Shared set-up for the bench tests: an isolated, offline environment and a tiny-model override set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A model and data small enough that a subprocess run is dominated by Python start-up, not training.
TINY = [
    "model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
    "data.batch_size=4", "data.corpus_chars=200000", "data.val_batches=2",
    "trainer.val_check_interval=4", "trainer.log_every_n_steps=1", "trainer.sample_tokens=0",
    "schedule.warmup_steps=2",
]


@pytest.fixture(scope="session", autouse=True)
def offline_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """No network, no writes outside pytest's temp dirs: W&B offline and silent, HF offline, caches in tmp."""
    root = tmp_path_factory.mktemp("bench_env")
    env = {
        "ALTGRAD_CACHE": str(root / "altgrad_cache"),
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": str(root / "wandb_config"),
        "WANDB_CACHE_DIR": str(root / "wandb_cache"),
        "WANDB_DATA_DIR": str(root / "wandb_data"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(root / "hf_home"),
        "HF_DATASETS_CACHE": str(root / "hf_datasets"),
        "TIKTOKEN_CACHE_DIR": str(root / "tiktoken_empty"),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m altgrad.train ARGS` from the repo root, capturing output."""
    return subprocess.run([sys.executable, "-m", "altgrad.train", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))

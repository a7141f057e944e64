"""Shared set-up: an offline environment, with eager quantization kernels and tmp caches, for the tests that run
`python -m altgrad.train` in a subprocess."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def offline_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for `python -m altgrad.train` subprocesses: no network, no compile, caches under pytest's tmp."""
    root = tmp_path_factory.mktemp("offline_env")
    return {
        **os.environ,
        "ALTGRAD_COMPILE": "0",  # eager kernels: compiling would dominate few-step jobs (compile parity: tests/quant)
        "ALTGRAD_CACHE": str(root / "altgrad_cache"),
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(root / "wandb"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(root / "hf_home"),
        "HYDRA_FULL_ERROR": "0",
    }

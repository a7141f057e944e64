"""Shared set-up for the fault tests: an offline environment with eager quantization kernels and a tmp token cache."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def fault_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for `python -m altgrad.train` subprocesses: no network, no compile, caches under pytest's tmp."""
    root = tmp_path_factory.mktemp("fault_env")
    return {
        **os.environ,
        "ALTGRAD_COMPILE": "0",  # eager kernels: compiling would dominate runs of a few steps
        "ALTGRAD_CACHE": str(root / "altgrad_cache"),
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(root / "wandb"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(root / "hf_home"),
        "HYDRA_FULL_ERROR": "0",
    }

"""Session fixtures: the synthetic sweeps of report_synthetic.py, written once into a temporary folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_synthetic import build_ab_sweep, build_stage_sweep


@pytest.fixture(scope="session")
def ab_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_ab_sweep(tmp_path_factory.mktemp("multirun") / "ab")


@pytest.fixture(scope="session")
def stage_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_stage_sweep(tmp_path_factory.mktemp("multirun") / "stages")

"""study_cpu_debug, the debug twin of the CPU study, end to end through the real entry point: the declaration is
checked before anything runs, every job saves it with its tuned lrs and ULP update sizes, and the report analyses
what was declared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from altgrad.report import write_report

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("study_env")
    return {**os.environ, "ALTGRAD_COMPILE": "0", "ALTGRAD_CACHE": str(root / "cache"), "WANDB_MODE": "offline",
            "WANDB_SILENT": "true", "WANDB_DIR": str(root / "wandb"), "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "HYDRA_FULL_ERROR": "0"}


def train(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "altgrad.train", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


def test_a_bad_declaration_stops_before_anything_runs(tmp_path: Path, env: dict[str, str]) -> None:
    done = train(["experiment=study_cpu_debug", "format=e4m3", "optimizer=adamw", "seed=1", "endpoint.alpha=0.9",
                  f"hydra.sweep.dir={tmp_path / 'sweep'}"], env)
    assert done.returncode == 2
    assert done.stderr.strip() == "error: endpoint.alpha=0.9 is invalid; valid: a number in (0, 0.5)"
    assert not (tmp_path / "sweep").exists()


def test_study_debug_twin_runs_end_to_end(tmp_path: Path, env: dict[str, str]) -> None:
    sweep = tmp_path / "sweep"
    # the debug grid narrowed to one format and two arms (2 seeds): 4 five-step jobs
    done = train(["experiment=study_cpu_debug", "format=e4m3", "optimizer=adamw,manifold",
                  f"hydra.sweep.dir={sweep}"], env)
    assert done.returncode == 0, done.stderr[-2000:]
    jobs = sorted(p for p in sweep.iterdir() if (p / "summary.json").is_file())
    assert [p.name for p in jobs] == [f"format=e4m3,optimizer={o},seed={s}" for o in ("adamw", "manifold")
                                      for s in (1, 2)]
    for path in jobs:
        summary = json.loads((path / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["steps"] == 5
        cfg = summary["config"]
        assert cfg["endpoint"]["horizon"] == 5 and cfg["endpoint"]["contrasts"][0]["treatment"] == "manifold[update]"
        # the tuned-lr table reaches both the arm's lr and its grid-less parameters (AdamW's lr)
        assert cfg["baseline"]["lr"] == 3e-3
        assert summary["lr"] == (1.0 if summary["optimizer"] == "manifold" else 3e-3)
        diag = summary["diagnostics"]
        assert diag["update_steps_sampled"] == 2.0 and diag["ulp_update_q10"] <= diag["ulp_update_q90"]
        assert 0.0 <= diag["sub_half_ulp_share"] <= 1.0 and "rel_update_d10" in diag
    text = write_report([sweep], tmp_path / "report").read_text()
    assert "## Declared endpoint (study_cpu_debug)" in text
    assert "Declared endpoint (study_cpu_debug), read from the jobs' saved config: metric final_val_loss at step 5" \
        in text
    assert "| manifold[update] − adamw | e4m3 | 1/0.003 | 2 | 0 of 2 / 0 of 2 |" in text
    assert "Which format benefits most: **not established**" in text
    assert "### Update sizes in ULPs and speed" in text

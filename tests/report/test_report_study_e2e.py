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
    return {**os.environ, "ALTGRAD_CACHE": str(root / "cache"), "WANDB_MODE": "offline",
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


@pytest.mark.slow
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
    assert "### Caveats" in text and "- Scale: one model, nano" in text and "- Horizon: H = 5 steps" in text


STUDY = {"study_cpu_pilot": 2, "study_cpu_tune": 7 * 4, "study_cpu": 7 * 3 * 5, "study_cpu_debug": 7 * 3 * 2}
FORMATS = ["bf16_ref", "e0m7", "e3m4", "e4m3", "e5m2", "p3109_p2", "e7m0"]


@pytest.fixture(scope="module")
def compose():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        yield lambda *o: hydra_compose(config_name="train", overrides=list(o), return_hydra_config=True)
    GlobalHydra.instance().clear()


@pytest.mark.slow
def test_study_experiments_plan_their_documented_grids(compose) -> None:
    from omegaconf import OmegaConf

    from altgrad.config import ConfigError, validate
    from altgrad.report.endpoint import parse_endpoint
    from altgrad.sweep.plan import plan_config

    for name, n_jobs in STUDY.items():
        cfg = compose(f"experiment={name}")
        jobs = plan_config(cfg, [f"experiment={name}"])
        assert len(jobs) == n_jobs, name
        assert len({j.subdir for j in jobs}) == n_jobs and all("seed=" in j.subdir for j in jobs), name
    full, debug = compose("experiment=study_cpu"), compose("experiment=study_cpu_debug")
    grid = OmegaConf.to_container(full.hydra.sweeper.params)
    assert grid["format"].split(",") == FORMATS and grid["optimizer"] == "adamw,manifold,relative"
    assert grid["seed"] == "1,2,3,4,5"  # disjoint from the tuning seed
    assert compose("experiment=study_cpu_tune").hydra.sweeper.params.seed == "101"
    # the twin declares the same endpoint (but for its horizon) over the same grid
    ep_full = parse_endpoint(OmegaConf.to_container(full.endpoint, resolve=True))
    ep_debug = parse_endpoint(OmegaConf.to_container(debug.endpoint, resolve=True))
    assert (ep_full.horizon, ep_debug.horizon) == (600, 5)
    assert ep_full.contrasts == ep_debug.contrasts and ep_full.formats == ep_debug.formats
    assert OmegaConf.to_container(debug.hydra.sweeper.params)["format"] == grid["format"]
    # every job of the twin validates; the evaluation itself runs only once the tuning wrote its table
    for fmt in FORMATS:
        for opt in ("adamw", "manifold", "relative"):
            validate(compose("experiment=study_cpu_debug", f"format={fmt}", f"optimizer={opt}"), paths=False)
    evaluation = compose("experiment=study_cpu", "format=e4m3", "optimizer=manifold")
    # the table grows stage by stage (AdamW's picks first, then each arm's): a job runs once its cell is there
    if OmegaConf.select(evaluation, "tuned_lr.e4m3.manifold") is not None:
        validate(evaluation, paths=False)
        assert evaluation.optimizer.lr == evaluation.tuned_lr.e4m3.manifold
        assert evaluation.optimizer.plain_lr == evaluation.tuned_lr.e4m3.plain
    else:
        with pytest.raises(ConfigError, match="tuned_lr.e4m3.manifold"):
            validate(evaluation, paths=False)

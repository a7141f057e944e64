"""Debug experiments through the real entry point and launchers: basic, then a resumed rerun under submitit_local.

One sweep folder, two commands (kept tiny: a 1-block model, 5 steps, a few jobs):
1. basic launcher, no -m: layer_sensitivity_debug for e4m3 × {attn, mlp, head}, where the attention family's glob
   is broken, so the first job fails; the two after it still run and complete.
2. the same command with +resume_sweep=true under submitit_local, for the mlp family over seeds 1 and 2: the
   completed seed-1 job is skipped (its files untouched), the new seed-2 job runs to completion.
(That a failed job runs again on resume is tested without a subprocess, in test_sweep_resume.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from altgrad.sweep.plan import plan
from sweep_helpers import job_dirs, run_train, summary

BROKEN_ATTN = "layer_map.families.attn=no.such.layer"  # a layer-map rule that matches no Linear: LayerMapError
GRID = ["experiment=layer_sensitivity_debug", "hydra.sweeper.params.format=e4m3", "hydra.sweeper.params.seed=1",
        BROKEN_ATTN, "callbacks=none"]


def name(family: str, seed: int) -> str:
    return f"callbacks=none,format=e4m3,{BROKEN_ATTN},layer_map.family={family},seed={seed}"


@pytest.fixture(scope="module")
def first_sweep(tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str]) -> tuple[Path, object]:
    sweep_dir = tmp_path_factory.mktemp("layer_sensitivity_debug")
    proc = run_train([*GRID, f"hydra.sweep.dir={sweep_dir}"], offline_env)
    return sweep_dir, proc


def test_basic_launcher_runs_every_job_despite_a_failure(first_sweep: tuple[Path, object]) -> None:
    sweep_dir, proc = first_sweep
    jobs = plan(GRID)
    assert [j.subdir for j in jobs] == [name("attn", 1), name("mlp", 1), name("head", 1)]  # launch order
    assert set(job_dirs(sweep_dir)) == {j.subdir for j in jobs}, proc.stderr[-3000:]
    failed = summary(sweep_dir / name("attn", 1))
    assert failed["status"] == "failed" and failed["error"].startswith("LayerMapError")
    for family in ("mlp", "head"):
        done = summary(sweep_dir / name(family, 1))
        assert done["status"] == "completed" and done["steps"] == 5, done["error"]
        assert (done["experiment"], done["layer_map"], done["seed"]) == ("layer_sensitivity_debug", f"only_{family}", 1)
        assert (sweep_dir / name(family, 1) / "metrics.csv").is_file()
    assert proc.returncode == 1  # Hydra reports the failed job after all jobs ran
    assert "LayerMapError" in proc.stderr


@pytest.mark.slow
def test_resumed_rerun_under_submitit_skips_finished_jobs(first_sweep: tuple[Path, object],
                                                          offline_env: dict[str, str]) -> None:
    sweep_dir, _ = first_sweep
    kept = [sweep_dir / name(family, 1) / f for family in ("attn", "mlp", "head")
            for f in ("summary.json", "metrics.csv") if (sweep_dir / name(family, 1) / f).is_file()]
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in kept}
    args = [*GRID, "layer_map.family=mlp", "hydra.sweeper.params.seed='1,2'", "+resume_sweep=true",
            "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"]
    assert [j.subdir for j in plan(args)] == [name("mlp", 1), name("mlp", 2)]
    proc = run_train([*args, f"hydra.sweep.dir={sweep_dir}"], offline_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in kept} == before  # nothing finished was rewritten
    new = summary(sweep_dir / name("mlp", 2))
    assert new["status"] == "completed" and new["seed"] == 2 and new["steps"] == 5, new["error"]
    logs = "".join(p.read_text() for p in (sweep_dir / ".submitit").rglob("*_log.out"))
    assert f"{sweep_dir / name('mlp', 1)} already completed; skipped" in logs  # submitit ran both jobs
    assert len(job_dirs(sweep_dir)) == 4

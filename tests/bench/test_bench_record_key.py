"""The job record's code key covers every file a timed job imports: the packages it leaves out (the bench, the
report, the study driver) must stay off the training path, or a change there would time a different job under the
same key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from altgrad.bench import job_record
from altgrad.bench.job import JOBS, REPO

# Runs a module as ``python -m`` would and, at exit, lists the altgrad files the process imported.
PROBE = """
import atexit, json, runpy, sys
out, module, args = sys.argv[1], sys.argv[2], sys.argv[3:]
def dump():
    files = sorted({m.__file__ for m in list(sys.modules.values()) if getattr(m, "__file__", None)})
    open(out, "w").write(json.dumps(files))
atexit.register(dump)
sys.argv = [module, *args]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def imported(tmp_path: Path, name: str, module: str, args: list[str]) -> set[Path]:
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, "-c", PROBE, str(out), module, *args], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = {Path(f).resolve() for f in json.loads(out.read_text())}
    return {f for f in files if f.is_relative_to(REPO / "altgrad")}


QUICK = ("e5m2 manifold master=none",)  # quantizers, the manifold step on the grid, default diagnostics


@pytest.mark.parametrize("every_job", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["quick", "all"])
def test_every_module_a_bench_job_imports_is_in_the_code_key(tmp_path: Path, every_job: bool) -> None:
    """The plain loop and a quantized manifold job (every default configuration of the page, slow), 3 steps each."""
    keyed = {p.resolve() for p in job_record.keyed_files(REPO)}
    (tmp_path / "ref").mkdir()
    runs = {"plain loop": ("altgrad.bench._reference_loop", [str(tmp_path / "ref" / "summary.json")])}
    for job in JOBS:
        if job.default and job.kind == "run" and (every_job or job.name in QUICK):
            runs[job.name] = ("altgrad.train", [*job.overrides, f"hydra.run.dir={tmp_path / job_record_dir(job.name)}"])
    seen: set[Path] = set()
    for name, (module, args) in runs.items():
        files = imported(tmp_path, job_record_dir(name), module, [*args, "trainer.max_steps=3"])
        assert files, name
        seen |= files
    outside = sorted(str(p.relative_to(REPO)) for p in seen - keyed)
    assert not outside, f"a timed job imports files the record's key does not hash: {outside}"
    assert any(p.name == "_reference_loop.py" for p in seen) and any(p.name == "train.py" for p in seen)


def job_record_dir(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


@pytest.mark.parametrize("rel", ["altgrad/report/stats.py", "altgrad/study/power.py", "altgrad/bench/job.py"])
def test_the_untimed_packages_are_left_out_of_the_key(rel: str) -> None:
    assert (REPO / rel).exists() and REPO / rel not in job_record.keyed_files(REPO)

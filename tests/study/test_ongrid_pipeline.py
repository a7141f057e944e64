"""Study 2's plan at debug size, end to end through the real entry points, on a small folder of split files: pilot →
horizon → AdamW tuning (the plain lr per format) → failure stages → arm tuning → power → evaluation at the table's
lrs and the power stage's seeds → 4H → report; every record names its arm and its data files' sha256."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # ≈ 50 five-step jobs: several minutes on 2 cores

REPO = Path(__file__).resolve().parents[2]


def make_folder(root: Path) -> Path:
    from altgrad.data.corpus import iter_documents

    docs = list(iter_documents(7, 260_000))
    root.mkdir(parents=True)
    (root / "eurlex_en.train.txt").write_text("\n\n".join(d.strip() for d in docs[:-8]) + "\n", encoding="utf-8")
    (root / "eurlex_en.val.txt").write_text("\n\n".join(d.strip() for d in docs[-8:]) + "\n", encoding="utf-8")
    (root / "SHA256SUMS").write_text("".join(
        f"{hashlib.sha256((root / n).read_bytes()).hexdigest()}  {n}\n" for n in ("eurlex_en.train.txt",
                                                                                  "eurlex_en.val.txt")))
    return root


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess, Path]:
    base = tmp_path_factory.mktemp("ongrid")
    data = make_folder(base / "data")
    env = {**os.environ, "ALTGRAD_CACHE": str(base / "cache"), "WANDB_MODE": "offline",
           "WANDB_SILENT": "true", "WANDB_DIR": str(base / "wandb"), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "altgrad.study", "ongrid_debug", "--set", f"data.dir={data}",
                           "--root", str(base / "root"), "--records", str(base / "runs"), "--out", str(base / "out"),
                           "--jobs", "2"], cwd=REPO, env=env, capture_output=True, text=True, timeout=3000)
    return base, done, data


def test_every_stage_ran_and_recorded_its_jobs(ran) -> None:
    base, done, data = ran
    assert done.returncode == 0, done.stderr[-3000:]
    runs = base / "runs"
    assert sorted(p.name for p in runs.iterdir() if p.is_dir()) == ["eval", "h4", "pilot", "stages", "tune_p2",
                                                                      "tune_ref"]
    sums = {n: hashlib.sha256((data / n).read_bytes()).hexdigest() for n in ("eurlex_en.train.txt",
                                                                             "eurlex_en.val.txt")}
    for record in (r for stage in runs.iterdir() if stage.is_dir() for r in stage.iterdir()):
        summary = json.loads((record / "summary.json").read_text())
        assert summary["data_files"] == sums and summary["arm"] in record.name
        assert str(data) not in record.name  # the data folder is a setting, not part of the job's name


def test_the_failure_stages_ran_at_the_fp32_models_pick_and_the_arms_at_theirs(ran) -> None:
    base, done, _ = ran
    assert done.returncode == 0, done.stderr[-3000:]
    table = yaml.safe_load((base / "root" / "conf" / "debug_tuned" / "ongrid_debug.yaml").read_text())["tuned_lr"]
    assert set(table["e4m3"]) == {"plain", "adamw_sr", "manifold_sr", "relative_sr"}
    assert table["e4m3"]["plain"] == table["e4m3"]["adamw_sr"] and set(table["fp32"]) == {"stage_w"}
    for record in (base / "runs" / "stages").iterdir():
        summary = json.loads((record / "summary.json").read_text())
        assert summary["lr"] == pytest.approx(table["fp32"]["stage_w"])
    power = json.loads((base / "runs" / "power.json").read_text())
    assert 2 <= power["seeds"] <= 3
    evaluation = sorted(p.name for p in (base / "runs" / "eval").iterdir())
    assert len(evaluation) == 3 * power["seeds"]
    for record in (base / "runs" / "eval").iterdir():
        summary = json.loads((record / "summary.json").read_text())
        assert summary["lr"] == pytest.approx(table["e4m3"][summary["arm"]])
        assert summary["config"]["baseline"]["lr"] == pytest.approx(table["e4m3"]["plain"])
        assert summary["master"] == "none" and summary["storage_rounding"] == "stochastic"
        assert summary["config"]["layer_map"]["name"] == "weights_only"
    assert (base / "out" / "report.md").is_file()

"""The whole report on an arm-labelled study's records written to disk (synthetic, known truth): every part of the
declaration has its section, the report regenerates byte for byte, and a study with stages not yet run (only its
pilot, or an evaluation without some arms) gets a report that says what is missing instead of failing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_report_arms import ARMS_RUN, PLANTED, job, ladder_study, study

from altgrad.report.__main__ import main
from altgrad.report.load import Job

pytestmark = pytest.mark.slow  # a few full reports with their figures


def write(root: Path, jobs: list[Job], folder: str = "eval") -> Path:
    for j in jobs:
        path = root / folder / f"{j.name.replace('/', '-')}-lr{j.lr:g}"
        (path / ".hydra").mkdir(parents=True, exist_ok=True)
        (path / ".hydra" / "overrides.yaml").write_text(
            f"- format={j.format}\n- +arm={j.arm}\n- seed={j.seed}\n")
        summary = dict(j.summary, data_files={"eurlex_en.train.txt": "a" * 64, "eurlex_en.val.txt": "b" * 64},
                       code={"commit": "c0ffee", "dirty": False})
        (path / "summary.json").write_text(json.dumps(summary))
        (path / "metrics.csv").write_text("step,val/loss\n0,5.5\n25,3.0\n49,"
                                          + (f"{j.summary['final_val_loss']}\n" if j.summary["final_val_loss"]
                                             else "\n"))
    return root


def report(records: Path, out: Path) -> str:
    assert main([str(records), "--out", str(out)]) == 0
    return (out / "report.md").read_text()


def test_a_full_arm_study_has_every_section_and_regenerates(tmp_path: Path) -> None:
    records = write(tmp_path / "runs", ladder_study())
    (records / "power.json").write_text(json.dumps({"seeds": 6, "needed": 5, "paired_sd": 0.012, "df": 4,
                                                    "margin": 0.03, "power": 0.8, "alpha": 0.05, "family": 6,
                                                    "underpowered": False}))
    text = report(records, tmp_path / "a")
    for part in ("| P2: manifold_sr − adamw_sr | e4m3 |", "Secondary family (the why, by intervention;",
                 "| X1: Δ(I1) − Δ(I2) | e4m3 |", "Controls (expected ≈ 0)", "| C1: manifold_fm − relative_fm | e4m3 |",
                 "Failure stages as declared", "![Δ per failure stage and format](failure_ladder.png)",
                 "Recovery: each arm − adamw_fm", "## Study records: pilot, tuning, mechanism",
                 "Power (power.json): pooled paired SD 0.0120 on 4 df", "## Provenance",
                 "- Data: one set of data files across the", "- Code: one code state, c0ffee",
                 "Format control e0m7 (no exponent bits", "e4m3 first fails at **stage_wag_rn**",
                 "### Outlying runs", "| e0m7 | stage_wag_rn | ladder | 6 | ",
                 "| stage_wag_rn − fp32 stage_w | e0m7 | 6 |"):
        assert part in text, part
    assert (tmp_path / "a" / "failure_ladder.png").is_file()
    assert "Declared parts with no records yet" not in text
    again = report(records, tmp_path / "b")
    assert again.replace(str(tmp_path / "b"), "OUT") == text.replace(str(tmp_path / "a"), "OUT")


def test_a_partial_study_reports_what_is_missing(tmp_path: Path) -> None:
    records = write(tmp_path / "runs", study(PLANTED, arms=tuple(a for a in ARMS_RUN if a != "relative_sr")))
    text = report(records, tmp_path / "out")
    assert "Declared parts with no records yet" in text
    assert "relative_sr in e0m7, e4m3, e7m0 (for P1)" in text
    assert "stage_w in fp32, e0m7, e4m3, e7m0 (for failure stages)" in text
    assert "Failure stages: the reference cell (fp32 stage_w) has no runs yet" in text
    assert "Power: no power record (power.json) yet" in text


def test_only_a_pilot_gives_a_report(tmp_path: Path) -> None:
    pilot = []
    for lr in (2.51e-3, 3.98e-3):
        j = job("fp32", "stage_w", 101, 1.2 + lr)
        j.summary.update(lr=lr, experiment="ongrid_pilot", steps=4000)
        j.summary["config"] = {k: v for k, v in j.summary["config"].items() if k != "endpoint"}
        pilot.append(j)
    records = write(tmp_path / "runs", pilot, folder="pilot")
    text = report(records, tmp_path / "out")
    assert "No run of these records declares an endpoint yet" in text
    assert "Records per folder: pilot: 2 completed." in text


def test_before_the_evaluation_the_report_shows_the_ladder_curves_and_the_tuning_scans(tmp_path: Path) -> None:
    """Records of a study whose evaluation has not started (its ladder and its reference tuning): the ladder's
    curves and the tuning's lr–loss figure are drawn, and the evaluation's empty curve panel says why it is empty."""
    from test_report_arms import _ladder_and_tuning

    jobs = _ladder_and_tuning()
    ladder_jobs = [j for j in jobs if "tune" not in j.summary["experiment"]]
    records = write(tmp_path / "runs", ladder_jobs, folder="stages")
    write(records, [j for j in jobs if "tune" in j.summary["experiment"]], folder="tune_ref")
    text = report(records, tmp_path / "out")
    assert "![validation loss per ladder rung](failure_ladder_curves.png)" in text
    assert "![final validation loss against lr](lr_loss.png)" in text
    assert "_No evaluation run of the declared study has finished yet._" in text
    assert (tmp_path / "out" / "failure_ladder_curves.png").is_file() and (tmp_path / "out" / "lr_loss.png").is_file()

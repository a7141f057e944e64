"""Mechanism evidence in the report: steps to the fp32 target from the val curves, the ULP update-size table, and
which formats the report treats as one grid (from the runs' saved format configs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_synthetic import write_job

from altgrad.report.cells import group_cells
from altgrad.report.document import same_grid_rule, write_report
from altgrad.report.load import load_sweeps
from altgrad.report.mechanism import decile_ratio, first_step_at, speeds, targets
from altgrad.report.tables import diagnostic_names, mechanism_table

UPDATES = {"ulp_update_q10": 0.1, "ulp_update_q50": 0.4, "ulp_update_q90": 2.0, "sub_half_ulp_share": 0.55,
           "rel_update_d1": 0.2, "rel_update_d10": 0.01, "update_steps_sampled": 3.0}


def test_first_step_at() -> None:
    curve = [(0, 5.0), (10, 4.0), (20, 3.1), (30, 3.2), (40, 2.9)]
    assert first_step_at(curve, 3.15) == 20 and first_step_at(curve, 3.1) == 20
    assert first_step_at(curve, 2.0) is None


def test_steps_to_target_from_fp32_adamw(tmp_path: Path) -> None:
    # write_job's val curve falls linearly from final + 2 at step 0 to final at step 50, logged every 10 steps
    for seed in range(2):
        write_job(tmp_path / f"ref{seed}", fmt="fp32", optimizer="adamw", seed=seed, final=3.0)
        write_job(tmp_path / f"fast{seed}", fmt="e4m3", optimizer="manifold", seed=seed, final=2.0)
        write_job(tmp_path / f"slow{seed}", fmt="e4m3", optimizer="adamw", seed=seed, final=3.1 + 0.1 * seed)
    cells = group_cells(load_sweeps([tmp_path]).jobs)
    (target,) = targets(cells).values()
    assert target.value == pytest.approx(3.15) and target.reference == "fp32 adamw"
    by = {(c["format"], c["optimizer_label"]): speeds(cells)[c.key] for c in cells}
    # fast: 4 − 2·(step/50) ≤ 3.15 first at step 30; slow seed 0: 5.1 − 2·step/50 first at step 50
    assert (by[("e4m3", "manifold[update]")].median_steps, by[("e4m3", "manifold[update]")].reached) == (30, 2)
    assert by[("e4m3", "adamw")].median_steps == 50 and by[("e4m3", "adamw")].reached == 1  # seed 1 ends at 3.2
    assert by[("fp32", "adamw")].median_steps == 50


def test_target_falls_back_to_the_wide_reference_and_none_without_one(tmp_path: Path) -> None:
    write_job(tmp_path / "a", fmt="bf16_ref", optimizer="adamw", seed=0, final=3.0)
    write_job(tmp_path / "b", fmt="e4m3", optimizer="adamw", seed=0, final=3.0)
    (target,) = targets(group_cells(load_sweeps([tmp_path]).jobs)).values()
    assert target.reference == "bf16_ref adamw"
    assert targets(group_cells(load_sweeps([tmp_path / "b"]).jobs)) == {}


def test_mechanism_table_and_the_report_section(tmp_path: Path) -> None:
    for seed in range(2):
        write_job(tmp_path / f"ref{seed}", fmt="fp32", optimizer="adamw", seed=seed, final=3.0)
        write_job(tmp_path / f"q{seed}", fmt="e4m3", optimizer="adamw", seed=seed, final=3.0,
                  diagnostics={"mean_stall_ratio": 0.5, **UPDATES})
    cells = group_cells(load_sweeps([tmp_path]).jobs)
    e4m3 = next(c for c in cells if c["format"] == "e4m3")
    assert decile_ratio(e4m3) == pytest.approx(0.05)
    table = mechanism_table(cells, speeds(cells))
    assert "| e4m3 | fp32 master | adamw | 0.1 | 0.4 | 2 | 0.55 | 0.05 | 50 (2/2) |" in table
    # the mechanism keys are not repeated in the general diagnostics table
    assert "mean_stall_ratio" in diagnostic_names(cells)
    assert not set(diagnostic_names(cells)) & set(UPDATES)
    text = write_report([tmp_path], tmp_path / "out").read_text()
    assert "### Update sizes in ULPs and speed" in text and "of fp32 adamw (3.1500)" in text


def test_same_grid_rule_from_the_runs_format_configs(tmp_path: Path) -> None:
    pytest.importorskip("altgrad.quant.grids")
    pow2 = {"kind": "tensor", "pow2": True}
    for fmt in ("e0m7", "e1m6", "e4m3"):
        write_job(tmp_path / fmt, fmt=fmt, optimizer="adamw", seed=0, final=3.0,
                  config={"format": {"name": fmt, "grad": "e5m2", "scaling": pow2, "overflow": "saturate"}})
    rule = same_grid_rule(load_sweeps([tmp_path]).jobs)
    assert rule("e0m7", "e1m6") and not rule("e0m7", "e4m3")
    assert rule("e4m3", "p3109_p4")  # p3109_p4 did not run: compared under the runs' scaling
    assert not rule("e4m3", "no_such_format")

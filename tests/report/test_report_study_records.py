"""A study's records beside its tests: the horizon pairs (a sign change is a horizon effect), the pilot's loss at H
against 4H, the lr scans (pick, bracketing, failed lrs), the power record and the mechanism's activity."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_report_arms import DECLARATION, PLANTED, job, run, study

from altgrad.report import study_records as records
from altgrad.report.load import Job


def long_study(effect_at_4h: dict[tuple[str, str], float]) -> list[Job]:
    """The 4H declaration (P1, P2 on e4m3 and e7m0, no secondary) with its own effects."""
    decl: dict[str, Any] = {**DECLARATION, "horizon": 200, "formats": ["e4m3", "e7m0"], "secondary": [],
                            "interactions": [], "controls": [], "stages": None, "recovery": None}
    rng = np.random.default_rng(9)
    jobs = []
    for fmt in ("e4m3", "e7m0"):
        for seed in range(1, 7):
            base = 1.8 + rng.normal(0.0, 0.05)
            for arm in ("adamw_sr", "manifold_sr", "relative_sr"):
                value = base + effect_at_4h.get((fmt, arm), 0.0) + rng.normal(0.0, 0.01)
                j = job(fmt, arm, seed, float(value), declaration=decl)
                j.summary["steps"] = 200
                jobs.append(j)
    return jobs


def results(jobs: list[Job]):
    from altgrad.report.study import analyse, declared_endpoints

    return [analyse(ep, members) for ep, members in declared_endpoints(jobs)]


def test_a_sign_change_between_horizons_is_a_horizon_effect() -> None:
    flipped = {("e4m3", "manifold_sr"): +0.2, ("e7m0", "manifold_sr"): -0.2}  # e4m3 flips from −0.2 at H
    pairs = records.horizon_pairs(results(study(PLANTED) + long_study(flipped)))
    by = {(p.label, p.format): p for p in pairs}
    assert set(by) == {(c, f) for c in ("P1", "P2") for f in ("e4m3", "e7m0")}
    assert by[("P2", "e4m3")].sign_change == "significant" and by[("P2", "e7m0")].sign_change is None
    assert (by[("P2", "e4m3")].h_short, by[("P2", "e4m3")].h_long) == (50, 200)
    (line,) = records.horizon_lines(results(study(PLANTED) + long_study(flipped)))
    p2 = by[("P2", "e4m3")]
    assert (f"P2 e4m3: {p2.short.test.mean:+.4f} (benefit) at 50 → {p2.long.test.mean:+.4f} (harm) at 200 — **the "
            "sign changes: a horizon effect**") in line
    assert p2.long.test.mean == pytest.approx(0.2, abs=0.02)


def test_pilot_rows_read_loss_at_h_and_4h() -> None:
    curve = tuple((s, 3.0 - s / 1000) for s in range(0, 4001, 100))
    pilot = Job(Path("p"), "pilot/0", "completed", {"status": "completed", "experiment": "ongrid_pilot", "lr": 3e-3,
                                                     "seed": 101}, curve=curve)
    (row,) = records.pilot_rows([pilot], [1000])
    assert row[1:] == (1000, pytest.approx(2.0), pytest.approx(-1.0))
    assert records.pilot_rows([pilot], [2000]) == []  # 4 × 2000 is beyond the pilot
    assert "| pilot/0 | 0.003 | 101 | 1000 | 2.0000 | -1.0000 |" in records.pilot_table([row])


def tune(fmt: str, arm: str, lr: float, seed: int, loss: float | None) -> Job:
    j = job(fmt, arm, seed, loss, status="completed" if loss is not None else "diverged")
    j.summary.update(lr=lr, experiment="ongrid_tune")
    return j


def test_tuning_pick_bracketing_and_failed_lrs() -> None:
    jobs = [tune("e4m3", "manifold_sr", lr, s, loss) for s in (201, 202)
            for lr, loss in ((0.4, 2.1), (0.63, 2.0), (1.0, 1.9), (1.58, None))]
    jobs += [tune("e7m0", "adamw_sr", lr, s, 2.5 - lr) for s in (201, 202) for lr in (0.001, 0.002)]
    cells = {(c.format, c.arm): c for c in records.tuning(jobs)}
    m = cells[("e4m3", "manifold_sr")]
    assert m.pick == 1.0 and m.pick_source == "lowest mean" and m.bracketed  # 1.58 failed: above, still scanned
    assert m.failed[1.58] == 2 and m.losses[1.58] is None and m.seeds == (201, 202)
    a = cells[("e7m0", "adamw_sr")]
    assert a.pick == 0.002 and a.bracketed is False
    evaluated = [job("e4m3", "manifold_sr", 1, 2.0, lr=0.63)]
    assert {c.arm: c.pick for c in records.tuning(jobs, evaluated)}["manifold_sr"] == 0.63
    (line,) = records.tuning_lines(records.tuning(jobs))
    assert "not bracketed) in e7m0 adamw_sr (lr 0.002)" in line
    assert "1.58: failed" in records.tuning_table(records.tuning(jobs))
    assert "flat" not in records.tuning_lines(records.tuning(jobs), margin=0.03)[0]


def test_a_flat_scan_is_named_as_unresolved() -> None:
    jobs = [tune("e7m0", "madam_sr", lr, s, loss + 0.001 * (s - 201)) for s in (201, 202)
            for lr, loss in ((0.004, 2.509), (0.0063, 2.497), (0.01, 2.493), (0.016, 2.493), (0.025, 2.497))]
    jobs += [tune("e7m0", "adamw_sr", lr, s, loss) for s in (201, 202)
             for lr, loss in ((0.001, 1.9), (0.002, 1.5), (0.004, 1.7))]
    cells = records.tuning(jobs)
    (line,) = records.tuning_lines(cells, margin=0.03)
    assert ("the scan is flat (its mean losses span less than the tie margin ±0.03) in e7m0 madam_sr "
            "(2.4935–2.5095 over lrs 0.004–0.025)") in line and "adamw_sr (" not in line
    assert "flat" not in records.tuning_lines(cells, margin=0.01)[0]  # a 0.016 span is no tie at ±0.01
    assert "flat" not in records.tuning_lines(cells)[0]  # no margin given: no judgement


def test_power_record(tmp_path: Path) -> None:
    assert records.read_power([tmp_path]) is None
    assert records.power_line(None).startswith("Power: no power record")
    (tmp_path / "power.json").write_text(json.dumps({"seeds": 10, "needed": 14, "paired_sd": 0.031, "df": 9,
                                                     "margin": 0.03, "power": 0.8, "alpha": 0.05, "family": 6,
                                                     "underpowered": True}))
    line = records.power_line(records.read_power([tmp_path]))
    assert line == ("Power (power.json): pooled paired SD 0.0310 on 9 df; to detect ±0.03 at α = 0.05/6 with power "
                    "0.8: n = 14 → 10 evaluation seeds — **underpowered** (capped at max_seeds).")


def test_mechanism_activity_from_nearest_storage_arms() -> None:
    jobs = study(PLANTED, seeds=2)
    for j in jobs:
        share = {"e4m3": 0.9, "e7m0": 0.95, "e0m7": 0.2}[j.format] if j.arm.endswith("_rn") else 0.1
        j.summary["diagnostics"] = {"sub_half_ulp_share": share, "ulp_update_q50": 0.3}
    result = run(jobs)
    rows = {(f, a): v for f, a, _, _, v in records.mechanism_by_arm(result)}
    assert rows[("e4m3", "adamw_rn")][0] == 0.9 and rows[("e4m3", "adamw_rn")][2] is None
    (line,) = records.mechanism_lines(result)
    assert "≥ 0.5 in e4m3 adamw_rn 0.90" in line and "below it in e0m7 adamw_rn 0.20" in line
    assert "| e4m3 | adamw_rn | on-grid nearest | 2 | 0.9 | 0.3 |" in records.mechanism_table(result)


def test_power_plan_checked_against_the_evaluations_sd() -> None:
    from altgrad.report import stats

    result = run(study(PLANTED))
    assert records.power_check_line(None, result) is None
    record = {"seeds": 6, "needed": 6, "paired_sd": 0.002, "df": 3, "margin": 0.03, "power": 0.8, "alpha": 0.05,
              "family": 6}
    line = records.power_check_line(record, result)
    assert line is not None and line.startswith("The power plan against the evaluation: the plan's pooled paired "
                                                "SD was 0.0020 (tuning seeds, 3 df), n = 6 → 6 seeds")
    sds = [c.paired_sd for c in result.comparisons if len(c.deltas) >= 2]
    assert sds and f"({sum(sd > 0.002 for sd in sds)} of {len(sds)} above)" in line
    for c in result.comparisons:
        n = stats.seeds_needed(c.paired_sd, 0.03, 0.05 / 6, 0.8, max_n=1000)
        assert f"{c.format} {c.paired_sd:.3g} → n {'> 1000' if n is None else f'= {n}'}" in line
    assert records.power_check_line({**record, "paired_sd": None}, result) is None
    assert "3 df); the evaluation's" in records.power_check_line({**record, "needed": None}, result)
    lo, hi = f"{min(sds) / 0.002:.2g}", f"{max(sds) / 0.002:.2g}"
    assert lo != hi and f"lies at {lo}–{hi} × it" in line
    one = [c for c in result.comparisons if len(c.deltas) >= 2][:1]          # one SD: said once, not "x–x"
    single = records.power_check_line(record, dataclasses.replace(result, comparisons=tuple(one)))
    assert f"lies at {one[0].paired_sd / 0.002:.2g} × it (" in single


@pytest.mark.parametrize(("short", "long", "change"), [
    (("tie", +0.0005), ("not established", -0.0384), "point"),   # study 2's P1 e4m3 after one 4H pair: beyond ±0.03
    (("tie", +0.0005), ("not established", -0.0200), None),      # both inside the tie margin: a sign means nothing
    (("tie", +0.0005), ("benefit", -0.0800), "verdict"),         # a tie at H, a difference at 4H: established both ways
    (("harm", +0.0900), ("tie", -0.0050), "verdict"),
    (("benefit", -0.0900), ("harm", +0.0700), "significant"),
    (("benefit", -0.0900), ("not established", -0.0100), None),  # the same sign
    (("tie", -0.0103), ("not established", -0.0500), "margin"),  # a tie leaving the margin, not established
    (("not established", +0.0500), ("tie", +0.0040), "margin"),
    (("tie", -0.0103), ("not established", -0.0250), None),      # still inside the margin
])
def test_a_horizon_change_is_judged_against_the_tie_margin(short, long, change, monkeypatch) -> None:
    """Two point estimates inside the tie margin differ in sign by noise alone; a tie at one horizon and an
    established difference at the other is a horizon effect even without a sign change; a tie at one horizon and an
    estimate beyond the margin at the other, not established, a possible one. The Horizon line says which."""
    (pair, *_) = records.horizon_pairs(results(study(PLANTED) + long_study(PLANTED)))
    assert pair.tie_margin == 0.03

    def at(c, verdict: str, mean: float):
        return dataclasses.replace(c, verdict=verdict, test=dataclasses.replace(c.test, mean=mean))

    moved = dataclasses.replace(pair, short=at(pair.short, *short), long=at(pair.long, *long))
    assert moved.sign_change == change
    monkeypatch.setattr(records, "horizon_pairs", lambda _: [moved])
    (line,) = records.horizon_lines([])
    said = {"significant": "**the sign changes: a horizon effect**",
            "verdict": "**a tie at one horizon, a difference at the other: a horizon effect**",
            "point": "the point estimate changes sign, beyond the tie margin (±0.03) at one horizon",
            "margin": "a tie at one horizon; at the other the estimate lies beyond the tie margin (±0.03), not "
                      "established: a possible horizon effect"}
    assert all((text in line) == (kind == change) for kind, text in said.items()), line
    assert ("horizon effect" in line) == (change is not None)

"""Outlying runs (altgrad/report/outliers.py): the rule against an independent numpy reading of it, its invariances,
the cases it must and must not flag, and, on an arm study with planted stalls, which runs it names and what each
paired comparison says without them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_report_arms import PLANTED, ladder_study, run, study

from altgrad.report.load import Job
from altgrad.report.outliers import Z_LIMIT, finding_lines, outlying_seeds, spreads, trimmed
from altgrad.report.stats import t_test
from altgrad.report.tables import outlier_table, trimmed_table

losses = st.floats(min_value=1.0, max_value=6.0, allow_nan=False, width=32)
cells = st.dictionaries(st.integers(min_value=1, max_value=50), losses, min_size=0, max_size=12)
margins = st.sampled_from([0.0, 0.01, 0.03, 0.1])


def numpy_rule(values: dict[int, float], margin: float) -> tuple[int, ...]:
    """The rule read straight from its definition, with numpy's median."""
    if len(values) < 3:
        return ()
    x = np.array(list(values.values()))
    med = np.median(x)
    mad = np.median(np.abs(x - med))
    out = []
    for seed, v in sorted(values.items()):
        z = np.inf if mad == 0 else 0.6745 * (v - med) / mad
        if v - med > margin and z > 3.5:
            out.append(seed)
    return tuple(out)


@settings(max_examples=300, deadline=None)
@given(cells, margins)
def test_the_rule_matches_its_definition(values: dict[int, float], margin: float) -> None:
    assert outlying_seeds(values, margin) == numpy_rule(values, margin)


@settings(max_examples=200, deadline=None)
@given(cells, margins, st.sampled_from([-1.0, 0.0, 0.5, 2.0]), st.permutations(list(range(12))))
def test_flags_follow_the_runs_not_their_labels_or_level(values: dict[int, float], margin: float, shift: float,
                                                         order: list[int]) -> None:
    flagged = outlying_seeds(values, margin)
    shifted = outlying_seeds({s: v + shift for s, v in values.items()}, margin)
    seeds = sorted(values)
    relabel = {s: 100 + order[i] for i, s in enumerate(seeds)}
    relabelled = outlying_seeds({relabel[s]: v for s, v in values.items()}, margin)
    assert sorted(relabel[s] for s in flagged) == list(relabelled)
    med = float(np.median(list(values.values()))) if values else 0.0
    assert all(values[s] > med + margin for s in flagged)     # only above the median, beyond the margin
    # a shift moves every value and the median alike: the same runs, up to float rounding at the margin's edge
    edge = [s for s in values if abs(values[s] - med - margin) < 1e-9 * (1 + abs(shift))]
    assert set(flagged) ^ set(shifted) <= set(edge)


def test_a_stalled_seed_is_flagged_a_spread_failing_cell_is_not() -> None:
    learned = {1: 1.44, 2: 1.454, 3: 1.461, 4: 1.466, 5: 2.31, 6: 1.486, 7: 1.506}
    assert outlying_seeds(learned, 0.03) == (5,)
    two = {1: 1.577, 2: 2.19, 3: 1.512, 4: 1.937, 5: 1.492, 6: 1.487, 7: 1.517}   # two stalls of seven
    assert outlying_seeds(two, 0.03) == (2, 4)
    failing = {1: 3.348, 2: 4.526, 3: 3.276, 4: 3.941, 5: 3.644, 6: 4.009}         # spread over a nat
    assert outlying_seeds(failing, 0.03) == ()


def test_the_margin_and_the_side() -> None:
    tight = {1: 1.800, 2: 1.801, 3: 1.802, 4: 1.803, 5: 1.825}   # z ≫ 3.5 but only 0.023 above the median
    assert outlying_seeds(tight, 0.03) == () and outlying_seeds(tight, 0.01) == (5,)
    assert outlying_seeds({1: 1.5, 2: 1.5, 3: 1.5, 4: 0.5}, 0.03) == ()              # below the median: not a stall
    assert outlying_seeds({1: 1.5, 2: 1.5, 3: 1.5, 4: 2.5}, 0.03) == (4,)            # MAD 0: any run beyond the margin
    assert outlying_seeds({1: 1.5, 2: 9.0}, 0.03) == ()                             # two seeds have no median to leave


def _stalled(jobs: list[Job], stalls: dict[tuple[str, str, int], float]) -> list[Job]:
    """The jobs with the planted stalls added to their final loss."""
    out = []
    for j in jobs:
        extra = stalls.get((j.format, j.arm, j.seed))
        if extra is None:
            out.append(j)
            continue
        value = j.summary["final_val_loss"] + extra
        out.append(dataclasses.replace(j, summary=dict(j.summary, final_val_loss=value, best_val_loss=value)))
    return out


STALLS = {("e4m3", "adamw_sr", 2): 0.8, ("e4m3", "stage_w", 3): 0.7}


def test_an_arm_study_names_its_stalls_and_shows_each_comparison_without_them() -> None:
    result = run(_stalled(ladder_study(), STALLS))
    cells = spreads(result)
    flagged = {(c.format, c.arm, s) for c in cells for s in c.outlying}
    # and ladder_study's diverged run, entered at its initial loss in a cell that learned
    assert flagged == {*STALLS, ("e0m7", "stage_wag_rn", 1)}
    assert {(c.format, c.arm) for c in cells if c.part == "ladder"} >= {("fp32", "stage_w"), ("e4m3", "stage_w")}
    rows = {(r.name, r.format): r for r in trimmed(result, cells)}
    p2 = rows[("P2: manifold_sr − adamw_sr", "e4m3")]
    declared = next(c for c in result.comparisons if c.contrast.label == "P2" and c.format == "e4m3")
    assert p2.full == declared.test and p2.dropped == (2,) and p2.kept.n == 5
    assert p2.kept.mean == pytest.approx(t_test([d for s, d in declared.deltas.items() if s != 2]).mean)
    assert p2.full.mean < p2.kept.mean < 0        # the stall made manifold look further ahead; it still leads
    assert p2.kept.mean == pytest.approx(PLANTED[("e4m3", "manifold_sr")], abs=0.05)
    assert ("I1: adamw_rn − adamw_sr", "e4m3") in rows                    # the secondary family pairs it too
    rung = rows[("stage_w − fp32 stage_w", "e4m3")]
    assert rung.dropped == (3,) and rung.full.mean > 0.1 and abs(rung.kept.mean) < 0.03
    assert ("P2: manifold_sr − adamw_sr", "e7m0") not in rows              # nothing flagged there
    head, primary = finding_lines(result)
    assert "3 of " in head and "adamw_sr 1 of 18" in head and "manifold_sr 0 of 18" in head
    assert f"modified z-score above {Z_LIMIT:g}" in head
    assert primary.startswith("Without the seeds that hold an outlying run, the primary contrast manifold_sr − "
                              "adamw_sr") and f"e4m3 {p2.kept.mean:+.4f} [" in primary and "over 5 pairs" in primary
    table = outlier_table(cells)
    assert "| e4m3 | adamw_sr | evaluation | 6 |" in table and "seed 2: " in table
    assert "| stage_w − fp32 stage_w | e4m3 | 6 |" in trimmed_table(list(rows.values()), 0.95)


def test_a_stall_in_the_recovery_reference_is_named_and_its_rows_shown_without_it() -> None:
    """The recovery reference (adamw_fm) is in no contrast, yet one stalled seed there rules every recovery row of
    its format: its cell is looked at, and each recovery row that pairs the seed is shown again without it."""
    result = run(_stalled(ladder_study(), {("e4m3", "adamw_fm", 4): 0.8}))
    cells = spreads(result)
    parts = {(c.format, c.arm): c.part for c in cells}
    assert parts[("e4m3", "adamw_fm")] == "recovery" and parts[("e4m3", "adamw_sr")] == "evaluation"
    assert len([c for c in cells if (c.format, c.arm) == ("e4m3", "adamw_sr")]) == 1   # a contrast's arm: once
    flagged = {(c.format, c.arm, s) for c in cells for s in c.outlying}
    assert ("e4m3", "adamw_fm", 4) in flagged
    rows = {(r.name, r.format): r for r in trimmed(result, cells)}
    row = rows[("manifold_sr − adamw_fm", "e4m3")]
    assert row.dropped == (4,) and row.full.n == 6 and row.kept.n == 5
    assert row.full.mean < row.kept.mean                        # the stall made every arm look ahead of adamw_fm
    assert row.kept.mean == pytest.approx(PLANTED[("e4m3", "manifold_sr")], abs=0.05)
    assert ("adamw_sr − adamw_fm", "e4m3") in rows and ("adamw_sr − adamw_fm", "e7m0") not in rows
    assert "| e4m3 | adamw_fm | recovery | 6 |" in outlier_table(cells)
    assert "adamw_fm 1 of 18" in finding_lines(result)[0]


def test_a_study_without_stalls_says_so() -> None:
    result = run(study(PLANTED))
    cells = spreads(result)
    assert not any(c.outlying for c in cells) and trimmed(result, cells) == []
    (line,) = finding_lines(result)
    assert line.endswith(f"none among {sum(len(c.values) for c in cells)} runs in {len(cells)} cells.")


def test_each_outlying_run_shows_where_it_was_halfway() -> None:
    """The halfway loss tells a seed left on the plateau (high at H/2 too) from one that went wrong late."""
    def with_curve(j: Job) -> Job:
        final = j.summary["final_val_loss"]
        halfway = 5.0 if (j.format, j.arm, j.seed) in STALLS else (final or 5.5) + 0.4
        return dataclasses.replace(j, curve=((0, 5.5), (24, halfway), (49, final or 5.5)))

    result = run([with_curve(j) for j in _stalled(ladder_study(), STALLS)])
    cells = {(c.format, c.arm): c for c in spreads(result)}
    adamw = cells[("e4m3", "adamw_sr")]
    assert adamw.midway_step == 24 and adamw.midway[2] == 5.0 and len(adamw.midway) == 6   # H = 50: step 24 ≤ 25
    table = outlier_table(list(cells.values()))
    assert "| median at step 24 | outlying runs: final loss (at step 24) |" in table
    assert f"seed 2: {adamw.values[2]:.3f} (5.000)" in table
    others = sorted(v for s, v in adamw.midway.items() if s != 2)
    assert f"| e4m3 | adamw_sr | evaluation | 6 | {adamw.median:.4f} | {np.median([*others, 5.0]):.4f} |" in table

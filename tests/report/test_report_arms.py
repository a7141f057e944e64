"""An arm-labelled declaration (endpoint ``label: arm``, study 2) on synthetic records of known truth: arms are
compared whatever their storage, contrasts keep their own formats, the secondary family, its interactions and the
controls get their own corrections and verdicts, the declared sign stands beside the observed one, and a study with
declared parts not yet run is reported, not refused."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from altgrad.report.cells import group_cells, job_field
from altgrad.report.findings import control_lines, format_control_lines, secondary_lines, study_lines
from altgrad.report.load import Job
from altgrad.report.stats import holm, t_test
from altgrad.report.study import analyse, declared_endpoints, missing_parts, sign_check
from altgrad.report.tables import study_table

FORMATS = ("e0m7", "e4m3", "e7m0")
STORAGE = {"adamw_sr": ("none", "stochastic"), "adamw_rn": ("none", "nearest"), "adamw_fm": ("fp32", "nearest"),
           "manifold_sr": ("none", "stochastic"), "manifold_rn": ("none", "nearest"),
           "manifold_fm": ("fp32", "nearest"), "relative_sr": ("none", "stochastic"),
           "relative_fm": ("fp32", "nearest"), "grid": ("none", "stochastic"), "madam_sr": ("none", "stochastic"),
           "stage_w": ("fp32", "nearest"), "stage_wag_rn": ("none", "nearest")}
OPTIMIZER = {"adamw": "adamw", "manifold": "manifold", "relative": "relative", "grid": "grid", "madam": "madam",
             "stage": "adamw"}
DECLARATION: dict[str, Any] = {
    "metric": "final_val_loss", "horizon": 50, "label": "arm",
    "contrasts": [{"name": "P1", "treatment": "manifold_sr", "reference": "relative_sr", "expect": "negative"},
                  {"name": "P2", "treatment": "manifold_sr", "reference": "adamw_sr", "expect": "negative"}],
    "primary": 1, "formats": list(FORMATS), "storage": "on-grid stochastic", "correction": "holm", "alpha": 0.05,
    "tie_margin": 0.03,
    "secondary": [{"name": "I1", "treatment": "adamw_rn", "reference": "adamw_sr", "expect": "positive"},
                  {"name": "I2", "treatment": "manifold_rn", "reference": "manifold_sr", "expect": "positive"},
                  {"name": "I4", "treatment": "madam_sr", "reference": "adamw_sr", "formats": ["e7m0"]}],
    "interactions": [{"name": "X1", "of": ["I1", "I2"], "expect": "positive"}],
    "controls": [{"name": "C1", "treatment": "manifold_fm", "reference": "relative_fm", "formats": ["e4m3"]}],
    "stages": {"reference": {"format": "fp32", "arm": "stage_w"}, "ladder": ["stage_w", "stage_wag_rn"]},
    "recovery": {"reference": "adamw_fm", "arms": ["adamw_sr", "manifold_sr"]},
}
ARMS_RUN = ("adamw_sr", "adamw_rn", "manifold_sr", "manifold_rn", "relative_sr", "adamw_fm")


def job(fmt: str, arm: str, seed: int, value: float | None, *, status: str = "completed",
        declaration: dict[str, Any] | None = None, lr: float = 1e-3, initial: float = 5.5) -> Job:
    """One job of an arm as the loader makes it, in memory: the arm's optimizer and weight storage in its config."""
    master, rounding = STORAGE[arm]
    optimizer = OPTIMIZER[arm.split("_")[0]]
    summary = {"status": status, "final_val_loss": value, "best_val_loss": value, "initial_val_loss": initial,
               "steps": 50, "seed": seed, "format": fmt, "optimizer": optimizer, "optimizer_label": optimizer,
               "lr": lr, "master": master, "storage_rounding": rounding, "experiment": "ongrid_test", "arm": arm,
               "config": {"endpoint": declaration or DECLARATION, "arm": arm, "seed": seed,
                          "optimizer": {"name": optimizer, "lr": lr},
                          "quant": {"master": master, "storage_rounding": rounding},
                          "format": {"name": fmt, "label": fmt}, "model": {"n_layer": 2}}}
    return Job(Path(f"{fmt}-{arm}-{seed}"), f"{fmt}/{arm}/{seed}", status, summary)


def study(effects: dict[tuple[str, str], float], seeds: int = 6, noise: float = 0.01, rng_seed: int = 0,
          arms: tuple[str, ...] = ARMS_RUN, extra: tuple[tuple[str, str], ...] = (("e7m0", "madam_sr"),
                                                                                 ("e4m3", "manifold_fm"),
                                                                                 ("e4m3", "relative_fm"))) -> list[Job]:
    """Per seed a shared format baseline, plus each arm's planted effect (by format) and its own noise."""
    rng = np.random.default_rng(rng_seed)
    jobs = []
    for fmt in FORMATS:
        for seed in range(1, seeds + 1):
            base = 2.0 + rng.normal(0.0, 0.05)
            for arm in (*arms, *(a for f, a in extra if f == fmt)):
                value = base + effects.get((fmt, arm), 0.0) + rng.normal(0.0, noise)
                jobs.append(job(fmt, arm, seed, float(value)))
    return jobs


def run(jobs: list[Job]):
    ((ep, members),) = declared_endpoints(jobs)
    return analyse(ep, members)


PLANTED = {**{(f, "manifold_sr"): -0.20 for f in ("e4m3", "e7m0")},          # P2 and P1 helped in e4m3, e7m0
           **{(f, "adamw_rn"): 0.30 for f in FORMATS},                        # I1: nearest storage stalls AdamW
           **{(f, "manifold_rn"): -0.20 + 0.05 for f in ("e4m3", "e7m0")},  # I2 = +0.05 there
           ("e0m7", "manifold_rn"): 0.05,
           ("e7m0", "madam_sr"): 0.40}


def test_arms_are_compared_whatever_their_storage() -> None:
    result = run(study(PLANTED))
    assert result.formats == FORMATS
    by = {(c.contrast.label, c.format): c for c in result.comparisons}
    assert by[("P2", "e4m3")].verdict == by[("P2", "e7m0")].verdict == "benefit"
    assert by[("P1", "e7m0")].verdict == "benefit"
    assert by[("P2", "e0m7")].verdict == "tie"  # the format control: no planted effect, noise 0.01 ≪ margin 0.03
    # I1 pairs on-grid nearest with on-grid stochastic AdamW: a storage the declaration's `storage` does not name
    sec = {(c.contrast.label, c.format): c for c in result.secondary}
    assert all(sec[("I1", f)].verdict == "harm" and len(sec[("I1", f)].deltas) == 6 for f in FORMATS)
    assert sec[("I1", "e4m3")].treatment.jobs[0].storage == "on-grid nearest"
    assert sec[("I1", "e4m3")].test.mean == pytest.approx(0.30, abs=0.02)


def test_a_contrast_keeps_its_own_formats() -> None:
    result = run(study(PLANTED))
    i4 = [c for c in result.secondary if c.contrast.label == "I4"]
    assert [c.format for c in i4] == ["e7m0"]
    assert i4[0].verdict == "harm" and i4[0].test.mean == pytest.approx(0.40, abs=0.02)
    c1 = result.controls
    assert [c.format for c in c1] == ["e4m3"]


def test_interaction_is_the_per_seed_double_difference() -> None:
    result = run(study(PLANTED))
    sec = {(c.contrast.label, c.format): c for c in result.secondary}
    for fmt in FORMATS:
        x, i1, i2 = sec[("X1", fmt)], sec[("I1", fmt)], sec[("I2", fmt)]
        assert x.deltas == pytest.approx({s: i1.deltas[s] - i2.deltas[s] for s in i1.deltas})
        assert x.test.mean == pytest.approx(t_test(list(x.deltas.values())).mean)
        assert x.contrast.name == "Δ(I1) − Δ(I2)" and x.contrast.expect == "positive"
    assert sec[("X1", "e4m3")].test.mean == pytest.approx(0.25, abs=0.02)
    assert sec[("X1", "e4m3")].verdict == "harm" and sign_check(sec[("X1", "e4m3")]) == "as declared"


def test_each_family_has_its_own_correction() -> None:
    result = run(study(PLANTED))
    for family in (result.comparisons, result.secondary, result.controls):
        assert [c.p_adjusted for c in family] == pytest.approx(holm([c.test.p_value for c in family]))
    assert len(result.comparisons) == 6          # P1, P2 × 3 formats
    assert len(result.secondary) == 3 + 3 + 1 + 3  # I1, I2 × 3, I4 × 1, X1 × 3
    assert result.family_level(result.secondary) == pytest.approx(0.05 / 10)


def test_controls_are_judged_by_equivalence_only() -> None:
    tie = run(study(PLANTED))
    assert tie.controls[0].verdict == "tie"
    far = run(study({**PLANTED, ("e4m3", "manifold_fm"): 0.5}))
    c = far.controls[0]
    assert c.test.p_value < 1e-6 and c.verdict == "not established"  # a large difference, still not a "harm"
    (line,) = control_lines(far)
    assert "C1 (manifold_fm − relative_fm), expected ≈ 0 and judged by equivalence only" in line
    assert f"e4m3: Δ = {c.test.mean:+.4f}" in line and c.test.mean > 0.45
    assert "equivalence not shown (its CI lies beyond ±0.03: the control does not hold at this margin)" in line


def test_declared_sign_beside_the_observed_one() -> None:
    result = run(study({**PLANTED, ("e4m3", "relative_sr"): -0.40}))  # P1 in e4m3: manifold_sr above relative_sr
    p1 = {c.format: c for c in result.comparisons if c.contrast.label == "P1"}
    assert p1["e4m3"].verdict == "harm" and sign_check(p1["e4m3"]) == "against the declaration"
    assert sign_check(p1["e7m0"]) == "as declared"
    assert sign_check(p1["e0m7"]) == "not established"
    lines = study_lines(result, "ongrid_test")
    (p1_line,) = [line for line in lines if line.startswith("P1 (manifold_sr − relative_sr): ")]
    assert "Declared sign: negative; observed: " in p1_line
    assert "against the declaration in e4m3" in p1_line and "as declared in e7m0" in p1_line
    table = study_table(result)
    assert "| declared sign | observed vs declared |" in table.splitlines()[0]
    assert "| P1: manifold_sr − relative_sr | e4m3 |" in table


def test_format_control_shows_its_equivalence_test() -> None:
    result = run(study(PLANTED))
    lines = format_control_lines(result)
    assert all("TOST ±0.03 holm p = " in line and "equivalent (a tie)" in line for line in lines)
    # against AdamW (uniform within a tensor) e0m7 is the control; against the relative step (∝ |w|) it is not
    shape, control = lines
    assert control.startswith("Format control e0m7 (no exponent bits: one ULP per tensor, where a ULP-aware step is "
                              "a plain one at a per-tensor lr set by the tensor's largest |w|, so Δ ≈ 0 is "
                              "expected unless that scaling matters): P2 (manifold_sr − adamw_sr) Δ = ")
    assert shape.startswith("Format e0m7 is no control for P1 (manifold_sr − relative_sr) (no exponent bits")
    assert "Δ ≈ 0 is not expected): Δ = " in shape
    noisy = run(study(PLANTED, seeds=3, noise=0.08, rng_seed=3))
    text = " ".join(format_control_lines(noisy))
    assert "equivalence not shown; underpowered: needs ≈ " in text


def test_secondary_lines_name_the_family() -> None:
    lines = secondary_lines(run(study(PLANTED)))
    assert lines[0].startswith("Secondary family (the why, by intervention within a format): 7 contrast test(s) "
                               "and 3 interaction test(s)")
    (x1,) = [line for line in lines if line.startswith("X1 (Δ(I1) − Δ(I2)): ")]
    assert "positive (Δ(I1) above Δ(I2)) in e0m7" in x1 and "Declared sign: positive" in x1


def test_a_partial_study_says_what_is_missing() -> None:
    # the evaluation of P1 (relative_sr) and the whole failure-stage ladder have not run yet
    jobs = study(PLANTED, arms=tuple(a for a in ARMS_RUN if a != "relative_sr"))
    result = run(jobs)
    p1 = [c for c in result.comparisons if c.contrast.label == "P1"]
    assert all(c.why_missing == "no relative_sr runs" and c.verdict == "not established" for c in p1)
    assert all(math.isclose(c.p_adjusted, 1.0) for c in p1)
    absent = {arm: (fmts, needs) for arm, fmts, needs in missing_parts(result)}
    assert absent["relative_sr"] == (FORMATS, ("P1",))
    assert absent["stage_w"] == (("fp32", *FORMATS), ("failure stages",))
    assert absent["stage_wag_rn"] == (FORMATS, ("failure stages",))
    assert "adamw_fm" not in absent and "manifold_sr" not in absent
    lines = study_lines(result, "ongrid_test")
    (line,) = [x for x in lines if x.startswith("Declared parts with no records yet")]
    assert "relative_sr in e0m7, e4m3, e7m0 (for P1)" in line and "stage_wag_rn in e0m7, e4m3, e7m0" in line


def test_ladder_runs_are_kept_apart_and_named_present() -> None:
    jobs = study(PLANTED) + [job("fp32", "stage_w", s, 1.9) for s in range(1, 4)] + [
        job(f, a, s, 2.1) for f in FORMATS for a in ("stage_w", "stage_wag_rn") for s in range(1, 4)]
    result = run(jobs)
    assert {j.arm for j in result.ladder_jobs} == {"stage_w", "stage_wag_rn"}
    assert not any(j.arm.startswith("stage") for j in result.jobs)
    assert [arm for arm, _, _ in missing_parts(result)] == []


def test_cells_are_labelled_by_arm() -> None:
    jobs = study(PLANTED, seeds=2)
    assert {job_field(j, "optimizer_label") for j in jobs} >= {"adamw_sr", "adamw_rn", "manifold_sr"}
    cells = group_cells(jobs)
    labels = {(c["format"], c["optimizer_label"]) for c in cells}
    assert ("e4m3", "adamw_rn") in labels and ("e4m3", "adamw_sr") in labels
    assert all(len(c.jobs) == 2 for c in cells)


def ladder_study(rng_seed: int = 5, seeds: int = 6) -> list[Job]:
    """The evaluation above plus a failure-stage ladder: e7m0 fails at stage_w (+0.2), e4m3 at stage_wag_rn (+0.3),
    e0m7 nowhere (+0.01 at most); e0m7's seed 1 at stage_wag_rn diverged (enters at its initial loss 5.5)."""
    rng = np.random.default_rng(rng_seed)
    planted = {("e7m0", "stage_w"): 0.2, ("e7m0", "stage_wag_rn"): 0.25, ("e4m3", "stage_wag_rn"): 0.3,
               ("e0m7", "stage_wag_rn"): 0.01}
    jobs = study(PLANTED, seeds=seeds)
    for seed in range(1, seeds + 1):
        base = 1.9 + rng.normal(0.0, 0.05)
        jobs.append(job("fp32", "stage_w", seed, float(base + rng.normal(0.0, 0.005))))
        for fmt in FORMATS:
            for arm in ("stage_w", "stage_wag_rn"):
                if (fmt, arm, seed) == ("e0m7", "stage_wag_rn", 1):
                    jobs.append(job(fmt, arm, seed, None, status="diverged", initial=5.5))
                    continue
                jobs.append(job(fmt, arm, seed, float(base + planted.get((fmt, arm), 0.0)
                                                      + rng.normal(0.0, 0.005))))
    return jobs


def test_ladder_names_the_failing_stage_per_format() -> None:
    from altgrad.report.findings import ladder_lines
    from altgrad.report.ladder import ladder, p_exceeds

    lad = ladder(run(ladder_study()))
    assert lad is not None and lad.reference_seeds == 6 and lad.formats == FORMATS
    assert [(r.format, r.arm) for r in lad.rungs] == [(f, a) for f in FORMATS for a in ("stage_w", "stage_wag_rn")]
    assert lad.failing("e7m0").arm == "stage_w"
    assert lad.failing("e4m3").arm == "stage_wag_rn"
    assert lad.failing("e0m7") is None
    rungs = {(r.format, r.arm): r for r in lad.rungs}
    assert [r.p_adjusted for r in lad.rungs] == pytest.approx(holm([r.p_exceeds for r in lad.rungs]))
    e4 = rungs[("e4m3", "stage_wag_rn")]
    assert e4.vs_previous.mean == pytest.approx(0.3, abs=0.01)     # its step over stage_w
    assert p_exceeds(e4.vs_reference, 0.03) == e4.p_exceeds
    diverged = rungs[("e0m7", "stage_wag_rn")]
    assert diverged.failures == 1 and diverged.runs == 6 and len(diverged.deltas) == 6  # counted, never dropped
    assert diverged.deltas[1] > 3.0                                  # 5.5 − the reference's ≈ 1.9
    (line,) = ladder_lines(lad)
    assert f"e4m3 first fails at **stage_wag_rn** (Δ = {e4.vs_reference.mean:+.4f}" in line
    assert e4.vs_reference.mean == pytest.approx(0.3, abs=0.01) and "e7m0 first fails at **stage_w** (" in line
    assert "e0m7: no stage fails (2 stage(s) with two or more seed pairs" in line


def _layer_map(input_: bool, grad: bool) -> dict[str, Any]:
    spec = {"format": {"name": "e4m3"}}
    return {name: {"weight": spec, "input": spec if input_ else None, "grad": spec if grad else None, "tied": False}
            for name in ("transformer.h.0.mlp.c_fc", "lm_head")}


def test_the_ladder_reads_what_each_rung_ran_and_says_when_rungs_cannot_be_told_apart() -> None:
    """Each rung shows what its runs quantized, from their layer_map.json and storage; a rung that ran what an earlier
    rung ran (study 2's first code state: every stage ran as stage_w) is named as a problem in the findings."""
    from dataclasses import replace

    from altgrad.report.findings import ladder_lines
    from altgrad.report.ladder import ladder, what_ran
    from altgrad.report.tables import ladder_table

    def planted(faithful: bool) -> list[Job]:
        """stage_wag_rn's runs as recorded: faithful, or (as study 2's first code state ran it) weights only."""
        out = []
        for j in ladder_study():
            if j.arm == "stage_w":
                j = replace(j, layer_map=_layer_map(False, False))
            elif j.arm == "stage_wag_rn":
                j = replace(j, layer_map=_layer_map(faithful, faithful),
                            summary={**j.summary, **({} if faithful else {"master": "fp32"})})
            out.append(j)
        return out

    good = ladder(run(planted(True)))
    rungs = {(r.format, r.arm): r for r in good.rungs}
    assert rungs[("e4m3", "stage_w")].ran == ("W",)
    assert rungs[("e4m3", "stage_wag_rn")].ran == ("W+A+G, stored, nearest",)
    assert good.problems == () and len(ladder_lines(good)) == 1
    assert "| e4m3 | stage_wag_rn | W+A+G, stored, nearest |" in ladder_table(good)
    bad = ladder(run(planted(False)))
    assert bad.problems == tuple(f"{f} stage_wag_rn ran the same as stage_w (W): the ladder cannot tell those "
                                 "stages apart" for f in FORMATS)
    assert ladder_lines(bad)[-1].startswith("**The ladder's runs do not separate its stages")
    mixed = ladder(run([replace(j, layer_map=_layer_map(j.seed == 1, False)) if j.arm == "stage_w" else j
                        for j in ladder_study()]))
    assert "e4m3 stage_w: its runs quantized different things (W; W+A)" in mixed.problems
    assert what_ran(Job(Path("x"), "x", "completed", {})) is None  # no layer map: nothing claimed


def test_recovery_says_what_storage_costs_and_who_recovers() -> None:
    from altgrad.report.findings import recovery_lines
    from altgrad.report.ladder import recovery

    result = run(study(PLANTED))
    rows = {(r.format, r.arm): r for r in recovery(result)}
    assert set(rows) == {(f, a) for f in FORMATS for a in ("adamw_sr", "manifold_sr")}  # Madam not run: left out
    assert all(rows[(f, "adamw_sr")].verdict == "recovers" for f in FORMATS)
    assert rows[("e4m3", "manifold_sr")].verdict == "gains" and rows[("e0m7", "manifold_sr")].verdict == "recovers"
    (line,) = recovery_lines(result, recovery(result))
    assert line.startswith("Recovery (arm − adamw_fm, the same forward grid on float32 master weights")
    assert "e4m3: recovers — adamw_sr" in line and "gains — manifold_sr -0.2" in line


def test_a_recovery_arm_rerun_at_a_hand_set_lr_stays_out_of_its_recovery_row() -> None:
    """A sensitivity stage's runs of a recovery arm at another lr (study 2's `sens_ref`: adamw_sr at 0.00398) leave
    its recovery row as it was; they once made the arm "ran 2 learning rates" and dropped the row."""
    from dataclasses import replace

    from altgrad.report.ladder import recovery

    jobs = study(PLANTED)
    before = {(r.format, r.arm): r for r in recovery(run(jobs))}
    rerun = [replace(j, summary={**j.summary, "lr": 5e-4}, overrides=("optimizer.lr=5e-4",))
             for j in jobs if j.arm == "adamw_sr"]
    after = {(r.format, r.arm): r for r in recovery(run(jobs + rerun))}
    assert set(after) == set(before) and all((f, "adamw_sr") in after for f in FORMATS)
    assert all(after[k].test.mean == before[k].test.mean and after[k].verdict == before[k].verdict for k in before)


def test_the_declaration_describes_what_an_arm_study_adds() -> None:
    ((ep, _),) = declared_endpoints(study(PLANTED, seeds=2))
    text = ep.describe()
    assert "; cells named by arm (compared whatever their storage); named: P1 manifold_sr − relative_sr (expect " \
           "negative), P2 manifold_sr − adamw_sr (expect negative); secondary family: I1 adamw_rn − adamw_sr " \
           "(expect positive)" in text
    assert "I4 madam_sr − adamw_sr in e7m0; interactions: X1 = Δ(I1) − Δ(I2) (expect positive); controls (TOST " \
           "only): C1 manifold_fm − relative_fm in e4m3; failure stages stage_w → stage_wag_rn against fp32 " \
           "stage_w; recovery of adamw_sr, manifold_sr against adamw_fm" in text


def test_cell_tables_title_the_label_column_arm() -> None:
    from altgrad.report.tables import cell_table

    header = cell_table(group_cells(study(PLANTED, seeds=2))).splitlines()[0]
    assert header.startswith("| format | storage | arm |")


def test_the_mechanism_by_intervention_in_one_line() -> None:
    from altgrad.report.findings import intervention_lines

    (line,) = intervention_lines(run(study(PLANTED)))
    assert line.startswith("The mechanism by intervention, declared sign against the runs: P1 (expect negative): "
                           "not established in e0m7, as declared in e4m3/e7m0; P2 (expect negative): ")
    assert "I1 (expect positive): as declared in e0m7/e4m3/e7m0" in line
    assert "X1 (expect positive): as declared in e0m7/e4m3/e7m0" in line
    assert line.endswith("; C1 (expect ≈ 0): tie in e4m3.")


def _ladder_and_tuning() -> list[Job]:
    """A study before its evaluation: the ladder (stage_wag_rn quantizes inputs and gradients too) and the reference
    tuning (weights only, no endpoint in its config, as the tune stages run), each with a val/loss curve."""
    from dataclasses import replace

    out = []
    for j in ladder_study():
        if j.arm not in ("stage_w", "stage_wag_rn"):
            continue
        wag = j.arm == "stage_wag_rn"
        final = j.summary["final_val_loss"] or 5.5
        out.append(replace(j, layer_map=_layer_map(wag, wag), curve=((0, 5.5), (50, final))))
    for fmt in FORMATS:
        for lr in (1e-3, 2e-3, 4e-3):
            for seed in (201, 202):
                t = job(fmt, "adamw_sr", seed, 2.0 + abs(lr - 2e-3) * 100, lr=lr)
                t.summary.update(experiment="ongrid_tune_ref")
                t.summary["config"] = {k: v for k, v in t.summary["config"].items() if k != "endpoint"}
                out.append(replace(t, layer_map=_layer_map(False, False)))
    return out


def test_before_the_evaluation_the_caveats_describe_the_runs_it_will_compare_not_the_ladder() -> None:
    """The ladder's rungs quantize activations and gradients by design; before any evaluation run the caveats'
    'what a format is applied to' comes from the other runs (here the tuning, weights only), not from the ladder."""
    from altgrad.report.caveats import caveat_lines, roles_line

    jobs = _ladder_and_tuning()
    ((ep, members),) = declared_endpoints(jobs)
    result = analyse(ep, members)
    assert result.declared_jobs == () and len(result.ladder_jobs) > 0
    lines = caveat_lines(jobs, [], [result])
    roles = next(line for line in lines if line.startswith("What a format is applied to"))
    assert "activations" not in roles and "not of the weight grid alone" not in roles
    assert "on-grid nearest" not in next(line for line in lines if line.startswith("Storage:"))
    assert "activations" in roles_line(list(result.ladder_jobs))  # what the fallback would have said


def test_the_ladder_curves_are_one_line_per_rung_with_the_reference_in_every_panel() -> None:
    from altgrad.report.document import REFERENCE_LINE, ladder_curves

    jobs = _ladder_and_tuning()
    ((ep, members),) = declared_endpoints(jobs)
    groups = ladder_curves(analyse(ep, members))
    assert [(g.panel, g.arm) for g in groups] == [
        (f, a) for f in FORMATS for a in ("stage_w", "stage_wag_rn", REFERENCE_LINE)]
    assert all(len(g.jobs) == 6 for g in groups)
    reference = [g for g in groups if g.arm == REFERENCE_LINE]
    assert all(g.dashed and g.label == "fp32 stage_w (reference)" for g in reference)
    assert all(j.format == "fp32" for g in reference for j in g.jobs)
    assert ladder_curves(run(study(PLANTED, seeds=2))) == []  # no ladder declared runs: no lines


def test_a_rung_with_one_seed_pair_is_named_not_judged() -> None:
    """One seed pair has no test: such a rung is never summed up as 'no stage fails', and a failing stage above one
    says that a stage before it is not judged yet."""
    from altgrad.report.findings import ladder_lines
    from altgrad.report.ladder import ladder

    jobs = [j for j in ladder_study()
            if not (j.format == "e0m7" and j.arm == "stage_wag_rn" and j.seed > 1)      # e0m7's top rung: seed 1
            and not (j.format == "e4m3" and j.arm == "stage_w" and j.seed > 1)]        # e4m3's first rung: seed 1
    (line,) = ladder_lines(ladder(run(jobs)))
    assert "e0m7: no stage fails (1 stage(s) with two or more seed pairs; largest Δ" in line
    assert "at stage_w, Holm p = 1) — one seed pair only, not judged: stage_wag_rn (Δ +3." in line
    assert "e4m3 first fails at **stage_wag_rn**" in line
    assert "— before it, one seed pair only, not judged: stage_w (Δ " in line

"""The declared-endpoint analysis on synthetic records of known truth: planted effects are found, null studies
claim a benefit no more often than the nominal rate, failures count against their arm, and declarations are checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from report_synthetic import write_job

from altgrad.report.endpoint import Contrast, parse_endpoint
from altgrad.report.findings import direction, sensitivity_lines, study_lines, study_why_lines
from altgrad.report.load import Job, load_sweeps
from altgrad.report.sensitivity import neighbours
from altgrad.report.stats import tost_seeds_needed
from altgrad.report.tables import ranking_table
from altgrad.report.study import analyse, declared_endpoints, endpoint_problems, grid_classes

FORMATS = ("e3m4", "e4m3", "e5m2", "e7m0")
ARMS = ("adamw", "manifold[update]", "relative")
DECLARATION: dict[str, Any] = {
    "metric": "final_val_loss", "horizon": 50,
    "contrasts": [{"treatment": "manifold[update]", "reference": "adamw"},
                  {"treatment": "manifold[update]", "reference": "relative"}],
    "formats": list(FORMATS), "correction": "holm", "alpha": 0.05, "tie_margin": 0.02,
}


def job(fmt: str, label: str, seed: int, value: float | None, *, status: str = "completed",
        declaration: dict[str, Any] | None = None, lr: float = 1e-3, steps: int = 50,
        initial: float | None = 5.5) -> Job:
    """One job as the loader makes it, in memory (no files: the null-study simulation builds thousands)."""
    summary = {"status": status, "final_val_loss": value, "best_val_loss": value, "initial_val_loss": initial,
               "steps": steps, "seed": seed, "format": fmt, "optimizer": label.split("[")[0],
               "optimizer_label": label, "lr": lr, "master": "fp32", "experiment": "study_test",
               "config": {"endpoint": declaration or DECLARATION}}
    return Job(Path(f"{fmt}-{label}-{seed}"), f"{fmt}/{label}/{seed}", status, summary)


def study(effects: dict[tuple[str, str], float], rng: np.random.Generator, seeds: int = 5, noise: float = 0.02,
          declaration: dict[str, Any] | None = None) -> list[Job]:
    """Per seed a shared format baseline (init and data order), plus the arm's planted effect and its own noise."""
    jobs = []
    for fmt in FORMATS:
        for seed in range(seeds):
            base = 3.0 + rng.normal(0.0, 0.05)
            for label in ARMS:
                value = base + effects.get((fmt, label), 0.0) + rng.normal(0.0, noise)
                jobs.append(job(fmt, label, seed, float(value), declaration=declaration))
    return jobs


def run(jobs: list[Job], same_grid=None):
    ((ep, members),) = declared_endpoints(jobs)
    return analyse(ep, members, same_grid)


def claims_benefit(lines: list[str]) -> bool:
    return any("**Answer:" in line or "lower loss (treatment helps)" in line for line in lines)


def test_planted_effect_is_found_and_ranked() -> None:
    rng = np.random.default_rng(1)
    result = run(study({("e5m2", "manifold[update]"): -0.30, ("e4m3", "manifold[update]"): -0.10}, rng))
    verdicts = {(c.contrast.reference, c.format): c.verdict for c in result.comparisons}
    assert verdicts[("adamw", "e5m2")] == verdicts[("relative", "e5m2")] == "benefit"
    assert verdicts[("adamw", "e4m3")] == "benefit"
    assert verdicts[("adamw", "e3m4")] in ("not established", "tie")
    assert result.ranking.winner == "e5m2" and result.ranking.top_probability["e5m2"] > 0.95
    lines = study_lines(result, "study_test")
    assert any(line.startswith("**Answer: e5m2 benefits most** from manifold[update] − adamw: Δ = -0.29")
               for line in lines)
    assert lines[0].startswith("Declared endpoint (study_test), read from the jobs' saved config: metric "
                               "final_val_loss at step 50")
    assert "= 8 tests" in lines[0]


def test_close_leaders_are_not_ranked() -> None:
    rng = np.random.default_rng(2)
    result = run(study({("e5m2", "manifold[update]"): -0.30, ("e4m3", "manifold[update]"): -0.29}, rng))
    primary = {c.format: c.verdict for c in result.of(result.endpoint.primary_contrast)}
    assert primary["e5m2"] == primary["e4m3"] == "benefit"
    assert result.ranking.winner is None and result.ranking.leader in ("e5m2", "e4m3")
    lines = study_lines(result)
    assert any(line.startswith("Which format benefits most: **not established**. Point-estimate leader")
               and "its lead is within the paired CI" in line for line in lines)


def test_no_leader_is_named_where_every_point_estimate_is_a_harm() -> None:
    """Manifold worse than AdamW in every format: the lowest Δ is no lead in benefit, and the line says so."""
    harm = {(f, "manifold[update]"): d for f, d in zip(FORMATS, (0.05, 0.08, 0.12, 0.20))}
    result = run(study(harm, np.random.default_rng(4), noise=0.05))
    primary = {c.format: c for c in result.of(result.endpoint.primary_contrast)}
    assert result.ranking.winner is None and all(c.test.mean > 0 for c in primary.values())
    (line,) = [x for x in study_lines(result) if x.startswith("Which format benefits most")]
    low = primary[result.ranking.leader]
    assert line.startswith("Which format benefits most: **not established**. No format's point estimate on "
                           f"manifold[update] − adamw lies below zero: the lowest is {result.ranking.leader}'s "
                           f"(Δ = {low.test.mean:+.4f}, ")
    assert "leader" not in line and "survive" not in line
    table = ranking_table(result)  # the table's column and cell say "lowest" too
    assert "leader" not in table and "Δ(lowest) − Δ(format)" in table and f"| {result.ranking.leader} |" in table


@pytest.mark.slow
def test_null_studies_claim_a_benefit_at_most_at_the_nominal_rate() -> None:
    rng = np.random.default_rng(20261125)
    n_studies, claims, rejections = 200, 0, 0
    for _ in range(n_studies):
        result = run(study({}, rng, noise=0.05))
        lines = study_lines(result)
        benefit = any(c.verdict == "benefit" for c in result.comparisons) or result.ranking.winner is not None
        assert benefit == claims_benefit(lines)  # the text claims exactly what the verdicts say
        claims += benefit
        rejections += any(c.verdict in ("benefit", "harm") for c in result.comparisons)
    # Holm keeps the family-wise error of the 8 tests at or below α = 0.05 (a benefit claim is one side of it)
    assert claims <= 0.05 * n_studies
    assert rejections <= 0.05 * n_studies + 2 * np.sqrt(0.05 * 0.95 * n_studies)


@pytest.mark.slow
def test_without_correction_the_same_nulls_claim_more() -> None:
    """The check above can fail: uncorrected, 8 tests per study reject far more often than α."""
    rng = np.random.default_rng(20261125)
    loose = dict(DECLARATION, correction="none")
    rejections = sum(any(c.verdict in ("benefit", "harm") for c in run(study({}, rng, noise=0.05, declaration=loose))
                         .comparisons) for _ in range(100))
    assert rejections > 15


def test_tie_only_by_equivalence() -> None:
    rng = np.random.default_rng(3)
    tight = run(study({}, rng, noise=0.002, seeds=6))
    assert all(c.verdict == "tie" for c in tight.comparisons)
    assert all(c.tost_adjusted < 0.05 for c in tight.comparisons)
    loose = run(study({}, np.random.default_rng(3), noise=0.05, seeds=3))
    assert not any(c.verdict == "tie" for c in loose.comparisons)  # no evidence of a difference is not a tie
    lines = study_lines(tight)
    assert any("equivalent within ±0.02 (TOST) in e3m4" in line for line in lines)


def test_diverged_runs_count_as_failures_not_dropped() -> None:
    rng = np.random.default_rng(4)
    jobs = study({("e7m0", "manifold[update]"): -0.05}, rng)
    # two manifold seeds of e7m0 diverge: they enter with their initial loss (5.5), not dropped
    jobs = [job("e7m0", "manifold[update]", j.seed, None, status="diverged")
            if j.format == "e7m0" and j.optimizer_label == "manifold[update]" and j.seed in (0, 1) else j
            for j in jobs]
    result = run(jobs)
    c = next(c for c in result.of(Contrast("manifold[update]", "adamw")) if c.format == "e7m0")
    assert len(c.deltas) == 5 and c.deltas[0] == pytest.approx(5.5 - result.arms[("e7m0", "adamw")].values[0])
    assert c.treatment.n_failures == 2 and c.verdict != "benefit"
    assert any("Failures (diverged or never learned), entered in Δ at their initial validation loss" in line
               and "e7m0 manifold[update] 2/5" in line for line in study_lines(result))
    # without its own initial loss a failure takes the largest initial loss of its format
    jobs2 = [job(j.format, j.optimizer_label, j.seed, None, status="diverged", initial=None)
             if j.state == "diverged" else j for j in jobs]
    assert run(jobs2).arms[("e7m0", "manifold[update]")].values[0] == 5.5
    # survivorship, for comparison only: excluded, the three surviving seeds remain
    excluded = run(study({}, np.random.default_rng(4), declaration=dict(DECLARATION, failure_value="exclude"))
                   [:0] + [job(j.format, j.optimizer_label, j.seed, j.final_loss, status=j.state,
                               declaration=dict(DECLARATION, failure_value="exclude")) for j in jobs])
    assert len(next(c for c in excluded.comparisons if c.format == "e7m0").deltas) == 3


def test_shared_grids_are_one_arm_and_missing_formats_stay_in_the_family() -> None:
    declaration = dict(DECLARATION, formats=["e0m7", "e1m6", "e4m3", "p3109_p2"])
    rng = np.random.default_rng(5)
    jobs = [job(fmt, label, seed, 3.0 + rng.normal(0, 0.02), declaration=declaration)
            for fmt in ("e0m7", "e1m6", "e4m3") for seed in range(3) for label in ARMS]
    same = {frozenset(("e0m7", "e1m6"))}
    result = run(jobs, lambda a, b: frozenset((a, b)) in same)
    assert result.formats == ("e0m7", "e4m3", "p3109_p2")
    assert result.merged == {"e0m7": ("e0m7", "e1m6")}
    assert result.missing_formats == ("p3109_p2",)
    assert len(result.comparisons) == 6
    missing = [c for c in result.comparisons if c.format == "p3109_p2"]
    assert all(c.p_adjusted == 1.0 and c.why_missing == "no manifold[update] runs" for c in missing)
    lines = study_lines(result)
    assert "e0m7, e1m6 give the same grid under the runs' scaling: analysed as one arm (e0m7), not as separate " \
           "formats." in lines
    only_e0m7 = run([j for j in jobs if j.format != "e1m6"], lambda a, b: frozenset((a, b)) in same)
    assert only_e0m7.missing_formats == ("p3109_p2",)  # e1m6's grid ran, as e0m7: not "declared but not run"
    assert grid_classes(["e1m6", "e0m7", "e5m2"], None) == {"e0m7": ("e0m7",), "e1m6": ("e1m6",),
                                                             "e5m2": ("e5m2",)}


def test_arms_with_several_lrs_or_short_runs_are_not_analysed_as_if_tuned() -> None:
    rng = np.random.default_rng(6)
    jobs = study({}, rng)
    jobs += [job("e4m3", "adamw", s, 2.0, lr=3e-3) for s in range(5)]
    jobs = [job(j.format, j.optimizer_label, j.seed, j.final_loss, steps=40) if j.format == "e3m4"
            and j.optimizer_label == "relative" and j.seed == 0 else j for j in jobs]
    result = run(jobs)
    assert result.arms[("e4m3", "adamw")].values == {}
    assert any("e4m3 adamw ran 2 learning rates" in n for n in result.notes)
    assert any("stopped at step 40 < horizon 50" in n for n in result.notes)
    assert 0 not in result.arms[("e3m4", "relative")].values


def test_pooled_variance_adds_degrees_of_freedom() -> None:
    rng = np.random.default_rng(7)
    pooled = run(study({}, rng, declaration=dict(DECLARATION, pooled_variance=True)))
    assert {c.test.df for c in pooled.comparisons} == {16.0}  # 4 formats × (5 − 1)
    plain = run(study({}, np.random.default_rng(7)))
    assert {c.test.df for c in plain.comparisons} == {4}


@pytest.mark.parametrize("raw, message", [
    ({"metric": "val_ppl", "contrasts": [{"treatment": "a", "reference": "b"}]}, "endpoint.metric='val_ppl'"),
    ({"contrasts": []}, "endpoint.contrasts=[]"),
    ({"contrasts": [{"treatment": "a", "reference": "a"}]}, "endpoint.contrasts[0]"),
    ({"contrasts": [{"treatment": "a", "reference": "b"}], "primary": 1}, "endpoint.primary=1"),
    ({"contrasts": [{"treatment": "a", "reference": "b"}], "correction": "sidak"},
     "endpoint.correction=.sidak. is invalid; valid: holm, bh, none"),
    ({"contrasts": [{"treatment": "a", "reference": "b"}], "alpha": 0.7}, "endpoint.alpha=0.7"),
    ({"contrasts": [{"treatment": "a", "reference": "b"}], "tie_margin": 0}, "endpoint.tie_margin=0"),
    ({"contrasts": [{"treatment": "a", "reference": "b"}], "horizon": 0}, "endpoint.horizon=0"),
    ({"contrasts": [{"treatment": "a", "reference": "b"}], "formats": ["e4m3", "e4m3"]}, "endpoint.formats"),
    ({"contrasts": [{"treatment": "a", "reference": "b"}], "colour": 1}, "endpoint.colour is not a known key"),
])
def test_bad_declarations_are_one_line_errors(raw: dict, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("[", r"\[").replace("(", r"\(")) as exc:
        parse_endpoint(raw)
    assert "\n" not in str(exc.value) and "valid" in str(exc.value)


def test_declaration_defaults_and_description() -> None:
    ep = parse_endpoint({"contrasts": [{"treatment": "manifold[update]", "reference": "adamw"}]})
    assert (ep.metric, ep.correction, ep.alpha, ep.storage, ep.failure_value) == (
        "final_val_loss", "holm", 0.05, "fp32 master", "initial_val_loss")
    assert "(1) manifold[update] − adamw [primary]" in ep.describe()


def test_declaration_read_from_saved_configs(tmp_path: Path) -> None:
    for seed in range(2):
        for opt, loss in (("adamw", 3.0), ("manifold", 2.9)):
            write_job(tmp_path / f"{opt}{seed}", fmt="e4m3", optimizer=opt, seed=seed, final=loss + 0.01 * seed,
                      config={"endpoint": DECLARATION, "format": {"name": "e4m3"}})
    write_job(tmp_path / "bad", fmt="e4m3", optimizer="adamw", seed=9, final=3.0,
              config={"endpoint": {"contrasts": []}})
    jobs = load_sweeps([tmp_path]).jobs
    ((ep, members),) = declared_endpoints(jobs)
    assert ep == parse_endpoint(DECLARATION) and len(members) == 4
    (problem,) = endpoint_problems(jobs)
    assert problem.startswith("bad: endpoint.contrasts=[] is invalid")


def test_formats_outside_the_family_are_described_not_tested() -> None:
    rng = np.random.default_rng(8)
    jobs = study({}, rng)
    jobs += [job("bf16_ref", label, seed, 3.0 - (0.1 if label == "manifold[update]" else 0.0) + 0.001 * seed)
             for seed in range(5) for label in ARMS]
    result = run(jobs)
    assert len(result.comparisons) == 8 and result.formats == FORMATS  # the family is what was declared
    (ref,) = result.outside
    assert ref.format == "bf16_ref" and ref.test.mean == pytest.approx(-0.1)
    assert any(line.startswith("Outside the declared family (descriptive, uncorrected; a gain there too is not "
                               "specific to the 8-bit grids): bf16_ref manifold[update] − adamw Δ = -0.1000")
               for line in study_lines(result))


def test_the_study_is_plotted_against_mantissa_bits(tmp_path: Path) -> None:
    from altgrad.report import plots

    jobs = study({("e7m0", "manifold[update]"): -0.3}, np.random.default_rng(7))
    for j in jobs:  # the mechanism: AdamW's updates fall below half a ULP more often on the coarser grids
        share = {"e3m4": 0.2, "e4m3": 0.4, "e5m2": 0.6, "e7m0": 0.9}[j.format] if j.optimizer == "adamw" else 0.05
        j.summary["diagnostics"] = {"sub_half_ulp_share": share}
    result = run(jobs)
    shares = plots.sub_half_ulp_by_mantissa(result)
    assert shares["adamw"] == [(0, 0.9), (2, 0.6), (3, 0.4), (4, 0.2)]
    assert shares["manifold[update]"] == shares["relative"] == [(0, 0.05), (2, 0.05), (3, 0.05), (4, 0.05)]
    path = plots.plot_study_by_mantissa(result, tmp_path / "by_mantissa.png")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = run([job(f, a, s, None, status="failed") for f in FORMATS for a in ARMS for s in range(2)])
    assert plots.plot_study_by_mantissa(empty, tmp_path / "none.png") is None


def test_the_why_is_read_from_the_study_arms_and_stays_exploratory() -> None:
    jobs = study({(f, "manifold[update]"): d for f, d in zip(FORMATS, (-0.02, -0.1, -0.2, -0.4))},
                 np.random.default_rng(11))
    share = dict(zip(FORMATS, (0.2, 0.4, 0.6, 0.9)))  # more of AdamW's update below ½ ULP where the gain is larger
    for j in jobs:
        j.summary["diagnostics"] = {"sub_half_ulp_share": share[j.format] if j.optimizer == "adamw" else 0.05,
                                    "mean_stall_ratio": 0.5}
    lines = study_why_lines(run(jobs))
    assert lines[0].startswith("Why (exploratory, outside the declared family): 1 rank correlation(s) of a "
                               "mechanism metric of adamw with Δ(manifold[update] − adamw) across n = 4 formats")
    assert lines[1].startswith("Why: adamw's share of updates < ½ ULP vs Δ(manifold[update] − adamw), 4 formats: "
                               "Spearman ρ = -1.00, p = 0.0833, Holm p = 0.0833 — the higher adamw's share of updates "
                               "< ½ ULP, the lower Δ (more gain from the treatment)")
    assert "no association established" in lines[1]  # 4 points: the exact p is 1/24 · 2 > 0.05 at best
    assert not any("stall ratio vs" in line for line in lines)  # constant: no correlation to state
    assert "e7m0 (Δ = " in lines[-1] and "share of updates < ½ ULP 0.9 → 0.05" in lines[-1]
    bare = run(study({}, np.random.default_rng(1)))
    assert study_why_lines(bare) == ["No mechanism diagnostics were recorded in the study's summaries, so it cannot "
                                     "show why."]


def test_a_correlation_sentence_follows_the_sign_of_rho() -> None:
    """The why lines once printed "negative ρ: the higher …, the more the treatment gains" beside ρ = +0.94."""
    assert direction(0.94, "x") == "the higher x, the higher Δ (less gain, or more harm, from the treatment)"
    assert direction(-0.83, "x") == "the higher x, the lower Δ (more gain from the treatment)"
    gains = dict(zip(FORMATS, (-0.02, -0.1, -0.2, -0.4)))
    sentences = {}
    for sign, shares in ((+1, (0.9, 0.6, 0.4, 0.2)), (-1, (0.2, 0.4, 0.6, 0.9))):
        jobs = study({(f, "manifold[update]"): d for f, d in gains.items()}, np.random.default_rng(11))
        share = dict(zip(FORMATS, shares))  # +1: more sub-½-ULP updates where the gain is *smaller*
        for j in jobs:
            j.summary["diagnostics"] = {"sub_half_ulp_share": share[j.format] if j.optimizer == "adamw" else 0.05}
        (line,) = [x for x in study_why_lines(run(jobs)) if x.startswith("Why: adamw's share")]
        assert f"Spearman ρ = {sign:+.2f}" in line
        sentences[sign] = line.split(" — ")[1]
    assert sentences[+1].startswith("the higher adamw's share of updates < ½ ULP, the higher Δ (less gain")
    assert sentences[-1].startswith("the higher adamw's share of updates < ½ ULP, the lower Δ (more gain")


def test_the_why_correlations_are_corrected_as_a_family() -> None:
    jobs = study({(f, "manifold[update]"): d for f, d in zip(FORMATS, (-0.02, -0.1, -0.2, -0.4))},
                 np.random.default_rng(12))
    order = dict(zip(FORMATS, range(4)))
    for j in jobs:
        k = order[j.format]
        j.summary["diagnostics"] = ({"sub_half_ulp_share": 0.2 + 0.2 * k, "ulp_update_q50": 1.0 - 0.2 * k,
                                     "mean_stall_ratio": (0.3, 0.1, 0.4, 0.2)[k]} if j.optimizer == "adamw" else {})
    lines = study_why_lines(run(jobs))
    assert "Holm-corrected over these 3" in lines[0]
    stated = [x for x in lines if x.startswith("Why: adamw's")]
    raw = [float(x.split(", p = ")[1].split(",")[0]) for x in stated]
    adjusted = [float(x.split("Holm p = ")[1].split(" ")[0]) for x in stated]
    assert len(stated) == 3 and all(a >= r for a, r in zip(adjusted, raw)) and max(adjusted) > min(raw)
    assert any("properties of the format (Spearman ρ with mantissa bits" in x for x in lines)


def test_an_underpowered_equivalence_test_says_how_many_seeds_it_needs() -> None:
    rng = np.random.default_rng(14)
    result = run(study({}, rng, noise=0.02))  # no effect, 5 seeds, paired SD ≈ 0.03 against a ±0.02 margin
    level = 0.05 / 8  # Holm over 8 tests: the level a test is sure to get
    assert result.single_test_level == pytest.approx(level)
    for c in result.comparisons:
        assert c.verdict == "not established" and c.underpowered
        assert c.equivalence_seeds == tost_seeds_needed(c.paired_sd, 0.02, level) > 5
    lines = study_lines(result)
    (line,) = [x for x in lines if x.startswith("manifold[update] − relative:")]
    needs = ", ".join(f"{c.equivalence_seeds} ({c.format})" for c in result.of(result.endpoint.contrasts[1]))
    assert (f"the equivalence test (TOST ±0.02) is underpowered at 5 seed pairs: needs ≈ {needs} seeds (80 % power "
            "at a true Δ of 0, one-sided level 0.00625 under holm") in line
    assert line.endswith("absence of evidence, not evidence of no difference.")
    sds = sorted({f"{c.paired_sd:.3f}" for c in result.of(result.endpoint.contrasts[1])})
    assert f"from the observed paired SD {sds[0]}–{sds[-1]})" in line
    one = run(study({}, np.random.default_rng(14), noise=0.02, declaration={**DECLARATION, "formats": ["e4m3"]}))
    (weak,) = one.of(one.endpoint.contrasts[1])
    (single,) = [x for x in study_lines(one) if x.startswith("manifold[update] − relative:")]
    assert weak.underpowered and f"from the observed paired SD {weak.paired_sd:.3f})" in single  # one SD: once
    tight = run(study({}, np.random.default_rng(3), noise=0.002, seeds=6))
    assert not any(c.underpowered for c in tight.comparisons)  # enough seeds: a tie is shown instead
    assert not any("underpowered" in x for x in study_lines(tight))


def test_the_tie_margin_is_stated_in_nats_and_as_a_share_of_the_losses() -> None:
    result = run(study({("e7m0", "manifold[update]"): -1.0}, np.random.default_rng(14)))
    means = [float(np.mean(list(a.values.values()))) for a in result.arms.values()]
    line = next(x for x in study_lines(result) if x.startswith("Tie margin"))
    assert line == (f"Tie margin: ±0.02 nats of validation loss, absolute (the same for every format): "
                    f"{100 * 0.02 / max(means):.1f}–{100 * 0.02 / min(means):.1f} % of the family's arm mean losses "
                    f"({min(means):.3f}–{max(means):.3f}, the base of these percentages).")


def test_runs_at_a_hand_set_lr_are_kept_out_and_shown_beside_the_claim() -> None:
    from dataclasses import replace

    rng = np.random.default_rng(15)
    jobs = study({("e5m2", "manifold[update]"): -0.3}, rng)
    plain = run(jobs)
    # the reference rerun at a better lr on the evaluation seeds, set by hand: half the gap
    ref = plain.arms[("e5m2", "adamw")].values
    jobs += [replace(job("e5m2", "adamw", s, ref[s] - 0.15 + 0.01 * (s % 2), lr=5e-3),
                     overrides=("optimizer=adamw", "optimizer.lr=0.005")) for s in range(5)]
    # tuning seed 101: adamw at 3e-4, 1e-3 (the declared lr), 3e-3 and 1e-2, manifold at its declared lr
    tuning = [job("e5m2", "adamw", 101, loss, lr=lr) for lr, loss in ((3e-4, 3.5), (1e-3, 3.1), (3e-3, 3.2),
                                                                      (1e-2, 6.0))]
    tuning.append(job("e5m2", "manifold[update]", 101, 2.8))
    result = run(jobs)
    assert result.arms[("e5m2", "adamw")].lrs == (1e-3,) and len(result.off_lr) == 5
    assert [c.verdict for c in result.comparisons] == [c.verdict for c in plain.comparisons]
    assert any("5 run(s) of the declaration set their lr by hand" in n for n in result.notes)
    near = neighbours(result, tuning)
    (evaluation,) = [n for n in near if n.source == "evaluation"]
    assert evaluation.format == "e5m2" and evaluation.lr == 5e-3 and evaluation.seeds == (0, 1, 2, 3, 4)
    declared = next(c for c in result.comparisons if c.format == "e5m2").test.mean
    assert evaluation.delta.mean == pytest.approx(declared + 0.15 - 0.004)
    rows = [(n.lr, n.delta.mean) for n in near if n.source == "tuning" and n.contrast.reference == "adamw"]
    assert rows == [(3e-4, pytest.approx(-0.7)), (1e-3, pytest.approx(-0.3)), (3e-3, pytest.approx(-0.4))]
    lines = study_lines(result, near=near)
    claim = next(x for x in lines if x.startswith("manifold[update] − adamw: lower loss"))
    assert "e5m2 (Δ = " in claim and "; against adamw at lr 0.005 instead: Δ = " in claim
    grid = next(x for x in sensitivity_lines(result, near) if x.startswith("Sensitivity to the lr grid"))
    share = 100 * evaluation.delta.mean / declared
    assert f"e5m2: Δ = {evaluation.delta.mean:+.4f}, 95% CI [" in grid
    assert f"5 seed pairs — {share:.0f} % of the declared Δ ({declared:+.4f})" in grid
    seed = next(x for x in sensitivity_lines(result, near) if x.startswith("Sensitivity on the tuning seed 101"))
    assert "(one run per lr, no CI)" in seed and "was the lowest of its scanned neighbours (0.0003, 0.003) in 1 of 1" \
        in seed


def test_the_tuning_sensitivity_names_each_formats_own_declared_lr() -> None:
    """Where the reference's declared lr differs by format, the line names each format's lr and neighbours (and
    which pick was not the lowest), never one lr for all of them."""
    from dataclasses import replace

    jobs = study({}, np.random.default_rng(16))
    jobs = [replace(j, summary={**j.summary, "lr": 3e-3}) if j.summary["format"] == "e4m3"
            and j.summary["optimizer_label"] == "adamw" else j for j in jobs]
    result = run(jobs)
    tuning = [job("e5m2", "adamw", 101, loss, lr=lr) for lr, loss in ((3e-4, 3.5), (1e-3, 3.1), (3e-3, 3.2))]
    tuning += [job("e4m3", "adamw", 101, loss, lr=lr) for lr, loss in ((1e-3, 3.0), (3e-3, 3.1), (1e-2, 3.4))]
    tuning += [job(f, "manifold[update]", 101, 2.8) for f in ("e5m2", "e4m3")]
    line = next(x for x in sensitivity_lines(result, neighbours(result, tuning))
                if x.startswith("Sensitivity on the tuning seed 101") and "adamw's loss" in x)
    assert ("adamw's loss at its declared lr was the lowest of its scanned neighbours in 1 of 2 formats (e4m3: 0.003 "
            "against 0.001, 0.01, not the lowest; e5m2: 0.001 against 0.0003, 0.003)") in line

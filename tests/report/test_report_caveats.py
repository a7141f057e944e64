"""The report's caveats are computed from the runs: scale, hardware, whether the loss still fell at the horizon,
a longer run of the same model, and the tuning seeds."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from altgrad.report.caveats import STILL_LEARNING, caveat_lines
from altgrad.report.load import Job

CONFIG = {"model": {"n_layer": 4, "n_embd": 128, "block_size": 128},
          "trainer": {"accelerator": "cpu", "precision": "32-true"}}


def job(seed: int, curve: list[tuple[int, float]], *, fmt: str = "e4m3", optimizer: str = "adamw",
        lr: float = 3e-3, steps: int | None = None) -> Job:
    summary = {"steps": steps or curve[-1][0], "seed": seed, "format": fmt, "optimizer": optimizer,
               "optimizer_label": optimizer, "model": "nano", "data": "embedded", "lr": lr, "n_params": 820480,
               "tokens_seen": 1228800, "config": CONFIG, "status": "completed", "final_val_loss": curve[-1][1]}
    return Job(Path(f"/x/{fmt}-{optimizer}-{seed}"), f"{seed}", "completed", summary, (), tuple(curve))


def falling(end: float, last_quarter_fall: float, steps: int = 400) -> list[tuple[int, float]]:
    """A curve every 100 steps whose loss at 3/4 of ``steps`` is (1 + fall) × its final value."""
    at_3q = end * (1 + last_quarter_fall)
    return [(0, 5.5), (steps // 2, at_3q * 1.2), (steps * 3 // 4, at_3q), (steps, end)]


def test_runs_still_falling_at_the_horizon_are_said_to_be_still_learning() -> None:
    scope = [job(s, falling(1.0, 0.10)) for s in (1, 2, 3)]
    lines = caveat_lines(scope, scope)
    horizon = next(line for line in lines if line.startswith("Horizon"))
    # 1.1 → 1.0 over the last quarter: 0.1 / 1.1 = 9.1 % of the loss at the start of that quarter (not 10 % of the end)
    assert "H = 400 steps" in horizon and "still learning" in horizon and "median 9.1 %" in horizon
    assert "relative to its value at step 300, the start of that quarter" in horizon
    # three equal falls: the range is said once, not "9.1–9.1 %"
    assert "(9.1 % over 3 runs" in horizon


def test_unequal_falls_at_the_horizon_are_given_as_a_range() -> None:
    scope = [job(s, falling(1.0, fall)) for s, fall in ((1, 0.05), (2, 0.10), (3, 0.20))]
    horizon = next(line for line in caveat_lines(scope, scope) if line.startswith("Horizon"))
    # 0.05 / 1.05 = 4.8 %, 0.2 / 1.2 = 16.7 %
    assert "median 9.1 % (4.8–16.7 % over 3 runs" in horizon


def test_flat_runs_are_said_to_be_close_to_settled() -> None:
    scope = [job(s, falling(1.0, STILL_LEARNING / 3)) for s in (1, 2)]
    assert all("still learning" not in line for line in caveat_lines(scope, scope))
    horizon = next(line for line in caveat_lines(scope, scope) if line.startswith("Horizon"))
    assert "close to settled" in horizon and "still learning" not in horizon


def test_scale_hardware_longer_run_and_tuning_seeds_are_stated() -> None:
    scope = [job(s, falling(1.0, 0.10)) for s in (1, 2)]
    pilot = job(101, [(0, 5.5), (400, 0.8), (1600, 0.2)], fmt="fp32")
    tuning = [job(101, falling(1.1, 0.1), lr=lr) for lr in (1e-3, 1e-2)]
    lines = caveat_lines([*scope, pilot, *tuning], scope)
    text = "\n".join(lines)
    assert "one model, nano (0.82 M parameters: 4 layers, width 128, context 128)" in text
    assert "Hardware: cpu, precision 32-true" in text
    assert "validation loss 0.800 at step 400, 0.200 at step 1600 (75 % below its value at step 400)" in text
    assert "picked on seed 101 (2 tuning runs of the evaluated arms), disjoint from the 2 evaluation seeds" in text


def test_without_a_declared_study_there_is_no_tuning_line() -> None:
    jobs = [job(s, falling(1.0, 0.1)) for s in (1, 2)] + [job(101, falling(1.0, 0.1))]
    assert not any(line.startswith("Tuning") for line in caveat_lines(jobs))
    assert caveat_lines([]) == []


def test_storage_what_the_format_touches_and_the_data_are_read_from_the_runs() -> None:
    config = {**CONFIG, "data": {"name": "embedded", "source": "embedded", "tokenizer": "bytes"}}
    spec = {"format": {"name": "e4m3"}}
    layers = {"h.0.attn": {"weight": spec, "input": spec, "grad": {"format": {"name": "e5m2"}}}}
    scope = [replace(job(s, falling(1.0, 0.1)), layer_map=layers) for s in (1, 2)]
    for j in scope:
        j.summary["config"] = config
    text = "\n".join(caveat_lines(scope, scope))
    assert "every evaluated run keeps fp32 master weights" in text and "only through the step size" in text
    assert ("What a format is applied to (the runs' layer_map.json): the weights, and the layer inputs "
            "(activations) in every format; gradients in e5m2 (e4m3). A difference between formats is a difference "
            "of weights, activations and gradients together") in text
    assert "synthetic text from the package's embedded grammar generator" in text
    on_grid = [replace(j, summary={**j.summary, "master": "none"}) for j in scope]
    # the study-2 shape: the format on the weights only, inputs and gradients held unquantized, data from a folder
    weights_only = {"h.0.attn": {"weight": spec, "input": None, "grad": None}}
    folder = {**CONFIG, "data": {"name": "eurlex_en", "source": "folder", "tokenizer": "bytes"}}
    held = [replace(j, layer_map=weights_only, summary={**j.summary, "config": folder}) for j in on_grid]
    text = "\n".join(caveat_lines(held, held))
    assert ("What a format is applied to (the runs' layer_map.json): the weights; layer inputs unquantized (e4m3); "
            "gradients unquantized (e4m3).") in text
    assert "Data: eurlex_en — split text files read from a data folder (their sha256 under Provenance)" in text
    assert "keeps fp32 master" not in "\n".join(caveat_lines(on_grid, on_grid))


def test_the_lr_scan_spacing_and_the_cliff_above_each_pick_are_stated() -> None:
    scope = [job(s, falling(1.0, 0.1), lr=3e-3) for s in (1, 2)]
    scan = [job(101, falling(loss, 0.1), lr=lr) for lr, loss in ((1e-3, 1.1), (3e-3, 1.0), (1e-2, 2.3))]
    line = next(x for x in caveat_lines([*scope, *scan], scope) if x.startswith("Learning-rate scan"))
    assert "adjacent scanned lrs are ×3–×3.3 apart" in line
    assert "ended at 2.3× (median 2.3×) the loss at the evaluated lr (1 format × arm scans)" in line
    assert "1 of the 1 picks sit one grid step below a loss cliff" in line
    gentle = [job(101, falling(loss, 0.1), lr=lr) for lr, loss in ((1e-3, 1.1), (3e-3, 1.0), (1e-2, 1.2))]
    line = next(x for x in caveat_lines([*scope, *gentle], scope) if x.startswith("Learning-rate scan"))
    assert "cliff" not in line
    even = [job(101, falling(loss, 0.1), lr=lr) for lr, loss in ((1e-3, 1.1), (3.16e-3, 1.0), (1e-2, 1.2))]
    line = next(x for x in caveat_lines([*scope, *even], scope) if x.startswith("Learning-rate scan"))
    assert "adjacent scanned lrs are ×3.2 apart" in line  # one spacing is said once


def test_manifold_against_relative_in_a_format_without_mantissa_bits_is_named_the_same_step() -> None:
    """In e7m0 a ULP at w is |w|, so manifold[update] − relative compares one step with itself: the caveat names
    that contrast in that format only, and not when manifold puts its ULPs on the gradient instead."""
    import dataclasses

    from test_report_arms import PLANTED, run, study

    from altgrad.report.caveats import same_step_line

    jobs = study(PLANTED)
    line = same_step_line(run(jobs))
    assert line is not None and line.startswith("Same step by construction: P1: manifold_sr − relative_sr in e7m0. ")
    assert "e4m3" not in line and "e0m7" not in line and "C1" not in line     # mantissa bits there
    on_grad = [dataclasses.replace(j, summary={**j.summary, "config": {**j.summary["config"], "optimizer": {
        **j.summary["config"]["optimizer"], "stiffness_on": "grad"}}}) if j.arm.startswith("manifold") else j
        for j in jobs]
    assert same_step_line(run(on_grad)) is None
    def fp32_master(j, kind: str = "pow2"):
        summary = {**j.summary, "master": "fp32"} if j.arm.startswith("manifold") else j.summary
        if j.arm.startswith("manifold"):
            summary["config"] = {**summary["config"], "optimizer": {**summary["config"]["optimizer"],
                                                                      "stiffness_kind": kind}}
        return dataclasses.replace(j, summary=summary)

    # a float32 master weight sits between grid points: pow2's ULP is |w| floored to a power of two, not |w|
    assert same_step_line(run([fp32_master(j) for j in jobs])) is None
    assert same_step_line(run([fp32_master(j, "smooth") for j in jobs])) is not None   # smooth: |w|·2^0 = |w|
    no_relative = [j for j in jobs if j.arm != "relative_sr"]
    assert same_step_line(run(no_relative)) is None                            # no runs: nothing to compare


def test_the_time_shift_is_read_at_the_endpoints_own_horizon_and_as_a_share_of_it() -> None:
    """|Δ| in steps of the reference arm's descent over the last quarter, named with the horizon it was read at."""
    import dataclasses

    from test_report_arms import PLANTED, run, study

    from altgrad.report.caveats import time_shift_line

    # every run falls 0.13 nats from step 37 (3/4 of the declared horizon, 50) to its end: 1 nat per 100 steps
    jobs = [dataclasses.replace(j, curve=((0, 5.5), (37, j.summary["final_val_loss"] + 0.13),
                                          (50, j.summary["final_val_loss"]))) for j in study(PLANTED)]
    result = run(jobs)
    line = time_shift_line(result)
    assert line is not None and line.startswith("Time shift: at the horizon (50 steps) the adamw_sr arms")
    assert "by a median 1.000 nats per 100 steps" in line
    p2 = next(c for c in result.comparisons if c.contrast.label == "P2" and c.format == "e4m3")
    steps = abs(p2.test.mean) / 0.01                                   # planted −0.20: ≈ 20 steps, 40 % of 50
    assert 15 < steps < 25 and f"e4m3 {steps:.0f} ({2 * steps:.0f} %)" in line
    flat = [dataclasses.replace(j, curve=((0, 5.5), (37, j.summary["final_val_loss"]),
                                          (50, j.summary["final_val_loss"]))) for j in study(PLANTED)]
    assert time_shift_line(run(flat)) is None                          # no descent left: no time to convert into

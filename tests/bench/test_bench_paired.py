"""Speed targets judged on paired per-round ratios (altgrad.bench.paired) and the job bench's raw record."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from altgrad.bench import job_record
from altgrad.bench.job import Sample
from altgrad.bench.paired import MAX_ROUNDS, combine, judge, settle_text
from altgrad.report.stats import seeds_needed, t_critical

T1 = 12.706204736174707  # Student t, 1 df, 97.5 % (tables)
T2 = 4.302652729749464   # 2 df


def test_interval_is_the_student_t_interval_of_the_log_ratios() -> None:
    j = judge([1.1, 1.2], 1.30)
    logs = [math.log(1.1), math.log(1.2)]
    mean, se = sum(logs) / 2, abs(logs[1] - logs[0]) / 2  # sd/√2 of two values is half their distance
    assert j.n == 2 and j.estimate == pytest.approx(math.sqrt(1.1 * 1.2))
    assert j.ci == pytest.approx((math.exp(mean - T1 * se), math.exp(mean + T1 * se)), rel=1e-9)
    assert j.verdict == "unsettled"  # the upper end, 4.3, is far above 1.30
    j3 = judge([1.02, 1.03, 1.04], 1.10)
    logs = [math.log(x) for x in (1.02, 1.03, 1.04)]
    m = sum(logs) / 3
    se = math.sqrt(sum((x - m) ** 2 for x in logs) / 2 / 3)
    assert j3.ci == pytest.approx((math.exp(m - T2 * se), math.exp(m + T2 * se)), rel=1e-9)
    assert j3.verdict == "met" and j3.rounds_needed is None
    assert judge([1.20, 1.21, 1.22], 1.10).verdict == "missed"


def test_one_round_or_none_cannot_carry_a_verdict() -> None:
    one = judge([1.5], 1.10)
    assert one.verdict == "unsettled" and one.ci is None and one.text() == "1.500"
    assert settle_text(one) == "a second round gives the first interval"
    assert judge([], 1.1).verdict == "unmeasured" and judge([None], 1.1).text() == "–"
    assert combine(judge([None], 1.1), judge([1.0, 1.0], 1.1)) == "unmeasured"


def test_a_target_on_two_ratios_is_missed_if_either_is_and_met_only_if_both_are() -> None:
    met, missed, open_ = judge([1.0, 1.01], 1.10), judge([1.3, 1.31], 1.10), judge([1.0, 1.3], 1.10)
    assert (met.verdict, missed.verdict, open_.verdict) == ("met", "missed", "unsettled")
    assert combine(met, met) == "met" and combine(met, missed) == "missed" and combine(open_, missed) == "missed"
    assert combine(met, open_) == "unsettled"
    assert settle_text(met, open_) == f"≈ {open_.rounds_needed} rounds would settle it"


@pytest.mark.parametrize(("true_mean", "sd", "bound"), [(1.18, 0.08, 1.10), (1.00, 0.05, 1.05), (1.12, 0.15, 1.20)])
def test_the_rounds_to_settle_settle_it_four_times_in_five(true_mean: float, sd: float, bound: float) -> None:
    """Monte Carlo: benches of n log-ratios drawn at today's mean and sd (n = rounds_needed) settle the target in
    ≈ 80 % of draws, and benches of half as many rounds settle it clearly less often."""
    rng = np.random.default_rng(1)
    mean = math.log(true_mean)
    today = judge([math.exp(mean + sd), math.exp(mean - sd)], bound)  # two rounds with exactly this mean, sd √2
    n = today.rounds_needed
    assert today.verdict == "unsettled" and n == seeds_needed(sd * math.sqrt(2), abs(mean - math.log(bound)), 0.05, 0.8)

    def settled(k: int) -> float:
        draws = rng.normal(mean, sd * math.sqrt(2), (4000, k))
        half = t_critical(k - 1) * draws.std(axis=1, ddof=1) / math.sqrt(k)
        clear = np.abs(draws.mean(axis=1) - math.log(bound)) > half  # the interval lies on one side of the bound
        for row, c in zip(draws[:40], clear[:40]):  # judge itself agrees with this vectorised rule
            assert (judge(list(np.exp(row)), bound).verdict != "unsettled") == c
        return float(clear.mean())

    assert 0.76 <= settled(n) <= 0.88
    assert settled(max(2, n // 2)) < 0.7


def test_a_mean_on_the_bound_or_far_too_many_rounds_say_so() -> None:
    on = judge([1.05, 1.15], math.sqrt(1.05 * 1.15))
    assert on.rounds_needed == MAX_ROUNDS + 1 and settle_text(on) == f"> {MAX_ROUNDS} rounds: at the bound"
    near = judge([1.0, 1.2], 1.1)
    assert near.rounds_needed == MAX_ROUNDS + 1 or near.rounds_needed > 100


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=1, max_size=8), st.floats(0.7, 1.4))
def test_a_slowdown_bound_and_the_matching_share_bound_agree(ratios: list[float], bound: float) -> None:
    """Judging r ≤ b and 1/r ≥ 1/b is one question on the log scale: the same verdict and mirrored intervals."""
    slow, share = judge(ratios, bound), judge([1 / r for r in ratios], 1 / bound, at_least=True)
    assert slow.verdict == share.verdict
    if slow.ci is not None and share.ci is not None:
        assert slow.ci[0] == pytest.approx(1 / share.ci[1]) and slow.ci[1] == pytest.approx(1 / share.ci[0])


def entry_sample(wall: float) -> Sample:
    return Sample(wall, 1.0, 100.0, 0.5, 0.1, 2.0, 0.2, 0.3)


def test_record_keeps_every_job_and_pools_only_its_own_key(tmp_path: Path) -> None:
    path = tmp_path / "record.jsonl"
    key = job_record.make_key(Path.cwd(), ["logger=csv"], "a CPU, 2 CPUs, 24 GiB", "2.13.0 2.5")
    other = {**key, "sets": ["logger=csv", "model=gpt_50m"]}
    setting = {"recipe": "small", "steps": 4, "threads": 1}
    job_record.append(path, key, setting, "fp32", 0, entry_sample(10.0))
    job_record.append(path, other, setting, "fp32", 0, entry_sample(99.0))
    job_record.append(path, key, setting, "e4m3", 0, entry_sample(11.0), "abc1234")
    entries, left_out = job_record.load(path, key)
    assert left_out == 1 and [(e["job"], e["round"], e["sample"]["wall"]) for e in entries] == [
        ("fp32", 0, 10.0), ("e4m3", 0, 11.0)]
    assert [e["commit"] for e in entries] == [None, "abc1234"]  # provenance only: both pool under the key
    assert Sample(**entries[1]["sample"]) == entry_sample(11.0)
    assert job_record.load(tmp_path / "none.jsonl", key) == ([], 0)
    assert key["code"] == job_record.code_state(Path.cwd()) and len(key["code"]) == 20


def test_the_code_key_follows_what_jobs_run_not_the_bench_itself(tmp_path: Path) -> None:
    """A change to a training module or a config changes the key; one to the bench's reporting, the report or the
    study driver does not, one to its plain reference loop (a job it times) does; compiled caches are ignored."""
    for rel, text in [("altgrad/train.py", "a"), ("altgrad/bench/job.py", "b"), ("altgrad/bench/_reference_loop.py",
                      "c"), ("conf/config.yaml", "d"), ("altgrad/report/stats.py", "e"),
                      ("altgrad/study/power.py", "f")]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    base = job_record.code_state(tmp_path)
    (tmp_path / "altgrad/bench/job.py").write_text("b2")
    (tmp_path / "altgrad/report/stats.py").write_text("e2")
    (tmp_path / "altgrad/study/power.py").write_text("f2")
    (tmp_path / "altgrad/__pycache__").mkdir()
    (tmp_path / "altgrad/__pycache__/train.cpython-311.pyc").write_text("x")
    assert job_record.code_state(tmp_path) == base
    for rel in ("altgrad/train.py", "altgrad/bench/_reference_loop.py", "conf/config.yaml"):
        before = job_record.code_state(tmp_path)
        (tmp_path / rel).write_text("changed")
        assert job_record.code_state(tmp_path) != before, rel


def test_a_damaged_record_line_stops_with_its_number(tmp_path: Path) -> None:
    path = tmp_path / "record.jsonl"
    key = {"code": {}, "sets": []}
    job_record.append(path, key, {"recipe": "small", "steps": 4, "threads": None}, "fp32", 0, entry_sample(1.0))
    with path.open("a") as f:
        f.write('{"key": {"code": {}, "sets": []}, "job": "fp32"}\n')
    with pytest.raises(SystemExit, match=r"line 2 is not a bench record entry \('setting, round, sample'\)"):
        job_record.load(path, key)
    path.write_text(path.read_text().splitlines()[0] + "\n{not json\n")
    with pytest.raises(SystemExit, match="line 2 is not a bench record entry"):
        job_record.load(path, key)
    assert json.loads(path.read_text().splitlines()[0])["job"] == "fp32"


def test_a_record_resumes_the_bench_where_it_stopped() -> None:
    """Entries of the settings, configurations and rounds asked for are pooled and not run again; others (another
    step count, a configuration not asked for, a round past --rounds, a duplicate) are left alone."""
    from altgrad.bench.job import JOBS, Results, Setting, pool

    small, default = Setting("small", 4, 1), Setting("default", 4, None)
    results = {small: Results(), default: Results()}
    jobs = [j for j in JOBS if j.name in ("fp32", "e4m3")]

    def entry(recipe: str, steps: int, threads: int | None, job: str, round_: int, wall: float) -> dict:
        sample = {**entry_sample(wall).__dict__, "round": round_}
        return {"setting": {"recipe": recipe, "steps": steps, "threads": threads}, "job": job, "round": round_,
                "sample": sample}

    entries = [entry("small", 4, 1, "fp32", 0, 10.0), entry("small", 4, 1, "e4m3", 0, 11.0),
               entry("small", 4, 1, "fp32", 1, 12.0), entry("small", 4, 1, "fp32", 1, 13.0),
               entry("small", 8, 1, "fp32", 2, 14.0), entry("default", 4, None, "e4m3 stochastic", 0, 15.0),
               entry("default", 4, None, "fp32", 5, 16.0)]
    done = pool(entries, results, jobs, rounds=3)
    # entries from before places were recorded (no seq): one per (setting, job, round)
    assert set(done) == {(small, "fp32", 0, None), (small, "e4m3", 0, None), (small, "fp32", 1, None)}
    assert done[(small, "fp32", 1, None)]["sample"]["wall"] == 12.0  # the first entry of a place is kept
    assert [x.wall for x in results[small].samples["fp32"]] == [10.0, 12.0]
    assert [x.round for x in results[small].samples["fp32"]] == [0, 1] and results[default].samples == {}
    # a bracketed round's fp32 jobs fill places of their own; a place recorded twice is kept once
    placed = [entry("small", 4, 1, "fp32", 0, 10.0), entry("small", 4, 1, "e4m3", 0, 11.0),
              entry("small", 4, 1, "fp32", 0, 12.0), entry("small", 4, 1, "fp32", 0, 13.0)]
    for e, seq in zip(placed, (0, 1, 2, 2)):
        e["sample"]["seq"] = seq
    results = {small: Results()}
    done = pool(placed, results, jobs, rounds=1)
    assert set(done) == {(small, "fp32", 0, 0), (small, "e4m3", 0, 1), (small, "fp32", 0, 2)}
    assert [(x.wall, x.seq) for x in results[small].samples["fp32"]] == [(10.0, 0), (12.0, 2)]


def test_a_studys_experiment_files_key_only_benches_that_compose_them(tmp_path: Path) -> None:
    """A study's tuned-lr table changes as it runs; the bench's jobs compose no experiment, so it keeps their key,
    unless ``--set experiment=…`` composes one."""
    for rel in ("altgrad/train.py", "conf/train.yaml", "conf/experiment/optim/tuned/ongrid.yaml",
                "conf/study/ongrid.yaml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    plain = job_record.make_key(tmp_path, [], "m", "v")
    with_experiment = job_record.make_key(tmp_path, ["experiment=ongrid"], "m", "v")
    (tmp_path / "conf/experiment/optim/tuned/ongrid.yaml").write_text("tuned: 1.58")
    (tmp_path / "conf/study/ongrid.yaml").write_text("stages: []")
    assert job_record.make_key(tmp_path, [], "m", "v") == plain
    assert job_record.make_key(tmp_path, ["experiment=ongrid"], "m", "v")["code"] != with_experiment["code"]
    assert job_record.selects_experiment(["+experiment=x"]) and not job_record.selects_experiment(["format=e4m3"])

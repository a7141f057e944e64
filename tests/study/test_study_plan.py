"""Study plans are data (conf/study/*.yaml): every committed plan parses and composes, and a bad plan or command
line is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from altgrad.study import __main__ as cli
from altgrad.study.driver import Study
from altgrad.study.plan import PlanError, available_plans, load_plan, parse_plan
from altgrad.sweep.plan import plan as plan_jobs

PLANS = available_plans()


def test_the_committed_plans() -> None:
    assert {"ongrid", "ongrid_debug", "study_cpu", "study_cpu_debug", "evidence_gpu", "evidence_gpu_debug"} <= set(
        PLANS)


@pytest.mark.parametrize("name", PLANS)
def test_every_sweep_of_every_plan_names_distinct_job_dirs(name: str, tmp_path: Path) -> None:
    plan = load_plan(name)
    study = Study(plan, tmp_path / "root", tmp_path / "runs", tmp_path / "out", formats=("e4m3",) * bool(
        plan.formats_from))
    for stage in plan.stages:
        if stage.kind not in ("sweep", "tune"):
            continue
        seen: set[str] = set()
        for args in study.stage_sweeps(stage) if stage.seeds != "power" else [
                [*a, "seed=1,2,3,4,5,6"] for a in stage.sweeps]:
            dirs = [job.subdir for job in plan_jobs([*args, *study.search_path()])]
            assert dirs and len(set(dirs)) == len(dirs) and not seen & set(dirs), (stage.name, args)
            assert all("seed=" in d for d in dirs)
            seen |= set(dirs)


def test_the_study_2_plan_tunes_five_lrs_on_two_seeds_disjoint_from_the_evaluation(tmp_path: Path) -> None:
    plan = load_plan("ongrid")
    study = Study(plan, tmp_path / "root", tmp_path / "runs", tmp_path / "out")
    for stage in (s for s in plan.stages if s.kind == "tune"):
        assert stage.min_lrs == 5 and stage.plain_arm == "adamw_sr"
        for args in stage.sweeps:
            lrs = next(a for a in args if a.startswith("optimizer.lr=")).split("=", 1)[1].split(",")
            ratios = {round(float(b) / float(a), 2) for a, b in zip(lrs, lrs[1:])}
            assert len(lrs) == 5 and ratios <= {1.58, 1.59, 1.6}, args
            seeds = {int(o.split("=")[1]) for j in plan_jobs(args) for o in j.overrides if o.startswith("seed=")}
            assert seeds == {201, 202}
        assert not set(study.eval_seeds(stage)) & {201, 202}


@pytest.mark.parametrize("raw, message", [
    ({"name": "x", "stages": [{"name": "a", "kind": "fly"}]}, "a.kind='fly' is invalid; valid: sweep, tune"),
    ({"name": "x", "stages": [{"name": "a", "kind": "sweep", "sweeps": [["x=1"]], "lrs": 1}]},
     "a.lrs is not a key of a sweep stage; valid: name, kind, sweeps, seeds"),
    ({"name": "x", "stages": [{"name": "a", "kind": "sweep", "sweeps": [["x=1"]], "seeds": "power"}]},
     "a.seeds='power' needs a power stage before it"),
    ({"name": "x", "stages": [{"name": "a", "kind": "sweep", "sweeps": [["x=1"]], "seeds": [1, 1]}]},
     "a.seeds=[1, 1] is invalid; valid: distinct seeds"),
    ({"name": "x", "stages": [{"name": "a", "kind": "horizon", "pilot": "p", "experiment": "e"}]},
     "a.pilot='p' is invalid; valid: an earlier stage"),
    ({"name": "x", "colour": "red", "stages": []}, "colour is not a key of a study plan"),
])
def test_a_bad_plan_is_one_line(raw: dict, message: str) -> None:
    with pytest.raises(PlanError) as err:
        parse_plan(raw)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_an_unknown_plan_and_a_missing_setting_are_refused_in_one_line(capsys) -> None:
    assert cli.main(["nope"]) == 2
    assert capsys.readouterr().err.startswith("error: study 'nope' has no plan file")
    assert cli.main(["ongrid"]) == 2
    assert capsys.readouterr().err == ("error: data.dir is required by the plan; valid: --set data.dir=VALUE "
                                       "(required: data.dir)\n")
    assert cli.main(["ongrid", "--set", "data.dir=/x", "--until", "nostage"]) == 2
    assert "no stage named 'nostage'" in capsys.readouterr().err

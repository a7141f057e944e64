"""lr_pick: per-(format, arm) picks merged into a tuned-lr table, the refusals (edge of the grid, evaluation seeds,
plain lr not the baseline's) and the extension scans, on synthetic sweeps and on a tiny real one; the table's I/O."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from altgrad.config import validate
from altgrad.report.load import load_sweeps
from altgrad.sweep.lr_pick import extension_lrs, main, pick_per_format
from altgrad.sweep.lr_table import read_table, render_table
from sweep_helpers import CONF_DIR, REPO, job_dirs, run_train, summary

Run = tuple  # (optimizer_label, format, lr, seed, status, final_val_loss[, master, storage_rounding, plain_lr])


def fake_scan(root: Path, runs: list[Run], overrides: bool = False, numbered: bool = True) -> Path:
    """Job dirs with summary.json (and, if asked, the .hydra/overrides.yaml a multirun job has), numbered as a
    plain multirun numbers them or named by their overrides as the named experiments name them."""
    for i, (label, fmt, lr, seed, status, loss, *rest) in enumerate(runs):
        master, rounding, plain = (rest + [None, None, None])[:3] if rest else ("fp32", "nearest", None)
        name = label.split("[")[0]
        job = root / (f"{i}" if numbered else f"format={fmt},optimizer.lr={lr},optimizer={name},seed={seed}")
        job.mkdir(parents=True)
        job.joinpath("summary.json").write_text(json.dumps({
            "status": status, "optimizer": name, "optimizer_label": label, "format": fmt, "lr": lr,
            "seed": seed, "final_val_loss": loss, "best_val_loss": loss, "experiment": "study_cpu_tune_arms",
            "master": master or "fp32", "storage_rounding": rounding or "nearest",
            "optimizer_groups": {"plain_lr": plain}}))
        if overrides:
            job.joinpath(".hydra").mkdir()
            job.joinpath(".hydra", "overrides.yaml").write_text(yaml.safe_dump(
                ["experiment=study_cpu_tune_arms", f"format={fmt}", f"optimizer={name}", f"optimizer.lr={lr}",
                 f"seed={seed}"]))
    return root


RUNS = [
    # adamw in e4m3: 1e-2 the best of the lrs that completed on both seeds; 3e-2 diverged on one of them
    ("adamw", "e4m3", 1e-3, 1, "completed", 2.0), ("adamw", "e4m3", 1e-3, 2, "completed", 2.2),
    ("adamw", "e4m3", 3e-3, 1, "completed", 1.9), ("adamw", "e4m3", 3e-3, 2, "completed", 2.6),
    ("adamw", "e4m3", 1e-2, 1, "completed", 1.5), ("adamw", "e4m3", 1e-2, 2, "completed", 1.7),
    ("adamw", "e4m3", 3e-2, 1, "completed", 1.0), ("adamw", "e4m3", 3e-2, 2, "diverged", None),
    # manifold[update] in e4m3: its lowest lr is the best (an edge)
    ("manifold[update]", "e4m3", 0.1, 1, "completed", 2.0), ("manifold[update]", "e4m3", 0.3, 1, "completed", 2.1),
    # madam in e5m2: every lr broke
    ("madam", "e5m2", 0.01, 1, "failed", None), ("madam", "e5m2", 0.03, 1, "diverged", None),
]


def test_the_pick_is_the_stable_lr_with_the_lowest_mean_over_seeds(tmp_path: Path) -> None:
    picks = pick_per_format(load_sweeps([fake_scan(tmp_path, RUNS)]).jobs)
    adamw = picks[("e4m3", "adamw")]
    assert adamw.lr == 1e-2 and adamw.score == pytest.approx(1.6) and adamw.seeds == (1, 2)
    assert adamw.unstable == (3e-2,) and adamw.candidates == (1e-3, 3e-3, 1e-2)
    assert adamw.edge is None and adamw.refusal is None  # a diverged lr above brackets it: the stability limit
    manifold = picks[("e4m3", "manifold")]
    assert manifold.lr == 0.1 and manifold.edge == "low" and "low edge" in manifold.refusal
    madam = picks[("e5m2", "madam")]
    assert madam.lr is None and "no lr completed" in madam.describe() and "scan lower" in madam.refusal


def test_an_lr_below_a_diverged_one_is_bracketed_and_the_top_stable_lr_is_an_edge(tmp_path: Path) -> None:
    runs = [("adamw", "e4m3", lr, 7, "completed", loss) for lr, loss in ((1e-3, 2.0), (3e-3, 1.8), (1e-2, 1.7))]
    picks = pick_per_format(load_sweeps([fake_scan(tmp_path / "a", runs)]).jobs)
    assert picks[("e4m3", "adamw")].edge == "high"
    runs.append(("adamw", "e4m3", 3e-2, 7, "diverged", None))  # the stability limit brackets 1e-2 from above
    picks = pick_per_format(load_sweeps([fake_scan(tmp_path / "b", runs)]).jobs)
    assert picks[("e4m3", "adamw")].edge is None and picks[("e4m3", "adamw")].refusal is None
    assert extension_lrs(pick_per_format(load_sweeps([tmp_path / "a"]).jobs)[("e4m3", "adamw")]) == [3e-2, 0.1]


def test_the_committed_table_reads_back_and_renders_to_the_same_text() -> None:
    path = CONF_DIR / "experiment" / "optim" / "tuned" / "study_cpu.yaml"
    table = read_table(path)
    assert table["bf16_ref"]["manifold"][0] == 30.0 and "tune_arms" in table["bf16_ref"]["manifold"][1]
    assert render_table(table) == path.read_text()


def test_a_malformed_table_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "t.yaml"
    bad.write_text("tuned_lr:\n  e4m3:\n    adamw: -1.0\n")
    with pytest.raises(ValueError, match="tuned_lr.e4m3.adamw=-1.0 is not a positive learning rate"):
        read_table(bad)
    bad.write_text("tuned_lr: [1, 2]\n")
    with pytest.raises(ValueError, match="is not a tuned-lr table"):
        read_table(bad)


# -- per-format tables ----------------------------------------------------------------------------------------------
def scan(arm: str, fmt: str, losses: dict[float, float | None], seeds=(101,), plain=None, master="fp32",
         rounding="nearest") -> list[Run]:
    return [(arm, fmt, lr, s, "completed" if loss is not None else "diverged", loss, master, rounding, plain)
            for lr, loss in losses.items() for s in seeds]


ADAMW_SCAN = (scan("adamw", "e4m3", {1e-3: 2.4, 3e-3: 2.2, 1e-2: 2.3, 3e-2: None})
              + scan("adamw", "e5m2", {1e-3: 2.5, 3e-3: 2.45, 1e-2: 2.3, 3e-2: 2.6}))


def test_the_table_holds_per_format_picks_and_adamws_pick_is_the_plain_lr(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the sweeps are named relative to the working directory in the table's comments
    table = tmp_path / "conf" / "experiment" / "optim" / "tuned" / "study.yaml"
    shutil.copytree(CONF_DIR, tmp_path / "conf")
    assert main([str(fake_scan(tmp_path / "s1", ADAMW_SCAN)), "--table", str(table), "--eval-seeds", "1,2,3",
                 "--min-lrs", "4"]) == 0
    lrs = {fmt: {arm: lr for arm, (lr, _) in arms.items()} for fmt, arms in read_table(table).items()}
    assert lrs == {"e4m3": {"adamw": 3e-3, "plain": 3e-3}, "e5m2": {"adamw": 1e-2, "plain": 1e-2}}
    stage2 = (scan("manifold[update]", "e4m3", {0.3: 2.3, 1.0: 2.1, 3.0: 2.2, 10.0: None}, plain=3e-3)
              + scan("relative", "e4m3", {0.01: 2.3, 0.03: 2.2, 0.1: 2.25, 0.3: 2.5}, plain=3e-3)
              + scan("adamw", "e4m3", {1e-3: 2.5, 3e-3: 2.3, 1e-2: 2.6, 3e-2: 2.9}, master="none",
                     rounding="stochastic"))
    assert main([str(fake_scan(tmp_path / "s2", stage2)), "--table", str(table)]) == 0
    tuned = yaml.safe_load(table.read_text())["tuned_lr"]
    assert tuned["e4m3"] == {"plain": 3e-3, "adamw": 3e-3, "manifold": 1.0, "relative": 0.03,
                             "adamw-ongrid_stochastic": 3e-3}
    assert tuned["e5m2"] == {"plain": 1e-2, "adamw": 1e-2}  # kept from the first stage
    assert "seeds [101]: final val loss 2.1000 (s2)" in table.read_text()  # where each pick came from
    assert str(tmp_path) not in table.read_text()  # no machine's absolute path in a committed table
    # an evaluation experiment reads it by interpolation: per format, per arm, plain groups at AdamW's pick
    (tmp_path / "conf" / "experiment" / "evaluate.yaml").write_text(
        "# @package _global_\ndefaults:\n  - /experiment/optim/tuned/study\n"
        "baseline:\n  lr: ${tuned_lr.${format.label}.plain}\n"
        "optimizer:\n  lr: ${tuned_lr.${format.label}.${optimizer.name}}\n")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(tmp_path / "conf"), version_base="1.3"):
        for arm, fmt, lr, plain in (("manifold", "e4m3", 1.0, 3e-3), ("adamw", "e5m2", 1e-2, None)):
            cfg = compose(config_name="train", overrides=[f"optimizer={arm}", f"format={fmt}", "experiment=evaluate"])
            validate(cfg, paths=False)
            assert cfg.optimizer.lr == lr and cfg.baseline.lr == (plain or lr)
            assert cfg.optimizer.get("plain_lr", plain) == plain
    GlobalHydra.instance().clear()


def test_refusals_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    table = tmp_path / "tuned.yaml"
    # tuning on an evaluation seed
    assert main([str(fake_scan(tmp_path / "a", ADAMW_SCAN)), "--table", str(table), "--eval-seeds", "101"]) == 2
    assert "seed(s) [101], which are evaluation seeds [101]" in capsys.readouterr().err and not table.exists()
    # too few lrs
    assert main([str(tmp_path / "a"), "--table", str(table), "--min-lrs", "5"]) == 2
    assert "only 4 lrs scanned; at least 5" in capsys.readouterr().err and not table.exists()
    # an arm before AdamW has a pick in its format
    manifold = scan("manifold[update]", "e4m3", {0.3: 2.3, 1.0: 2.1, 3.0: 2.2}, plain=5e-3)
    assert main([str(fake_scan(tmp_path / "b", manifold)), "--table", str(table)]) == 2
    assert "adamw has no pick in e4m3 yet" in capsys.readouterr().err and not table.exists()
    # an arm tuned with its plain groups at another lr than AdamW's pick
    assert main([str(tmp_path / "a"), "--table", str(table)]) == 0
    before = table.read_text()
    assert main([str(tmp_path / "b"), "--table", str(table)]) == 2
    err = capsys.readouterr().err
    assert "stepped the grid-less parameters at lr 0.005, but adamw's pick in e4m3 is 0.003" in err
    assert table.read_text() == before
    with pytest.raises(SystemExit):  # --write (the pooled picks rewritten into YAML in place) is gone
        main([str(tmp_path / "a"), "--table", str(table), "--write"])
    with pytest.raises(SystemExit):
        main([str(tmp_path / "a"), "--eval-seeds", "x"])


def test_an_edge_pick_writes_a_resumable_extension_scan(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runs = scan("manifold[update]", "e4m3", {0.3: 2.3, 1.0: 2.2, 3.0: 2.1}, seeds=(101, 102), plain=5e-3)
    sweep = fake_scan(tmp_path / "sweep", runs, overrides=True, numbered=False)
    script = tmp_path / "extend.sh"
    assert main([str(sweep), "--table", str(tmp_path / "t.yaml"), "--extend", str(script)]) == 2
    assert "1 extension scan(s) written" in capsys.readouterr().out
    command = script.read_text().splitlines()[-1]
    assert command == ("python -m altgrad.train experiment=study_cpu_tune_arms format=e4m3 optimizer=manifold "
                       f"optimizer.lr=10,30 seed=101,102 hydra.sweep.dir={sweep} +resume_sweep=true")


# -- a real scan, extended in place ---------------------------------------------------------------------------------
SCAN = ["experiment=study_cpu_tune_debug", "format=e4m3", "seed=101"]  # AdamW, its lr swept as baseline.lr


@pytest.mark.slow
def test_a_real_scan_is_refused_at_its_edge_then_extended_into_the_same_folder(tmp_path: Path,
                                                                               offline_env: dict[str, str]) -> None:
    sweep = tmp_path / "scan"
    done = run_train([*SCAN, "baseline.lr=1e-4,3e-4", f"hydra.sweep.dir={sweep}"], offline_env)
    assert done.returncode == 0, done.stderr[-2000:]
    script = tmp_path / "extend.sh"
    assert main([str(sweep), "--table", str(tmp_path / "t.yaml"), "--extend", str(script)]) == 2
    assert "baseline.lr=0.001,0.003 seed=101" in script.read_text()  # losses fall with lr here: the high edge
    env = {**offline_env, "PATH": f"{Path(sys.executable).parent}:{offline_env['PATH']}"}  # the script's python
    for _ in range(2):  # the second run finds every job finished and skips it
        ran = subprocess.run(["bash", str(script)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert ran.returncode == 0, ran.stderr[-2000:]
    jobs = job_dirs(sweep)
    assert len(jobs) == 4 and all(summary(j)["status"] == "completed" for j in jobs.values())
    assert "baseline.lr=0.003,format=e4m3,optimizer=adamw,seed=101" in jobs
    pick = pick_per_format(load_sweeps([sweep]).jobs)[("e4m3", "adamw")]
    assert pick.scanned == (1e-4, 3e-4, 1e-3, 3e-3)


def test_an_adamw_scan_over_the_baseline_lr_is_extended_over_the_baseline_lr(tmp_path: Path) -> None:
    fake_scan(tmp_path / "tmp", scan("adamw", "e4m3", {1e-3: 2.4, 3e-3: 2.3, 1e-2: 2.2}))
    for i, lr in enumerate((1e-3, 3e-3, 1e-2)):
        job = tmp_path / "sweep" / f"baseline.lr={lr},format=e4m3,optimizer=adamw,seed=101"
        shutil.copytree(tmp_path / "tmp" / str(i), job)
        job.joinpath(".hydra").mkdir()
        job.joinpath(".hydra", "overrides.yaml").write_text(yaml.safe_dump(
            ["experiment=study_cpu_tune", "format=e4m3", "optimizer=adamw", f"baseline.lr={lr}", "seed=101"]))
    script = tmp_path / "x.sh"
    assert main([str(tmp_path / "sweep"), "--table", str(tmp_path / "t.yaml"), "--extend", str(script)]) == 2
    assert script.read_text().splitlines()[-1] == (
        "python -m altgrad.train experiment=study_cpu_tune format=e4m3 optimizer=adamw baseline.lr=0.03,0.1 "
        f"seed=101 hydra.sweep.dir={tmp_path / 'sweep'} +resume_sweep=true")


def test_a_cell_where_every_lr_diverged_is_refused_and_extended_below(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    runs = scan("manifold[update]", "e7m0", {1.0: None, 3.0: None}, plain=5e-3)
    sweep = fake_scan(tmp_path / "sweep", runs, overrides=True, numbered=False)
    script = tmp_path / "x.sh"
    assert main([str(sweep), "--table", str(tmp_path / "t.yaml"), "--extend", str(script)]) == 2
    assert "manifold in e7m0: no scanned lr completed on every tuning seed; scan lower" in capsys.readouterr().err
    assert "optimizer.lr=0.3,0.1 seed=101" in script.read_text() and not (tmp_path / "t.yaml").exists()


def test_an_edge_on_evaluation_seeds_or_unbalanced_seeds_is_not_extended(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    runs = scan("manifold[update]", "e4m3", {0.3: 2.3, 1.0: 2.2, 3.0: 2.1}, seeds=(1,), plain=5e-3)
    sweep = fake_scan(tmp_path / "a", runs, overrides=True, numbered=False)
    script = tmp_path / "x.sh"
    assert main([str(sweep), "--table", str(tmp_path / "t.yaml"), "--eval-seeds", "1", "--extend", str(script)]) == 2
    err = capsys.readouterr().err
    assert "high edge" in err and "; and tuning runs use seed(s) [1]" in err and not script.exists()
    runs = scan("adamw", "e4m3", {1e-3: 2.3, 3e-3: 2.2}, seeds=(7, 8)) + scan("adamw", "e4m3", {1e-2: 2.25})
    assert main([str(fake_scan(tmp_path / "b", runs)), "--table", str(tmp_path / "t.yaml")]) == 2
    assert "its lrs were run on different seeds" in capsys.readouterr().err


def test_a_numbered_sweep_cannot_be_extended_in_place(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runs = scan("adamw", "e4m3", {1e-3: 2.3, 3e-3: 2.2})
    sweep = fake_scan(tmp_path / "sweep", runs, overrides=True)
    assert main([str(sweep), "--table", str(tmp_path / "t.yaml"), "--extend", str(tmp_path / "x.sh")]) == 2
    assert "numbers its job dirs" in capsys.readouterr().err and not (tmp_path / "x.sh").exists()


def test_a_grown_table_does_not_stop_a_resumed_sweep() -> None:
    """A rerun after lr_pick merged more picks into the table sees the same lrs in the config: not another run."""
    from altgrad.sweep.resume import config_differences

    stored = {"optimizer": {"lr": 1.0}, "baseline": {"lr": 3e-3}, "tuned_lr": {"e4m3": {"plain": 3e-3}}}
    grown = {**stored, "tuned_lr": {"e4m3": {"plain": 3e-3, "manifold": 1.0}, "e5m2": {"plain": 1e-2}}}
    assert config_differences(stored, grown) == []
    assert config_differences(stored, {**grown, "baseline": {"lr": 1e-2}}) == ["baseline.lr: 0.003 → 0.01"]

"""lr_pick: one learning rate per optimizer from a synthetic lr_scan sweep, written into a copy of the bundles."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from altgrad.report.load import load_sweeps
from altgrad.sweep.lr_pick import bundle_labels, main, pick_learning_rates, write_lr
from sweep_helpers import CONF_DIR


def fake_scan(root: Path, runs: list[tuple[str, str, float, int, str, float | None]]) -> Path:
    """Job dirs with summary.json: (optimizer_label, format, lr, seed, status, final_val_loss)."""
    for i, (label, fmt, lr, seed, status, loss) in enumerate(runs):
        job = root / f"{i}"
        job.mkdir(parents=True)
        job.joinpath("summary.json").write_text(json.dumps({
            "status": status, "optimizer": label.split("[")[0], "optimizer_label": label, "format": fmt, "lr": lr,
            "seed": seed, "final_val_loss": loss, "best_val_loss": loss, "experiment": "lr_scan", "master": "fp32",
            "storage_rounding": "nearest"}))
    return root


RUNS = [
    # adamw: 1e-3 best on average over formats (e4m3 alone would prefer 3e-3); 1e-2 diverged in one format
    ("adamw", "e4m3", 1e-3, 1, "completed", 2.0), ("adamw", "e5m2", 1e-3, 1, "completed", 2.2),
    ("adamw", "e4m3", 3e-3, 1, "completed", 1.9), ("adamw", "e5m2", 3e-3, 1, "completed", 2.6),
    ("adamw", "e4m3", 1e-2, 1, "completed", 1.5), ("adamw", "e5m2", 1e-2, 1, "diverged", None),
    # manifold[update]: 0.3 has two seeds in e4m3 (averaged first), 1.0 misses e5m2 (not a candidate)
    ("manifold[update]", "e4m3", 0.3, 1, "completed", 2.0), ("manifold[update]", "e4m3", 0.3, 2, "completed", 2.2),
    ("manifold[update]", "e5m2", 0.3, 1, "completed", 2.1), ("manifold[update]", "e4m3", 0.1, 1, "completed", 2.3),
    ("manifold[update]", "e5m2", 0.1, 1, "completed", 2.3), ("manifold[update]", "e4m3", 1.0, 1, "completed", 1.0),
    # madam: every lr broke somewhere
    ("madam", "e4m3", 0.01, 1, "failed", None), ("madam", "e5m2", 0.01, 1, "completed", 2.0),
]


def test_the_pick_is_the_stable_lr_with_the_lowest_format_mean(tmp_path: Path) -> None:
    picks = pick_learning_rates(load_sweeps([fake_scan(tmp_path, RUNS)]).jobs)
    assert picks["adamw"].lr == 1e-3 and picks["adamw"].score == pytest.approx(2.1)
    assert picks["adamw"].unstable == (1e-2,) and picks["adamw"].candidates == (1e-3, 3e-3)
    assert picks["manifold[update]"].lr == 0.3 and picks["manifold[update]"].score == pytest.approx((2.1 + 2.1) / 2)
    assert picks["manifold[update]"].candidates == (0.1, 0.3)
    assert picks["madam"].lr is None and "no lr completed" in picks["madam"].describe()


def test_bundles_are_found_by_the_label_their_runs_report() -> None:
    labels = bundle_labels()
    assert {k: v.stem for k, v in labels.items()} == {
        "adamw": "adamw", "manifold[update]": "manifold_update", "manifold[grad]": "manifold_grad",
        "madam": "madam", "grid[adam]": "grid"}


def test_write_replaces_only_the_lr_line(tmp_path: Path) -> None:
    bundle = tmp_path / "manifold_update.yaml"
    shutil.copy(CONF_DIR / "experiment" / "optim" / "manifold_update.yaml", bundle)
    before = OmegaConf.load(bundle)
    write_lr(bundle, 3.0, "lr_scan pick (test)")
    after = OmegaConf.load(bundle)
    assert after.optimizer.lr == 3.0 and isinstance(after.optimizer.lr, float)
    after.optimizer.lr = before.optimizer.lr
    assert after == before and "# lr_scan pick (test)" in bundle.read_text()
    write_lr(bundle, 1e-5, "again")
    assert OmegaConf.load(bundle).optimizer.lr == 1e-5


def test_cli_writes_the_picks_into_the_bundles(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    optim_dir = tmp_path / "conf" / "experiment" / "optim"
    shutil.copytree(CONF_DIR, tmp_path / "conf")
    sweep = fake_scan(tmp_path / "sweep", RUNS)
    madam_before = OmegaConf.load(optim_dir / "madam.yaml").optimizer.lr
    assert main([str(sweep), "--write", "--optim-dir", str(optim_dir)]) == 0
    out = capsys.readouterr().out
    assert "adamw: lr=0.001" in out and "madam: no lr completed" in out
    assert OmegaConf.load(optim_dir / "manifold_update.yaml").optimizer.lr == 0.3
    assert OmegaConf.load(optim_dir / "madam.yaml").optimizer.lr == madam_before  # nothing stable: left as it was
    assert main([str(tmp_path / "nowhere")]) == 2

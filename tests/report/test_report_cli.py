"""The whole report: report.md sections and rows, PNGs, partial sweeps, and the CLI's exit codes."""

from __future__ import annotations

import math
import subprocess
import sys
import types
from pathlib import Path

import pytest
from report_synthetic import write_job

from altgrad.report import write_report
from altgrad.report.__main__ import main
from altgrad.report.plots import plot_format_grids

REPO = Path(__file__).resolve().parents[2]
PNGS = ("val_loss.png", "val_loss_failure_stage.png", "benefit.png", "diagnostics.png", "parallel_coordinates.png")


@pytest.fixture(scope="module")
def full_report(ab_sweep: Path, stage_sweep: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_report([ab_sweep, stage_sweep], tmp_path_factory.mktemp("out"))


def test_report_sections_in_order(full_report: Path) -> None:
    text = full_report.read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == [
        "## Findings", "## ULP-aware benefit (Δ final val loss vs AdamW, paired by seed)", "## Validation loss",
        "## Divergences", "## Failure-stage attribution",
        "## Why: update stalls, flips, gradient fidelity, effective bits", "## Configuration vs final loss",
        "## Jobs"]


def test_report_rows(full_report: Path) -> None:
    text = full_report.read_text()
    assert "Which format benefits most: **not established** (no declared endpoint and contrasts)." in text
    assert "| ab/20 | e3m4 | manifold[update] | fp32 master | 0.3 | 2 | 40 | nonfinite loss |" in text
    assert "| e4m3 | adamw | forward+grad+storage | loss +16.8% vs fp32, Holm p = " in text
    assert "| e7m0 | adamw | forward | loss +3.2% vs fp32, Holm p = " in text
    assert "50 job dirs found; 8 did not complete." in text
    jobs = text[text.index("## Jobs"):]
    for state in ("| failed |", "| diverged |", "| corrupt |", "| missing |"):
        assert state in jobs
    assert "format=e7m0 optimizer=madam seed=1" in jobs  # a killed job is named by its Hydra overrides
    # the diagnostics table carries each format's AdamW stall ratio
    assert "| manifold_ab | e7m0 | fp32 master | — | adamw | 0.001 | 3 | 0.9 | 0.01 | 0.1 | 0.9 | 5 |" in text


def test_pngs_written_and_linked(full_report: Path) -> None:
    text = full_report.read_text()
    for name in PNGS:
        png = full_report.parent / name
        assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name})" in text
    grids = full_report.parent / "format_grids.png"
    assert ("](format_grids.png)" in text) == grids.exists()
    assert grids.exists() or "format value grids skipped" in text


def test_format_grids_with_and_without_quant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("altgrad.quant")

    def get_format(name: str) -> types.SimpleNamespace:
        if name == "e9m9":
            raise ValueError("unknown format 'e9m9'")
        return types.SimpleNamespace(values=lambda: [-1.0, -0.5, 0.0, 0.25, 0.5, 1.0])

    fake.get_format = get_format
    monkeypatch.setitem(sys.modules, "altgrad.quant", fake)
    png, note = plot_format_grids(["fp32", "e4m3", "e9m9"], tmp_path / "grids.png")
    assert png is not None and png.stat().st_size > 1000
    assert note == "formats without a known grid: e9m9 (unknown format 'e9m9')"
    monkeypatch.setitem(sys.modules, "altgrad.quant", types.ModuleType("altgrad.quant"))
    png, note = plot_format_grids(["e4m3"], tmp_path / "none.png")
    assert png is None and note.startswith("format value grids skipped: altgrad.quant is not importable")


def test_partial_sweep_of_broken_jobs_still_renders(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    write_job(sweep / "0", fmt="e4m3", optimizer="adamw", seed=0, final=None, status="failed", metrics=False,
              error="ValueError: bad config")
    (sweep / "1" / ".hydra").mkdir(parents=True)
    (sweep / "1" / ".hydra" / "overrides.yaml").write_text("- format=e5m2\n")
    odd = {"2": "[1, 2]", "3": '{"status": "running"}',
           "4": '{"status": "completed", "final_val_loss": "nan", "lr": "abc", "seed": "x", "diagnostics": [1],'
                ' "config": 5, "format": 7}'}
    for name, text in odd.items():
        (sweep / name).mkdir()
        (sweep / name / "summary.json").write_text(text)
    (sweep / "4" / "layer_map.json").write_text("not json")
    (sweep / "4" / "metrics.csv").write_text("step,val/loss\n1,2.5\nx,y\n")
    report = write_report([sweep])
    assert report == sweep / "report.md"
    text = report.read_text()
    assert "**Not established:**" in text and "5 jobs — 1 completed, 1 failed, 1 missing, 2 corrupt" in text
    assert "ValueError: bad config" in text and "summary.json holds list, not an object" in text
    assert "status 'running' is not one of completed, diverged, failed, interrupted" in text


def test_cli_subprocess_writes_into_the_sweep_dir(tmp_path: Path) -> None:
    sweep = tmp_path / "multirun" / "2025-01-01" / "12-00-00"
    # fp32 jobs: the format grid plot (and its torch import) is skipped, which keeps this subprocess quick
    for i, (opt, seed) in enumerate([("adamw", 0), ("manifold", 0), ("adamw", 1)]):
        write_job(sweep / str(i), fmt="fp32", optimizer=opt, seed=seed, final=3.0 + i / 10)
    done = subprocess.run([sys.executable, "-m", "altgrad.report", str(sweep)], check=False,
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote {sweep / 'report.md'}"
    assert (sweep / "report.md").read_text().startswith("# AltGrad sweep report")
    assert (sweep / "val_loss.png").stat().st_size > 1000


def test_cli_subprocess_refuses_missing_dir(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "altgrad.report", str(tmp_path / "nope")], check=False,
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: sweep folder ")
    assert "does not exist" in done.stderr and "multirun/DATE/TIME" in done.stderr


def test_cli_empty_dir_and_out_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: no jobs in ")
    write_job(tmp_path / "one" / "0", fmt="e4m3", optimizer="adamw", seed=0, final=3.0)
    assert main([str(tmp_path / "one"), "--out", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "report.md").is_file() and not (tmp_path / "one" / "report.md").exists()
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2


def declared_study(root: Path) -> Path:
    """A small declared study on disk: its evaluation (seeds 1–3), the reference rerun at a hand-set lr on the same
    seeds, and the tuning scans on seed 101 (another experiment, no declaration)."""
    declaration = {"metric": "final_val_loss", "horizon": 50, "formats": ["e4m3", "e5m2"], "tie_margin": 0.02,
                   "contrasts": [{"treatment": "manifold[update]", "reference": "adamw"}]}
    config = {"endpoint": declaration, "trainer": {"max_steps": 50}}
    gains = {"e4m3": -0.3, "e5m2": -0.1}
    for fmt, gain in gains.items():
        for seed in (1, 2, 3):
            base = 3.0 + 0.02 * seed
            write_job(root / "eval" / f"{fmt}-a-{seed}", fmt=fmt, optimizer="adamw", seed=seed, final=base, lr=1e-3,
                      experiment="study", config=dict(config, format={"name": fmt}))
            write_job(root / "eval" / f"{fmt}-m-{seed}", fmt=fmt, optimizer="manifold", seed=seed, lr=1.0,
                      final=base + gain + 0.01 * (seed % 2), experiment="study",
                      config=dict(config, format={"name": fmt}))
            rerun = write_job(root / "eval_lr" / f"{fmt}-a-{seed}", fmt=fmt, optimizer="adamw", seed=seed, lr=2e-3,
                              final=base + gain / 2, experiment="study", config=dict(config, format={"name": fmt}))
            (rerun / ".hydra" / "overrides.yaml").write_text(f"- format={fmt}\n- optimizer=adamw\n- seed={seed}\n"
                                                             "- optimizer.lr=0.002\n")
        for opt, lrs in (("adamw", (3e-4, 1e-3, 3e-3)), ("manifold", (0.3, 1.0, 3.0))):
            for lr in lrs:
                write_job(root / "tune" / f"{fmt}-{opt}-{lr:g}", fmt=fmt, optimizer=opt, seed=101, lr=lr,
                          final=3.0 + abs(math.log10(lr / (1e-3 if opt == "adamw" else 1.0))), experiment="tune",
                          config={"trainer": {"max_steps": 50}, "format": {"name": fmt}})
    return root


def test_a_declared_study_report_with_its_lr_sensitivity_regenerates_byte_for_byte(tmp_path: Path) -> None:
    runs = declared_study(tmp_path / "runs")
    first = write_report([runs], tmp_path / "out1").read_text()
    second = write_report([runs], tmp_path / "out2").read_text()
    assert first.replace("out1", "") == second.replace("out2", "")
    for name in ("val_loss.png", "lr_loss.png", "study_by_mantissa.png"):
        assert (tmp_path / "out1" / name).read_bytes() == (tmp_path / "out2" / name).read_bytes()
        assert f"]({name})" in first
    assert "### Sensitivity to the reference's lr" in first
    assert "| manifold[update] − adamw | e4m3 | evaluation | 1–3 | 0.002 |" in first
    assert "| manifold[update] − adamw | e4m3 | tuning | 101 | 0.001 (declared) |" in first
    assert "Note: 6 run(s) of the declaration set their lr by hand" in first
    # e4m3: Δ = −0.3 + 0.01·(1, 0, 1)/3 = −0.2933 declared; the rerun halves the gap: −0.15 + 0.0067 = −0.1433
    assert "e4m3 (Δ = -0.2933, adjusted p = 0.000258; against adamw at lr 0.002 instead: Δ = -0.1433" in first
    assert "Sensitivity on the tuning seed 101 (one run per lr, no CI): adamw's loss at its declared lr 0.001 was " \
           "the lowest of its scanned neighbours (0.0003, 0.003) in 2 of 2 formats" in first


def test_an_arm_keeps_its_colour_in_every_figure() -> None:
    from altgrad.report.plots import arm_palette

    one = arm_palette(["relative", "adamw", "manifold[update]"])
    two = arm_palette(["manifold[update]", "adamw", "relative", "adamw"])
    assert one == two and list(one) == ["adamw", "manifold[update]", "relative"]
    assert len(set(one.values())) == 3


def test_an_undeclared_lr_scan_goes_to_the_lr_figure_and_its_best_lr_to_the_curves(tmp_path: Path) -> None:
    from altgrad.report.cells import group_cells
    from altgrad.report.document import scans_and_picks
    from altgrad.report.load import load_sweeps

    for seed in (0, 1):
        for lr, loss in ((1e-3, 3.2), (3e-3, 3.0), (1e-2, 3.6)):
            write_job(tmp_path / "s" / f"a{lr:g}-{seed}", fmt="e4m3", optimizer="adamw", seed=seed, lr=lr,
                      final=loss + 0.01 * seed)
        write_job(tmp_path / "s" / f"m-{seed}", fmt="e4m3", optimizer="manifold", seed=seed, lr=0.3, final=2.9)
    cells = group_cells(load_sweeps([tmp_path / "s"]).jobs)
    shown, scans = scans_and_picks(cells)
    assert [(c["optimizer_label"], c["lr"]) for c in shown] == [("adamw", 3e-3), ("manifold[update]", 0.3)]
    assert len(scans) == 6 and {j.optimizer_label for j in scans} == {"adamw"}
    text = write_report([tmp_path / "s"], tmp_path / "out").read_text()
    assert "](lr_loss.png)" in text and (tmp_path / "out" / "lr_loss.png").stat().st_size > 1000

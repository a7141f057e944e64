"""Cells from real runs: a sweep over two model widths is one run dir per job and two cells in its report, and the
keys a cell ignores as "location" really change no number a run records (same weights, same losses, same metrics
rows)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fault_helpers import TINY, checkpoint, metric_rows, run_train, summary

from altgrad.report.cells import group_cells
from altgrad.report.document import write_report
from altgrad.report.load import load_sweeps


def test_a_sweep_over_two_model_widths_is_reported_as_two_cells(tmp_path: Path, offline_env: dict[str, str]) -> None:
    sweep = tmp_path / "sweep"
    result = run_train(["-m", *TINY, "trainer.max_steps=2", "model.n_embd=32,64", "seed=1,2",
                        f"hydra.sweep.dir={sweep}"], offline_env)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = [sweep / str(i) for i in range(4)]  # one run dir per job, in Hydra's order: width, then seed
    assert [summary(j)["seed"] for j in jobs] == [1, 2, 1, 2]
    assert all(summary(j)["status"] == "completed" and summary(j)["steps"] == 2 for j in jobs)
    assert all((j / "checkpoints" / "last.ckpt").is_file() for j in jobs)
    assert summary(jobs[0])["final_val_loss"] != summary(jobs[1])["final_val_loss"]  # the seed reaches the run
    cells = group_cells(load_sweeps([sweep]).jobs)
    assert sorted(c["setup"].split(" · ")[0] for c in cells) == ["model.n_embd=32", "model.n_embd=64"]
    assert [sorted(j.seed for j in c.jobs) for c in cells] == [[1, 2], [1, 2]]
    text = write_report([sweep], tmp_path / "report").read_text()
    assert "model.n_embd=32 · " in text and "model.n_embd=64 · " in text


@pytest.mark.slow  # two runs, one of them tokenizing into a new cache; the grouping itself: test_cells.py
def test_the_keys_a_cell_ignores_change_no_number(tmp_path: Path, offline_env: dict[str, str]) -> None:
    """Checkpointing every step, another progress refresh, a closing sample, another allocator policy, an MFU peak,
    a loader worker and another token cache folder: the same run, bit for bit, and one cell."""
    a, b = tmp_path / "a", tmp_path / "b"
    base = [*TINY, "trainer.max_steps=6"]
    assert run_train([*base, f"hydra.run.dir={a}"], offline_env).returncode == 0
    other = ["trainer.checkpoint_every_n_steps=1", "trainer.progress_refresh=3", "trainer.sample_tokens=20",
             "trainer.keep_freed_memory=false", "trainer.peak_flops=1e12", "data.num_workers=1",
             f"data.cache_dir={tmp_path / 'cache'}"]
    result = run_train([*base, *other, f"hydra.run.dir={b}"], offline_env)
    assert result.returncode == 0, result.stderr[-3000:]
    x, y = checkpoint(a)["state_dict"], checkpoint(b)["state_dict"]
    assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
    for key in ("initial_val_loss", "final_val_loss", "best_val_loss"):
        assert summary(a)[key] == summary(b)[key]
    assert [{k: v for k, v in r.items() if "mfu" not in k} for r in metric_rows(b)] == metric_rows(a)
    cells = group_cells(load_sweeps([tmp_path]).jobs)
    assert len(cells) == 1 and len(cells[0].jobs) == 2

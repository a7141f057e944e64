"""A report cell is one configuration: jobs pool as seeds only when their whole resolved configuration agrees except
the seeds and the keys that say where a run is written or how often it is shown or checkpointed."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from altgrad.report.benefit import ulp_benefits
from altgrad.report.cells import CELL_FIELDS, configuration, group_cells, stable_hash, varying_fields
from altgrad.report.endpoint import parse_endpoint
from altgrad.report.load import Job, load_sweeps
from altgrad.report.study import analyse
from altgrad.report.tables import benefit_table, cell_table

REPO = Path(__file__).resolve().parents[2]
BASE: dict[str, Any] = {
    "seed": 1, "run_name": "nano-e4m3-adamw-s1", "experiment_name": None, "ckpt_path": None,
    "model": {"name": "nano", "n_layer": 2, "n_embd": 32}, "format": {"name": "e4m3", "mbits": None},
    "optimizer": {"name": "adamw", "lr": 0.005, "betas": [0.9, 0.99]}, "baseline": {"lr": 0.005},
    "quant": {"master": "fp32", "storage_rounding": "nearest"},
    "data": {"name": "local", "path": "/data/train.txt", "seed": 1, "cache_dir": "~/.cache/altgrad",
             "num_workers": 0},
    "trainer": {"max_steps": 30, "val_check_interval": 10, "log_every_n_steps": 10, "checkpoint_every_n_steps": 100,
                "progress_refresh": 10, "sample_tokens": 200, "keep_freed_memory": True, "peak_flops": None},
    "callbacks": {"updates": {"every_n_steps": 10, "seed": 1}},
    "logger": {"csv": {"save_dir": "/runs/a"}}, "paths": {"output_dir": "/runs/a"},
    "tuned_lr": {"e4m3": {"manifold": 1.0}}, "endpoint": None,
}
LABEL = {"adamw": "adamw", "manifold": "manifold[update]"}


def _set(config: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = config
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def job(seed: int, final: float, optimizer: str = "adamw", lr: float = 0.005, fmt: str = "e4m3",
        name: str | None = None, data_files: dict[str, str] | None = None, **changes: Any) -> Job:
    """A completed job whose resolved config is BASE with `changes` (dotted keys; "__" for ".")."""
    config = copy.deepcopy(BASE)
    where = f"/runs/{name or f'{optimizer}-{seed}-{len(changes)}'}"
    for key, value in {"seed": seed, "data.seed": seed, "callbacks.updates.seed": seed, "optimizer.name": optimizer,
                       "optimizer.lr": lr, "format.name": fmt, "paths.output_dir": where,
                       "logger.csv.save_dir": where, "run_name": f"nano-{fmt}-{optimizer}-s{seed}"}.items():
        _set(config, key, value)
    for key, value in changes.items():
        _set(config, key.replace("__", "."), value)
    summary = {"status": "completed", "steps": config["trainer"]["max_steps"], "final_val_loss": final,
               "best_val_loss": final, "seed": seed, "format": fmt, "optimizer": optimizer,
               "optimizer_label": LABEL[optimizer], "model": "nano", "data": "local", "lr": lr, "master": "fp32",
               "storage_rounding": "nearest", "layer_map": "uniform", "experiment": None, "config": config}
    if data_files is not None:
        summary["data_files"] = data_files
    return Job(Path(where), name or where, "completed", summary)


# --- what splits a cell, what does not -------------------------------------------------------------------------------
def test_two_model_widths_are_two_cells_and_two_comparisons() -> None:
    """The probe's case: optimizer=adamw,manifold model.n_embd=32,128 seed=1,2 pooled the widths into one 'worse
    than AdamW' verdict; per width manifold is +0.97 at 32 and −0.06 at 128."""
    delta = {32: 0.97, 128: -0.06}
    jobs = [job(seed, 3.0 + width / 1000 + seed / 100 + (delta[width] + seed / 1000 if opt == "manifold" else 0),
                opt, lr=1.0 if opt == "manifold" else 0.005, model__n_embd=width)
            for width in (32, 128) for opt in ("adamw", "manifold") for seed in (1, 2)]
    cells = group_cells(jobs)
    assert len(cells) == 4 and all(len(c.jobs) == 2 for c in cells)
    assert "setup" in varying_fields(cells) and "config" not in varying_fields(cells)
    assert {c["setup"].split(" · ")[0] for c in cells} == {"model.n_embd=32", "model.n_embd=128"}
    benefits = ulp_benefits(cells)
    assert sorted(round(b.diff.diff.mean, 4) for b in benefits) == [-0.0585, 0.9715]
    assert all(b.treatment["setup"] == b.baseline["setup"] for b in benefits)
    table = benefit_table(benefits)
    assert "model.n_embd=32 · " in table and "model.n_embd=128 · " in table
    assert "model.n_embd=32 · " in cell_table(cells)


@pytest.mark.parametrize("key,value", [
    ("paths.output_dir", "/elsewhere"), ("logger.csv.save_dir", "/elsewhere"), ("ckpt_path", "/runs/a"),
    ("run_name", "renamed"), ("data.cache_dir", "/scratch"), ("data.num_workers", 4),
    ("trainer.checkpoint_every_n_steps", 7), ("trainer.progress_refresh", 1), ("trainer.sample_tokens", 0),
    ("trainer.keep_freed_memory", False), ("trainer.peak_flops", 1e15), ("trainer.profiler", "simple"),
    ("tuned_lr.e4m3.manifold", 3.0),
    ("endpoint", {"metric": "final_val_loss"}), ("callbacks.updates.seed", 99), ("data.seed", 99),
])
def test_where_a_run_is_written_and_how_it_is_shown_never_split_a_cell(key: str, value: Any) -> None:
    cells = group_cells([job(1, 3.0), job(2, 3.1, name="moved", **{key.replace(".", "__"): value})])
    assert len(cells) == 1 and len(cells[0].jobs) == 2


@pytest.mark.parametrize("key,value", [
    ("trainer.max_steps", 1000),            # a 1,000-step and a 30-step sweep
    ("trainer.val_check_interval", 5),      # best_val_loss is a minimum over the validations run
    ("trainer.log_every_n_steps", 1),       # the instruments' interval
    ("baseline.lr", 0.01),                  # two baseline.lr values in one row
    ("data.path", "/data/other.txt"),       # two data files (no sha256 recorded: the path is all we know)
    ("format.mbits", 20),                   # format=e4m3 format.mbits=20 is a 25-bit grid, not e4m3
    ("optimizer.betas", [0.9, 0.95]),       # the same optimizer and lr, other betas
    ("model.n_layer", 4),
])
def test_anything_else_splits_a_cell(key: str, value: Any) -> None:
    cells = group_cells([job(1, 3.0), job(2, 3.1), job(1, 3.2, name="other", **{key.replace(".", "__"): value})])
    assert sorted(len(c.jobs) for c in cells) == [1, 2]
    apart = "setup" if not key.startswith(("optimizer.", "baseline.")) else "config"
    assert apart in varying_fields(cells)
    labels = {c[apart].split(" · ")[0] for c in cells}
    assert any(key in label for label in labels)  # the report names the key that sets them apart


def test_data_is_identified_by_its_files_sha256_not_its_folder() -> None:
    """A study moved to another machine (another folder, the same files) still pools; other content does not."""
    here = {"/home/a/eurlex/train.txt": "aa11", "/home/a/eurlex/validation.txt": "bb22"}
    there = {"/scratch/b/eurlex/train.txt": "aa11", "/scratch/b/eurlex/validation.txt": "bb22"}
    edited = {"/home/a/eurlex/train.txt": "cc33", "/home/a/eurlex/validation.txt": "bb22"}
    moved = [job(1, 3.0, data_files=here, data__path="/home/a/eurlex"),
             job(2, 3.1, name="b", data_files=there, data__path="/scratch/b/eurlex")]
    assert len(group_cells(moved)) == 1
    assert "data.path" not in configuration(moved[0]) and ("train.txt", "aa11") in configuration(moved[0])["data_files"]
    assert len(group_cells([*moved, job(3, 3.2, name="c", data_files=edited, data__path="/home/a/eurlex")])) == 2
    # data=folder records file names: the folder (data.dir) is where, the names and contents are what
    folder = {"train.txt": "aa11", "validation.txt": "bb22"}
    assert len(group_cells([job(1, 3.0, name="f1", data_files=folder, data__dir="/work/shared/data/eurlex-en"),
                            job(2, 3.1, name="f2", data_files=folder, data__dir="/mnt/eurlex-en")])) == 1


def test_a_custom_grid_is_never_pooled_with_its_preset() -> None:
    """An older record of format=e4m3 format.mbits=20 says "format": "e4m3" in its summary; its config does not."""
    cells = group_cells([job(1, 3.0), job(2, 3.1), job(1, 2.0, name="wide", format__mbits=20)])
    assert sorted(len(c.jobs) for c in cells) == [1, 2]


def test_the_configuration_hash_is_stable() -> None:
    """The same on every machine and in every report (sha256 of the sorted keys as JSON)."""
    assert stable_hash({"model.n_embd": 32, "format.name": "e4m3"}) == "65df08aa"
    assert stable_hash(configuration(job(1, 3.0))) == stable_hash(configuration(job(2, 3.5, name="x")))


def test_the_committed_records_group_as_before() -> None:
    """docs/results/study-cpu/runs: every cell is what the report's fields alone made of it (their configurations
    really are equal), so the committed report's numbers stand."""
    jobs = load_sweeps([REPO / "docs" / "results" / "study-cpu" / "runs"]).jobs
    cells = group_cells(jobs)
    old_fields = [f for f in CELL_FIELDS if f not in ("setup", "config")]
    old = {}
    for j in jobs:
        if j.state in ("completed", "diverged", "failed"):
            old.setdefault(tuple(str(c) for c in (j.get("experiment"), j.get("model"), j.get("data"),
                                                   j.get("layer_map"), j.format, j.storage, j.optimizer_label,
                                                   j.lr)), set()).add(j.name)
    assert sorted(sorted(c.name for c in cell.jobs) for cell in cells) == sorted(sorted(v) for v in old.values())
    assert set(varying_fields(cells)) <= set(old_fields)  # no hash column where nothing needs one


# --- a requested grouping that mixes configurations says so --------------------------------------------------------
ENDPOINT = {"metric": "final_val_loss", "horizon": None, "formats": ["e4m3"], "correction": "none",
            "contrasts": [{"treatment": "manifold[update]", "reference": "adamw"}]}


def test_an_endpoint_arm_that_pools_configurations_is_named_and_left_out() -> None:
    jobs = [job(seed, 3.0 + seed / 10 + (0.1 if opt == "manifold" else 0), opt, name=f"{opt}{seed}{width}",
                model__n_embd=width) for opt in ("adamw", "manifold") for seed in (1, 2, 3) for width in (32, 128)]
    result = analyse(parse_endpoint(ENDPOINT), jobs)
    assert any("pools runs of different configurations (they differ in model.n_embd)" in n for n in result.notes)
    assert result.comparisons[0].deltas == {}


def test_a_contrast_whose_arms_ran_different_setups_is_not_compared() -> None:
    jobs = [job(seed, 3.0 + seed / 10, "adamw", name=f"a{seed}") for seed in (1, 2, 3)]
    jobs += [job(seed, 2.9 + seed / 10, "manifold", name=f"m{seed}", trainer__max_steps=1000) for seed in (1, 2, 3)]
    comparison = analyse(parse_endpoint(ENDPOINT), jobs).comparisons[0]
    assert comparison.why_missing == "the arms ran different setups (trainer.max_steps)" and comparison.deltas == {}

"""The pieces behind the fault handling, in process: interrupt guard, records kept on resume, configuration checks,
run-dir claims, the memory bound and the range warning."""

from __future__ import annotations

import csv
import logging
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from altgrad.config import ConfigError
from altgrad.interrupts import InterruptGuard, RunInterrupted, exit_code, signal_name
from altgrad.metrics_csv import AppendingWriter
from altgrad.preflight import check_step_memory, step_memory_bytes
from altgrad.resume_check import CheckpointError, config_differences, plan_resume, state_config
from altgrad.run_dir import RunDirError, check_free, claim, probe
from altgrad.sweep.resume import config_differences as sweep_differences


# --- interrupts --------------------------------------------------------------------------------------------------
def test_exit_codes_are_128_plus_the_signal() -> None:
    assert [exit_code(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)] == [130, 143, 138]
    assert signal_name(signal.SIGTERM) == "SIGTERM"


def test_the_guard_raises_at_once_until_training_then_waits_for_the_step_boundary() -> None:
    guard = InterruptGuard()
    guard.install()
    try:
        with pytest.raises(RunInterrupted) as err:
            os.kill(os.getpid(), signal.SIGTERM)
        assert err.value.signum == signal.SIGTERM and guard.signum == signal.SIGTERM
        guard.reset()
        guard.deferring = True
        os.kill(os.getpid(), signal.SIGINT)  # noted, not raised
        assert guard.requested and guard.signum == signal.SIGINT
        with pytest.raises(RunInterrupted):  # a second signal stops at once
            os.kill(os.getpid(), signal.SIGINT)
        assert guard.signum == signal.SIGINT  # the first one is what the run reports
    finally:
        guard.uninstall()
    assert signal.getsignal(signal.SIGTERM) != guard._handle


# --- metrics.csv across a resume in place ------------------------------------------------------------------------
def _write(path: Path, rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["epoch", "g", "step", "train/loss"])
        writer.writeheader()
        writer.writerows(rows)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


ROWS = [{"epoch": "", "g": "", "step": "0", "train/loss": ""},   # step-0 validation
        {"epoch": "", "g": "1.0", "step": "1", "train/loss": ""},  # an instrument's row of step 1
        {"epoch": "0", "g": "", "step": "0", "train/loss": "5.0"},  # Lightning's row of step 1
        {"epoch": "", "g": "2.0", "step": "2", "train/loss": ""},
        {"epoch": "0", "g": "", "step": "1", "train/loss": "4.0"},
        {"epoch": "", "g": "3.0", "step": "3", "train/loss": ""},  # logged after a checkpoint at step 2
        {"epoch": "0", "g": "", "step": "2", "train/loss": "3.0"}]


def test_an_interrupted_runs_rows_are_all_kept_and_appended_to(tmp_path: Path) -> None:
    _write(tmp_path / "metrics.csv", ROWS)
    writer = AppendingWriter(str(tmp_path), keep_rows=4, before_step=None)
    writer.log_metrics({"train/loss": 2.5}, step=3)
    writer.save()
    rows = _rows(tmp_path / "metrics.csv")
    assert rows[: len(ROWS)] == ROWS and rows[-1]["train/loss"] == "2.5"


def test_a_killed_runs_rows_after_its_checkpoint_are_dropped(tmp_path: Path) -> None:
    _write(tmp_path / "metrics.csv", ROWS)
    AppendingWriter(str(tmp_path), keep_rows=4, before_step=2)  # checkpoint at step 2, 4 rows written by then
    assert _rows(tmp_path / "metrics.csv") == ROWS[:5]  # + Lightning's own row of step 2 (logged as step 1)


def test_new_metric_keys_rewrite_the_header_and_keep_the_rows(tmp_path: Path) -> None:
    _write(tmp_path / "metrics.csv", ROWS[:3])
    writer = AppendingWriter(str(tmp_path), keep_rows=None, before_step=None)
    writer.log_metrics({"val/loss": 4.2}, step=5)
    writer.save()
    rows = _rows(tmp_path / "metrics.csv")
    assert [r["step"] for r in rows] == ["0", "1", "0", "5"] and rows[-1]["val/loss"] == "4.2"


# --- resume configuration check ----------------------------------------------------------------------------------
BASE = {"seed": 1, "model": {"name": "nano", "n_layer": 4}, "format": {"name": "e4m3"}, "quant": {"master": "fp32"},
        "optimizer": {"name": "adamw", "lr": 1e-3}, "data": {"name": "embedded", "cache_dir": "/a", "seed": 1},
        "trainer": {"max_steps": 300}, "paths": {"output_dir": "/runs/a"},
        "logger": {"csv": {"save_dir": "/runs/a"}}, "ckpt_path": None}


def _changed(**changes: object) -> dict:
    cfg = OmegaConf.create(BASE)
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value)
    return OmegaConf.to_container(cfg)


def test_where_things_are_written_and_how_long_to_train_never_count() -> None:
    moved = _changed(**{"paths.output_dir": "/elsewhere", "logger.csv.save_dir": "/elsewhere",
                        "data.cache_dir": "/cache2", "trainer.max_steps": 600, "ckpt_path": "/runs/a"})
    assert config_differences(BASE, moved) == []
    assert sweep_differences(BASE, moved) == [  # a sweep's identity includes the grid's max_steps
        "trainer.max_steps: 300 → 600"]


@pytest.mark.parametrize("key,value", [("format.name", "e5m2"), ("quant.master", "none"), ("model.n_layer", 2),
                                       ("optimizer.lr", 3e-3), ("seed", 2)])
def test_what_shapes_the_state_counts(key: str, value: object) -> None:
    assert [d.split(":")[0] for d in config_differences(BASE, _changed(**{key: value}))] == [key]


@settings(max_examples=25, deadline=None)
@given(st.dictionaries(st.sampled_from(["format.name", "optimizer.lr", "paths.output_dir", "trainer.max_steps"]),
                       st.integers(0, 3)))
def test_differences_are_symmetric_and_only_state_keys(changes: dict[str, int]) -> None:
    other = _changed(**changes)
    forward, backward = config_differences(BASE, other), config_differences(other, BASE)
    assert len(forward) == len(backward)
    assert all(d.split(":")[0] in state_config(other) or d.split(":")[0] in state_config(BASE) for d in forward)


def _checkpoint(path: Path, config: dict, step: int = 4) -> Path:
    torch.save({"state_dict": {"w": torch.zeros(2)}, "global_step": step, "optimizer_states": [],
                "altgrad": {"config": config, "metrics_rows": 7}}, path)
    return path


def test_plan_resume_names_the_keys_and_the_override_lets_it_through(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "last.ckpt", BASE)
    with pytest.raises(CheckpointError, match=r"format\.name: 'e4m3' → 'e5m2'.*\+resume_with_new_config=true"):
        plan_resume(ckpt, _changed(**{"format.name": "e5m2"}), max_steps=10)
    plan = plan_resume(ckpt, {**_changed(**{"optimizer.name": "sgd"}), "resume_with_new_config": True}, 10)
    assert plan.optimizer_changed and plan.step == 4 and plan.metrics_rows == 7
    with pytest.raises(CheckpointError, match="another model shape"):
        plan_resume(ckpt, {**_changed(**{"model.n_layer": 2}), "resume_with_new_config": True}, 10)
    with pytest.raises(CheckpointError, match="already reaches trainer.max_steps=4"):
        plan_resume(ckpt, BASE, max_steps=4)
    assert plan_resume(ckpt, _changed(**{"paths.output_dir": "/moved"}), 10).differences == []


@pytest.mark.parametrize("status,finishes", [("interrupted", True), ("failed", True), (None, True),
                                             ("completed", False), ("diverged", False)])
def test_a_checkpoint_at_max_steps_is_finished_only_for_a_run_without_result(tmp_path: Path, status: str | None,
                                                                            finishes: bool) -> None:
    """Interrupted after its last step (before the final validation): resuming it finishes it. A run with a result
    has nothing left to do, and a loose checkpoint file has no run to finish."""
    (tmp_path / "checkpoints").mkdir()
    ckpt = _checkpoint(tmp_path / "checkpoints" / "last.ckpt", BASE, step=4)
    if status is not None:
        (tmp_path / "summary.json").write_text(f'{{"status": "{status}", "steps": 4}}')
    if finishes:
        assert plan_resume(ckpt, BASE, max_steps=4).step == 4
    else:
        with pytest.raises(CheckpointError, match="nothing to train"):
            plan_resume(ckpt, BASE, max_steps=4)
    with pytest.raises(CheckpointError, match="nothing to train"):
        plan_resume(_checkpoint(tmp_path / "loose.ckpt", BASE, step=4), BASE, max_steps=4)


# --- run dirs ------------------------------------------------------------------------------------------------------
def test_a_claimed_folder_is_refused_while_its_run_lives(tmp_path: Path) -> None:
    held = claim(tmp_path / "run", None)
    try:
        with pytest.raises(RunDirError, match="in use by a live run"):
            probe(tmp_path / "run", None)
    finally:
        held.release()
    probe(tmp_path / "run", None)  # released (as at the process's end): free again
    claim(tmp_path / "run", None).release()


@pytest.mark.parametrize("status", ["completed", "diverged"])
def test_a_folder_with_results_is_refused_unless_resumed_there(tmp_path: Path, status: str) -> None:
    (tmp_path / "summary.json").write_text(f'{{"status": "{status}", "steps": 5}}')
    with pytest.raises(RunDirError, match=f"already holds a {status} run"):
        check_free(tmp_path, None)
    check_free(tmp_path, tmp_path / "checkpoints" / "last.ckpt")


@pytest.mark.parametrize("status", ["interrupted", "failed", None])
def test_an_unfinished_runs_checkpoint_is_refused_unless_resumed_there(tmp_path: Path, status: str | None) -> None:
    """Interrupted, failed or killed (no summary): its checkpoint is work a fresh run would overwrite."""
    if status is not None:
        (tmp_path / "summary.json").write_text(f'{{"status": "{status}", "steps": 5}}')
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"state")
    what = f"an? {status} run \\(5 steps\\)" if status else "a run that ended without a summary \\(killed\\)"
    with pytest.raises(RunDirError, match=f"already holds {what} and its checkpoint; resume it with ckpt_path="):
        check_free(tmp_path, None)
    check_free(tmp_path, tmp_path / "checkpoints" / "last.ckpt")


@pytest.mark.parametrize("status", ["failed", "interrupted"])
def test_a_folder_whose_run_left_no_checkpoint_may_be_reused(tmp_path: Path, status: str) -> None:
    """A run stopped before its first step (a signal in the sanity check, say) says 'rerun the same command'."""
    (tmp_path / "summary.json").write_text(f'{{"status": "{status}", "steps": 0, "checkpoint": null}}')
    check_free(tmp_path, None)


def test_a_claim_writes_nothing_until_the_run_commits(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "summary.json").write_text('{"status": "interrupted", "steps": 3}')
    (run_dir / ".run.lock").write_text("pid 1 on elsewhere\n")
    orphan = run_dir / "checkpoints" / ".last.ckpt.0123456789abcdef0123456789abcdef.tmp"
    orphan.write_bytes(b"half a checkpoint")
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"state")
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    held = claim(run_dir, run_dir / "checkpoints" / "last.ckpt")
    try:
        assert not held.fresh and {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
        held.commit()  # the run passed its checks: it says who holds the folder, and clears a killed writer's files
        assert not orphan.exists() and (run_dir / "checkpoints" / "last.ckpt").read_bytes() == b"state"
        assert (run_dir / ".run.lock").read_text().startswith(f"pid {os.getpid()} ")
    finally:
        held.release()
    assert claim(tmp_path / "new", None).fresh


# --- memory bound and range warning --------------------------------------------------------------------------------
def _cfg(block: int, batch: int = 16) -> SimpleNamespace:
    return SimpleNamespace(model=SimpleNamespace(block_size=block, n_layer=4, n_embd=128, vocab_size=None),
                           data=SimpleNamespace(batch_size=batch),
                           trainer=SimpleNamespace(precision="32-true", accelerator="cpu"))


def test_the_step_memory_bound() -> None:
    assert step_memory_bytes(16, 128, 4, 128, 257) == 16 * 128 * (4 * 12 * 128 + 4 * 257) * 4
    check_step_memory(_cfg(128), 257, available=2**30)  # the default nano step: ≈ 59 MB
    with pytest.raises(ConfigError, match=r"model.block_size=100000 with data.batch_size=16 needs at least 42\.7 GiB"):
        check_step_memory(_cfg(100_000), 257, available=22 * 2**30)


def test_the_range_warning_names_format_layer_and_role_once(caplog: pytest.LogCaptureFixture) -> None:
    from altgrad.callbacks.range_warning import RangeWarning
    from altgrad.quant import STAT_NAMES

    stats = torch.zeros(len(STAT_NAMES))
    stats[STAT_NAMES.index("frac_zero")] = 0.9
    spec = SimpleNamespace(format=SimpleNamespace(name="e0m7"), scaling=SimpleNamespace(kind="none"))
    quantizer = SimpleNamespace(stats=stats, spec=spec, stats_record=SimpleNamespace(step=1))
    roles = [("transformer.h.0.mlp.c_fc", "grad", quantizer), ("transformer.h.0.mlp.c_proj", "grad", quantizer)]
    warning = RangeWarning()
    trainer = SimpleNamespace(global_step=2)
    import altgrad.callbacks.range_warning as rw

    original = (rw.quantizer_roles, rw.backbone)
    rw.quantizer_roles, rw.backbone = (lambda model: roles), (lambda module: module)
    try:
        with caplog.at_level(logging.WARNING, logger=rw.__name__):
            warning.on_train_batch_end(trainer, None, None, None, 0)
            quantizer.stats_record.step = 2
            warning.on_train_batch_end(trainer, None, None, None, 0)
    finally:
        rw.quantizer_roles, rw.backbone = original
    assert [r.getMessage() for r in caplog.records] == [
        "e0m7 flushes to zero 90% of transformer.h.0.mlp.c_fc's grad (and 1 more layers) at step 2 (scaling: none); "
        "warned once per role"]


def test_a_launchers_own_handler_gets_the_signal_after_the_run_stopped() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: seen.append(signum))
    guard = InterruptGuard()
    try:
        guard.install()
        guard.uninstall()
        handler = guard.handler_before(signal.SIGUSR2)
        assert handler is not None
        handler(signal.SIGUSR2, None)
        assert seen == [signal.SIGUSR2]
        assert guard.handler_before(signal.SIGINT) is None  # Python's KeyboardInterrupt is not forwarded
    finally:
        signal.signal(signal.SIGUSR2, previous)

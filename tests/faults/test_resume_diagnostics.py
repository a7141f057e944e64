"""A resumed quantized run is the run without a stop, bit for bit: weights, optimizer moments, lr schedule, the
training losses (dropout on, so the global RNG state must come back too), and what the instruments record: its
metrics.csv cell for cell (the flips' oscillation EMA included) and every run-level aggregate of
summary.json["diagnostics"] (update sizes in ULPs, flip and stall means, effective bits, gradient and range extremes),
because the instruments keep their accumulators in the checkpoint. Before, a resumed run's aggregates covered only the
steps after the resume (study 2's first pilot: ``mean_zero_update_frac`` from step 1250 of 4000). A resume into
another format (+resume_with_new_config) is recorded as one and starts the instruments afresh."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from fault_helpers import checkpoint, run_train, summary

RUN = ["model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32", "model.dropout=0.1",
       "data.batch_size=4", "data.corpus_chars=200000", "data.val_batches=2", "format=e4m3", "logger=csv",
       "trainer.sample_tokens=0", "trainer.val_check_interval=4", "trainer.log_every_n_steps=2",
       "schedule.decay_steps=8", "callbacks.flips.every_n_steps=2", "callbacks.updates.every_n_steps=2",
       "callbacks.grads.every_n_steps=2", "callbacks.bits.every_n_steps=2", "callbacks.stability.every_n_steps=2"]


def cells(run_dir: Path) -> dict[int, dict[str, str]]:
    """metrics.csv by step, less wall-clock columns (one step's values may span several rows)."""
    out: dict[int, dict[str, str]] = {}
    with (run_dir / "metrics.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            out.setdefault(int(row["step"]), {}).update(
                {k: v for k, v in row.items() if v != "" and "tokens_per_s" not in k and k not in ("step", "epoch")})
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str]) -> dict[str, Path]:
    """The 8-step run straight through, and its first 5 steps on their own (stopped mid-interval: the flips' counts
    of step 5 travel in the checkpoint)."""
    root = tmp_path_factory.mktemp("resume_diagnostics")
    out = {"straight": root / "straight", "first": root / "first"}
    for name, steps in (("straight", 8), ("first", 5)):
        result = run_train([*RUN, f"trainer.max_steps={steps}", f"hydra.run.dir={out[name]}"], offline_env)
        assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_a_resumed_run_is_the_straight_run_instruments_included(tmp_path: Path, runs: dict[str, Path],
                                                                 offline_env: dict[str, str]) -> None:
    straight, resumed = runs["straight"], tmp_path / "resumed"
    result = run_train([*RUN, "trainer.max_steps=8", f"ckpt_path={runs['first']}", f"hydra.run.dir={resumed}"],
                       offline_env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert summary(resumed)["resumed_at_step"] == 5
    a, b = checkpoint(straight), checkpoint(resumed)
    assert a["global_step"] == b["global_step"] == 8
    assert a["state_dict"].keys() == b["state_dict"].keys()
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    moments = list(zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()))
    assert moments and all(torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
                           for sa, sb in moments)
    assert a["lr_schedulers"] == b["lr_schedulers"]
    sa, sb = summary(straight), summary(resumed)
    assert sa["final_val_loss"] == sb["final_val_loss"]
    assert len(sa["diagnostics"]) > 20 and sa["diagnostics"]["update_steps_sampled"] == 4.0
    assert sb["diagnostics"] == sa["diagnostics"]
    later, before = cells(resumed), cells(straight)
    assert sorted(later) == [5, 6, 7, 8] and all(later[step] == before[step] for step in later)
    assert all("train/loss" in later[step] for step in (5, 7))  # the losses too, to the last digit
    flips = next(v for k, v in b["callbacks"].items() if k.startswith("FlipCallback"))
    assert flips["run_state"]["osc_steps"] == 8 and len(flips["layers"]) == 9  # every step; 8 Linears + the head


def test_a_resume_under_a_new_configuration_starts_the_instruments_afresh(tmp_path: Path, runs: dict[str, Path],
                                                                           offline_env: dict[str, str]) -> None:
    """Fine-tuning a checkpoint in another format (+resume_with_new_config): recorded as such (what changed, the
    stored and the new config), and the summary's diagnostics describe the steps under the new format alone, as a
    run of those steps that started from the same weights would."""
    resumed = tmp_path / "resumed"
    result = run_train([*RUN, "format=e5m2", "trainer.max_steps=8", f"ckpt_path={runs['first']}",
                        "+resume_with_new_config=true", f"hydra.run.dir={resumed}"], offline_env)
    assert result.returncode == 0, result.stderr[-3000:]
    b = summary(resumed)
    assert b["status"] == "completed" and b["steps"] == 8
    assert b["resumed_at_step"] == 5 and b["diagnostics_from_step"] == 5
    assert any(d.startswith("format.name") for d in b["resumed_with_new_config"])
    assert b["resumed_from_config"]["format"]["name"] == "e4m3" and b["config"]["format"]["name"] == "e5m2"
    assert b["diagnostics"]["update_steps_sampled"] == 2.0  # steps 6 and 8, not 2 and 4 of the e4m3 part too
    flips = next(v for k, v in checkpoint(resumed)["callbacks"].items() if k.startswith("FlipCallback"))
    assert flips["run_state"]["osc_steps"] == 3  # steps 6–8 only

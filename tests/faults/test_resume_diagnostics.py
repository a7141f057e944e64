"""A resumed quantized run records what the same run without a stop records: its metrics.csv cell for cell (the
flips' oscillation EMA included) and every run-level aggregate of summary.json["diagnostics"] (update sizes in ULPs,
flip and stall means, effective bits, gradient and range extremes), because the instruments keep their accumulators
in the checkpoint. Before, a resumed run's aggregates covered only the steps after the resume (study 2's first
pilot: ``mean_zero_update_frac`` from step 1250 of 4000)."""

from __future__ import annotations

import csv
from pathlib import Path

from fault_helpers import checkpoint, run_train, summary

RUN = ["model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32", "data.batch_size=4",
       "data.corpus_chars=200000", "data.val_batches=2", "format=e4m3", "logger=csv", "trainer.sample_tokens=0",
       "trainer.val_check_interval=4", "trainer.log_every_n_steps=2", "schedule.decay_steps=8",
       "callbacks.flips.every_n_steps=2", "callbacks.updates.every_n_steps=2", "callbacks.grads.every_n_steps=2",
       "callbacks.bits.every_n_steps=2", "callbacks.stability.every_n_steps=2"]


def cells(run_dir: Path) -> dict[int, dict[str, str]]:
    """metrics.csv by step, less wall-clock columns (one step's values may span several rows)."""
    out: dict[int, dict[str, str]] = {}
    with (run_dir / "metrics.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            out.setdefault(int(row["step"]), {}).update(
                {k: v for k, v in row.items() if v != "" and "tokens_per_s" not in k and k not in ("step", "epoch")})
    return out


def test_a_resumed_run_keeps_the_instruments_accumulators(tmp_path: Path, offline_env: dict[str, str]) -> None:
    straight, first, resumed = tmp_path / "straight", tmp_path / "first", tmp_path / "resumed"
    for args in ([*RUN, "trainer.max_steps=8", f"hydra.run.dir={straight}"],
                 [*RUN, "trainer.max_steps=5", f"hydra.run.dir={first}"],
                 [*RUN, "trainer.max_steps=8", f"ckpt_path={first}", f"hydra.run.dir={resumed}"]):
        result = run_train(args, offline_env)
        assert result.returncode == 0, result.stderr[-3000:]
    assert summary(resumed)["resumed_at_step"] == 5  # mid-interval: the flips' counts of step 5 travel too
    a, b = summary(straight), summary(resumed)
    assert a["final_val_loss"] == b["final_val_loss"]
    assert len(a["diagnostics"]) > 20 and a["diagnostics"]["update_steps_sampled"] == 4.0
    assert b["diagnostics"] == a["diagnostics"]
    later = cells(resumed)
    assert later and all(later[step] == cells(straight)[step] for step in later)
    state = checkpoint(resumed)["callbacks"]
    flips = next(v for k, v in state.items() if k.startswith("FlipCallback"))
    assert flips["run_state"]["osc_steps"] == 8 and len(flips["layers"]) == 9  # every step; 8 Linears + the head


def test_a_resume_under_a_new_configuration_starts_the_instruments_afresh(tmp_path: Path,
                                                                           offline_env: dict[str, str]) -> None:
    """Fine-tuning a checkpoint in another format (+resume_with_new_config): the summary's diagnostics describe the
    steps under the new format alone, as a run of those steps that started from the same weights would."""
    first, resumed = tmp_path / "first", tmp_path / "resumed"
    for args in ([*RUN, "trainer.max_steps=4", f"hydra.run.dir={first}"],
                 [*RUN, "format=e5m2", "trainer.max_steps=8", f"ckpt_path={first}", "+resume_with_new_config=true",
                  f"hydra.run.dir={resumed}"]):
        result = run_train(args, offline_env)
        assert result.returncode == 0, result.stderr[-3000:]
    b = summary(resumed)
    assert b["resumed_at_step"] == 4 and b["diagnostics_from_step"] == 4
    assert any(d.startswith("format.name") for d in b["resumed_with_new_config"])
    assert b["diagnostics"]["update_steps_sampled"] == 2.0  # steps 6 and 8, not 2 and 4 of the e4m3 part too
    state = checkpoint(resumed)["callbacks"]
    flips = next(v for k, v in state.items() if k.startswith("FlipCallback"))
    assert flips["run_state"]["osc_steps"] == 4  # steps 5–8 only

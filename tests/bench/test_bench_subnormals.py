"""The subnormals bench: subnormal attention probabilities counted, the flush state restored, a run dir read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from altgrad.bench import subnormals
from altgrad.model import GPT, GPTConfig
from bench_helpers import TINY, run_cli


def _model(score_gain: float) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32, dropout=0.0, bias=False))
    with torch.no_grad():
        model.transformer.h[0].attn.c_attn.weight[:64].mul_(score_gain)  # q and k rows: scores × gain²
    return model


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    idx = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(1))
    return [(idx[:, :-1], idx[:, 1:])]


def test_peaked_attention_has_subnormal_probabilities_and_a_plain_one_none() -> None:
    (plain,) = subnormals.attention_rows(_model(1.0), _batches())
    (peaked,) = subnormals.attention_rows(_model(40.0), _batches())
    assert plain["layer"] == "transformer.h.0.attn"
    assert plain["subnormal"] == 0.0 and plain["zero"] == 0.0
    assert peaked["subnormal"] > 0.0 and peaked["entropy"] < plain["entropy"]
    assert 0.0 <= peaked["subnormal"] + peaked["zero"] <= 1.0


def test_timing_leaves_subnormals_kept() -> None:
    model = _model(40.0)
    got = subnormals.timed(subnormals.step_fn(model, _batches()), 1, repeats=1)
    assert set(got) == {False, True} and all(v > 0 for v in got.values())
    assert float(torch.tensor(1e-40) * torch.tensor(1.0)) != 0.0  # flushing switched off again
    moves = subnormals.op_moves(subnormals.step_fn(model, _batches()), top=2)
    assert len(moves) == 2 and all(isinstance(name, str) for name, _, _ in moves)
    assert float(torch.tensor(1e-40) * torch.tensor(1.0)) != 0.0


def test_a_dir_without_a_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"no checkpoints/last.ckpt; give the dir of a `python -m altgrad.train` run"):
        subnormals.load_run(tmp_path)


def test_a_trained_runs_dir_is_rebuilt_and_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    proc = run_cli(*TINY, "format=e4m3", "trainer.max_steps=4", "logger=csv", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    subnormals.main([str(run_dir), "--batches", "1", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "### run: format=e4m3 optimizer=adamw master=fp32, 4 steps" in out
    assert "| transformer.h.0.attn | " in out and "forward + backward: " in out

"""Every error the user can cause is one line on stderr, no traceback, exit ≠ 0, and nothing half-written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fault_helpers import MODEL, run_train

QUICK = [*MODEL, "trainer.max_steps=4"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str]) -> Path:
    """A finished 4-step run (its checkpoint) and the broken inputs the cases below point at."""
    root = tmp_path_factory.mktemp("bad_inputs")
    result = run_train([*_corpus("format=e4m3"), f"hydra.run.dir={root / 'done'}"], offline_env)
    assert result.returncode == 0, result.stderr[-2000:]
    (root / "empty.ckpt").write_bytes(b"")
    (root / "garbage.ckpt").write_bytes(bytes(range(256)) * 8)
    good = (root / "done" / "checkpoints" / "last.ckpt").read_bytes()
    (root / "truncated.ckpt").write_bytes(good[: len(good) // 2])
    torch.save({"weights": torch.ones(3)}, root / "foreign.ckpt")
    torch.save({"state_dict": {}, "global_step": 1, "optimizer_states": [], "payload": Path("x")},
               root / "objects.ckpt")
    (root / "empty.txt").write_bytes(b"")
    (root / "binary.txt").write_bytes(b"legal text \xff\xfe\x00\x9e more")
    (root / "a_file").write_text("not a folder")
    return root


def _corpus(*extra: str) -> list[str]:
    return [*QUICK, "data.corpus_chars=200000", *extra]


CASES = {
    "empty checkpoint": (lambda r: _corpus(f"ckpt_path={r / 'empty.ckpt'}"), "is an empty file (0 bytes)"),
    "garbage checkpoint": (lambda r: _corpus(f"ckpt_path={r / 'garbage.ckpt'}"), "not a readable PyTorch checkpoint"),
    "truncated checkpoint": (lambda r: _corpus(f"ckpt_path={r / 'truncated.ckpt'}"),
                             "not a readable PyTorch checkpoint"),
    "foreign checkpoint": (lambda r: _corpus(f"ckpt_path={r / 'foreign.ckpt'}"),
                           "is not an AltGrad training checkpoint"),
    "checkpoint with objects": (lambda r: _corpus(f"ckpt_path={r / 'objects.ckpt'}"),
                                "not loaded (unpickling it could run code)"),
    "checkpoint past max_steps": (lambda r: _corpus("format=e4m3", f"ckpt_path={r / 'done'}", "trainer.max_steps=2"),
                                  "is at step 4, which already reaches trainer.max_steps=2"),
    "resume in another format": (lambda r: _corpus("format=e5m2", f"ckpt_path={r / 'done'}", "trainer.max_steps=6"),
                                 "was trained with another configuration (format.name: 'e4m3' → 'e5m2'); drop "
                                 "ckpt_path to start fresh, or add +resume_with_new_config=true"),
    "resume with on-grid storage": (lambda r: _corpus("format=e4m3", "quant.master=none", f"ckpt_path={r / 'done'}"),
                                    "(quant.master: 'fp32' → 'none')"),
    "resume with another optimizer": (lambda r: _corpus("format=e4m3", "optimizer=sgd", f"ckpt_path={r / 'done'}"),
                                      "optimizer._target_: 'torch.optim.AdamW' → 'torch.optim.SGD'"),
    "resume into another model shape": (lambda r: _corpus("format=e4m3", "model.n_layer=2", f"ckpt_path={r / 'done'}",
                                                          "+resume_with_new_config=true"),
                                        "holds another model shape (model.n_layer: 1 → 2)"),
    "a finished run's folder": (lambda r: _corpus("seed=7", f"hydra.run.dir={r / 'done'}"),
                                "already holds a completed run (4 steps); give another hydra.run.dir"),
    "empty data file": (lambda r: [*QUICK, "data=local", "data.tokenizer=bytes", f"data.path={r / 'empty.txt'}"],
                        "every file is empty"),
    "binary data file": (lambda r: [*QUICK, "data=local", "data.tokenizer=bytes", f"data.path={r / 'binary.txt'}"],
                         "is not UTF-8 text"),
    "unwritable cache dir": (lambda r: _corpus(f"data.cache_dir={r / 'a_file' / 'cache'}"),
                             "data.cache_dir="),
    "unwritable run dir": (lambda r: _corpus(f"hydra.run.dir={r / 'a_file' / 'run'}"), "cannot be written"),
    "unwritable sweep dir": (lambda r: ["-m", *_corpus("seed=1,2", f"hydra.sweep.dir={r / 'a_file' / 'sweep'}")],
                             "cannot be written (permission denied or not a folder); give a writable hydra.sweep.dir"),
    "bad role value": (lambda r: _corpus("format=e4m3", "+layer_map.rules=[{match: lm_head, weight: e9m9}]"),
                       "layer_map rule 0 ('lm_head'): role 'weight': unknown format 'e9m9'; valid:"),
    "unreachable block size": (lambda r: ["model.block_size=100000", "trainer.max_steps=1", "logger=csv"],
                               "needs at least"),
    "negative seed": (lambda r: _corpus("seed=-1"), "seed=-1 is invalid: expected an integer in [0, 4294967295]"),
    "seed too large": (lambda r: _corpus("seed=4294967296"), "expected an integer in [0, 4294967295]"),
    "grid without on-grid storage": (lambda r: _corpus("optimizer=grid", "format=e4m3"),
                                     "needs them stored on the grid; quant.master='fp32' is not valid"),
}


# One of each kind runs by default; the other variants of a kind run with `make test-slow`.
SLOW = ("truncated checkpoint", "foreign checkpoint", "checkpoint with objects", "empty data file", "seed too large",
        "resume with on-grid storage", "resume with another optimizer", "checkpoint past max_steps",
        "unwritable cache dir", "empty checkpoint")


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_a_bad_input_is_one_line(case: str, files: Path, tmp_path: Path, offline_env: dict[str, str]) -> None:
    make_args, expected = CASES[case]
    args = make_args(files)
    if not any(a.startswith("hydra.run.dir=") for a in args):
        args.append(f"hydra.run.dir={tmp_path / 'run'}")
    done = {p: p.read_bytes() for p in (files / "done").rglob("*") if p.is_file()}
    result = run_train(args, offline_env)
    assert result.returncode != 0
    assert {p: p.read_bytes() for p in (files / "done").rglob("*") if p.is_file()} == done  # .hydra/ included
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and expected in errors[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    run_dir = tmp_path / "run"
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "metrics.csv").exists()


@pytest.mark.parametrize("change", [["format=e5m2"], pytest.param(["optimizer=sgd"], marks=pytest.mark.slow)])
def test_resume_with_new_config_is_explicit_and_recorded(change: list[str], files: Path, tmp_path: Path,
                                                         offline_env: dict[str, str]) -> None:
    run_dir = tmp_path / "run"
    args = [*_corpus("format=e4m3", *change), "trainer.max_steps=6", f"ckpt_path={files / 'done'}",
            "+resume_with_new_config=true", f"hydra.run.dir={run_dir}"]
    result = run_train(args, offline_env)
    assert result.returncode == 0, result.stderr[-2000:]
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "completed" and s["steps"] == 6 and s["resumed_at_step"] == 4
    key = change[0].split("=")[0]
    assert any(d.startswith(f"{key}.") for d in s["resumed_with_new_config"])
    stored, current = s["resumed_from_config"], s["config"]
    assert stored[key] != current[key] and stored["format"]["name"] == "e4m3"
    assert current[key]["name"] == change[0].split("=")[1]

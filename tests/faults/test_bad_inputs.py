"""Every error the user can cause is one line on stderr, no traceback, exit ≠ 0, and nothing half-written."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fault_helpers import MODEL, REPO, run_train

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
    (root / "blank.txt").write_text("\n\n\n")
    os.symlink(root / "loop_b.txt", root / "loop.txt")
    os.symlink(root / "loop.txt", root / "loop_b.txt")
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
    "unknown profiler": (lambda r: _corpus("trainer.profiler=nvtx"),
                         "trainer.profiler='nvtx' is not valid; valid: simple, advanced, pytorch"),
    "negative seed": (lambda r: _corpus("seed=-1"), "seed=-1 is invalid: expected an integer in [0, 4294967295]"),
    "seed too large": (lambda r: _corpus("seed=4294967296"), "expected an integer in [0, 4294967295]"),
    "grid without on-grid storage": (lambda r: _corpus("optimizer=grid", "format=e4m3"),
                                     "needs them stored on the grid; quant.master='fp32' is not valid"),
    # Refused in the very folder they name: every file there (.hydra/ included) stays as it was.
    "resume in place in another format": (lambda r: _corpus("format=e5m2", *_in_place(r), "trainer.max_steps=6"),
                                          "was trained with another configuration (format.name: 'e4m3' → 'e5m2')"),
    "resume in place with nothing to train": (lambda r: _corpus("format=e4m3", *_in_place(r)),
                                              "is at step 4, which already reaches trainer.max_steps=4"),
    "requeue of a finished run with a new budget": (
        lambda r: _corpus("format=e4m3", f"hydra.run.dir={r / 'done'}", "+resume_sweep=true", "trainer.max_steps=6"),
        "holds a completed run of another configuration (trainer.max_steps: 4 → 6); nothing was changed"),
    "resume in place on a device this machine lacks": (
        lambda r: _corpus("format=e4m3", "trainer.accelerator=gpu", *_in_place(r), "trainer.max_steps=6"),
        "trainer.accelerator='gpu' needs a CUDA GPU"),
    "trainer=gpu without a GPU": (lambda r: _corpus("trainer=gpu"), "needs a CUDA GPU"),
    "a vocabulary smaller than the tokenizer's": (lambda r: _corpus("model.vocab_size=100"),
                                                  "model.vocab_size=100 is smaller than the vocabulary of "
                                                  "data.tokenizer=bytes"),
    "a config group set to null": (lambda r: _corpus("format=null"), "format=null names no option of the format group"),
    "an unquoted path with a space": (lambda r: [*QUICK, "data=local", f"data.path={r}/my", "corpus.txt"],
                                      "a value with a space must be quoted, e.g."),
    "a data file of only newlines": (lambda r: [*QUICK, "data=local", "data.tokenizer=bytes",
                                                f"data.path={r / 'blank.txt'}"],
                                     "data=local: the source holds no text (every line is blank)"),
    "a .txt symbolic link loop": (lambda r: [*QUICK, "data=local", f"data.path={r / 'loop.txt'}"],
                                  "loop.txt cannot be read (Too many levels of symbolic links)"),
}
GPU_CASES = ("resume in place on a device this machine lacks", "trainer=gpu without a GPU")


def _in_place(root: Path) -> list[str]:
    return [f"ckpt_path={root / 'done'}", f"hydra.run.dir={root / 'done'}"]


# One of each kind runs by default; the other variants of a kind run with `make test-slow`.
SLOW = ("truncated checkpoint", "foreign checkpoint", "checkpoint with objects", "empty data file", "seed too large",
        "resume with on-grid storage", "resume with another optimizer", "checkpoint past max_steps",
        "unwritable cache dir", "empty checkpoint", "resume in place with nothing to train",
        "trainer=gpu without a GPU", "a config group set to null", "a data file of only newlines",
        "a .txt symbolic link loop")  # the last two: also in test_data_faults.py, in process


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_a_bad_input_is_one_line(case: str, files: Path, tmp_path: Path, offline_env: dict[str, str]) -> None:
    make_args, expected = CASES[case]
    if case in GPU_CASES and torch.cuda.is_available():
        pytest.skip("this machine has the GPU the case asks for")
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


@pytest.mark.slow  # by default, test_resume_diagnostics.py resumes into another format (and reads the instruments)
@pytest.mark.parametrize("change", [["format=e5m2"], ["optimizer=sgd"]])
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


@pytest.mark.parametrize("out", ["a_file/report", pytest.param("a_file", marks=pytest.mark.slow)])
def test_a_report_that_cannot_be_written_is_one_line(out: str, files: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "altgrad.report", str(files / "done"), "--out", str(files / out)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.startswith("error: cannot write the report to ") and len(result.stderr.splitlines()) == 1
    assert result.stderr.rstrip().endswith("; give a writable --out") and "Traceback" not in result.stderr


def test_a_full_disk_is_one_line_and_the_summary_records_it(files: Path, tmp_path: Path,
                                                            offline_env: dict[str, str]) -> None:
    """The checkpoint write fails (the kernel refuses files over 150 kB here, as a full disk refuses any write): one
    line, exit 1, no temporary file left, and a summary.json that says the run failed and why, so a report lists
    it as failed rather than missing. The token cache was written by the fixture's run, before the limit."""
    from altgrad.report.load import load_job

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (150_000, 150_000))

    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "altgrad.train", *_corpus("trainer.checkpoint_every_n_steps=2"),
                             f"hydra.run.dir={run_dir}"], cwd=REPO, env=offline_env, capture_output=True, text=True,
                            timeout=300, preexec_fn=limit)
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    assert errors[0].startswith(f"error: run dir {run_dir}: cannot write {ckpt} at step 2 (File too large); "
                                "summary.json records the failure; no checkpoint was written yet"), errors[0]
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "failed" and s["steps"] == 2 and "File too large" in s["error"]
    assert load_job(run_dir, "run").state == "failed"
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == []  # no half checkpoint, no temporary

"""data=folder: split files read by document, checked against SHA256SUMS, keyed and recorded by their sha256."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from altgrad.config import ConfigError
from altgrad.data.datamodule import TextDataModule
from altgrad.data.folder import iter_documents, read_checksums, resolve_split_files
from altgrad.data.sources import DataUnavailableError

REPO = Path(__file__).resolve().parents[2]
TRAIN = "Article 1\nThis Regulation applies.\n\nArticle 2\nDefinitions:\n(a) 'act' means a text;\n\n" * 40
VAL = "Article 9\nEntry into force.\n\n" * 30


def make_folder(root: Path, *, sums: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "c.train.txt").write_text(TRAIN, encoding="utf-8")
    (root / "c.val.txt").write_text(VAL, encoding="utf-8")
    if sums:
        lines = [f"{hashlib.sha256((root / n).read_bytes()).hexdigest()}  {n}" for n in ("c.train.txt", "c.val.txt")]
        (root / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    return root


def module(folder: Path, cache: Path, **kw) -> TextDataModule:
    return TextDataModule(name="c", source="folder", dir=str(folder), train_file="c.train.txt",
                          val_file="c.val.txt", block_size=8, batch_size=2, val_batches=2, cache_dir=str(cache), **kw)


def test_documents_are_runs_of_non_blank_lines(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_text("a\nb\n\n\nc\n  \nd\ne")
    assert list(iter_documents(f)) == ["a\nb", "c", "d\ne"]


def test_validation_split_is_the_validation_file_and_every_document_ends_with_eot(tmp_path: Path) -> None:
    dm = module(make_folder(tmp_path / "data"), tmp_path / "cache")
    dm.setup()
    eot = dm.tokenizer.eot_token
    doc = "Article 9\nEntry into force."
    assert len(dm.val_tokens) == 30 * (len(doc.encode()) + 1)  # 30 documents, each + <|endoftext|>
    assert int((np.asarray(dm.val_tokens) == eot).sum()) == 30
    assert int((np.asarray(dm.train_tokens) == eot).sum()) == 80
    assert dm.tokenizer.decode([int(t) for t in dm.val_tokens[: len(doc)]]) == doc


def test_data_files_are_the_files_sha256_and_a_moved_copy_reuses_the_cache(tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "data")
    dm = module(folder, tmp_path / "cache")
    expected = {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in ("c.train.txt", "c.val.txt")}
    assert dm.data_files == expected
    moved = shutil.copytree(folder, tmp_path / "elsewhere")
    assert module(moved, tmp_path / "cache").cache_path() == dm.cache_path()
    (moved / "c.val.txt").write_text(VAL + "Article 10\nRepeal.\n", encoding="utf-8")
    assert module(moved, tmp_path / "cache", checksums=None).cache_path() != dm.cache_path()


def test_a_file_that_differs_from_its_checksum_is_refused_naming_it(tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "data")
    (folder / "c.train.txt").write_text(TRAIN + "tampered\n", encoding="utf-8")
    with pytest.raises(DataUnavailableError, match=r"c\.train\.txt has sha256 .* SHA256SUMS lists"):
        module(folder, tmp_path / "cache").setup()


def test_missing_settings_and_files_are_one_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="data.dir is not set"):
        resolve_split_files(None, "a.txt", "b.txt", None)
    with pytest.raises(ConfigError, match="is not a folder"):
        resolve_split_files(str(tmp_path / "nope"), "a.txt", "b.txt", None)
    folder = make_folder(tmp_path / "data", sums=False)
    with pytest.raises(ConfigError, match=r"data.val_file='b.txt' is not a file .* files there: c.train.txt"):
        resolve_split_files(str(folder), "c.train.txt", "b.txt", None)
    with pytest.raises(ConfigError, match="data.checksums='SHA256SUMS' is not a file"):
        resolve_split_files(str(folder), "c.train.txt", "c.val.txt", "SHA256SUMS")


def test_checksum_lines_in_both_sha256sum_styles(tmp_path: Path) -> None:
    f = tmp_path / "SUMS"
    f.write_text(f"{'a' * 64}  one.txt\n{'B' * 64} *two.txt\n\n")
    assert read_checksums(f) == {"one.txt": "a" * 64, "two.txt": "b" * 64}


def test_a_run_records_the_data_files_sha256(tmp_path: Path, offline_env: dict[str, str]) -> None:
    folder = make_folder(tmp_path / "data")
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "altgrad.train", "data=folder", f"data.dir={folder}", "data.train_file=c.train.txt",
           "data.val_file=c.val.txt", "model.n_layer=1", "model.block_size=8", "data.batch_size=2",
           "trainer.max_steps=2", "trainer.sample_tokens=0", "logger=csv", "callbacks=none", f"hydra.run.dir={run}"]
    done = subprocess.run(cmd, cwd=REPO, env=offline_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["data_files"] == {n: hashlib.sha256((folder / n).read_bytes()).hexdigest()
                                     for n in ("c.train.txt", "c.val.txt")}
    missing = subprocess.run([*cmd[:3], "data=eurlex_en", f"hydra.run.dir={tmp_path / 'r2'}"], cwd=REPO,
                             env=offline_env, capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines()[-1].startswith("error: data.dir is not set")

"""Data the user (or a disk) gets wrong: a token cache that disagrees with its record is rebuilt, never read; text
with no document and links that lead nowhere are one line each, and leave no cache entry behind."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import numpy as np
import pytest

from altgrad.data.datamodule import TextDataModule
from altgrad.data.sources import DataUnavailableError, resolve_local_files
from altgrad.errors import ConfigError


def _module(cache: Path, **kw: object) -> TextDataModule:
    args = {"name": "embedded", "source": "embedded", "tokenizer": "bytes", "block_size": 32, "batch_size": 4,
            "corpus_chars": 40_000, "cache_dir": str(cache)} | kw
    return TextDataModule(**args)


def _damage(how: str, tokens: Path) -> None:
    record = tokens.with_suffix(".json")
    if how == "half":
        tokens.write_bytes(tokens.read_bytes()[: tokens.stat().st_size // 2])
    elif how == "odd size":  # not a whole number of uint16 tokens: np.memmap itself would refuse it
        tokens.write_bytes(tokens.read_bytes()[:-1])
    elif how == "0 bytes":
        tokens.write_bytes(b"")
    elif how == "longer":
        tokens.write_bytes(tokens.read_bytes() * 2)
    elif how == "stale record":
        meta = json.loads(record.read_text())
        meta["identity"]["corpus_chars"] = 1
        record.write_text(json.dumps(meta))
    elif how == "unreadable record":
        record.write_text("{not json")


@pytest.mark.parametrize("how", ["half", "odd size", "0 bytes", "longer", "stale record", "unreadable record"])
def test_a_token_cache_that_disagrees_with_its_record_is_rebuilt(how: str, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    first = _module(tmp_path)
    first.setup()
    path = first.cache_path()
    good, train = path.read_bytes(), np.array(first.train_tokens)
    _damage(how, path)
    again = _module(tmp_path)
    with caplog.at_level(logging.WARNING, logger="altgrad.data.datamodule"):
        again.setup()
    assert [r.getMessage() for r in caplog.records if "token cache" in r.getMessage()] == [
        f"token cache {path} is unusable: {_problem(how, path, len(good))}; rebuilding it"]
    assert path.read_bytes() == good and np.array_equal(np.array(again.train_tokens), train)
    assert again.cache_problem() is None


def _problem(how: str, path: Path, size: int) -> str:
    """What the warning says for each damage (uint16 tokens: 2 bytes each)."""
    if how == "stale record":
        return "its record names another source (stale)"
    if how == "unreadable record":
        return f"its record {path.with_suffix('.json').name} is unreadable (JSONDecodeError)"
    held = {"half": size // 2, "odd size": size - 1, "0 bytes": 0, "longer": 2 * size}[how]
    return f"it holds {held} bytes where its record says {size // 2} uint16 tokens ({size} bytes)"


def test_a_file_of_blank_lines_is_one_line_and_leaves_no_cache_entry(tmp_path: Path) -> None:
    (tmp_path / "blank.txt").write_text("\n\n\n\n")
    module = _module(tmp_path / "cache", name="local", source="local", path=str(tmp_path / "blank.txt"))
    with pytest.raises(DataUnavailableError, match=r"^data=local: the source holds no text \(every line is blank\)"):
        module.prepare_data()
    assert not (tmp_path / "cache" / "tokens").exists() or not any((tmp_path / "cache" / "tokens").iterdir())


@pytest.mark.parametrize("target", ["loop", "dangling"])
def test_a_text_file_link_that_leads_nowhere_is_named(target: str, tmp_path: Path) -> None:
    if target == "loop":
        os.symlink(tmp_path / "b.txt", tmp_path / "a.txt")
        os.symlink(tmp_path / "a.txt", tmp_path / "b.txt")
    else:
        os.symlink(tmp_path / "gone.txt", tmp_path / "a.txt")
    (tmp_path / "good.txt").write_text("some text\n")
    for given in (str(tmp_path / "a.txt"), str(tmp_path), str(tmp_path / "*.txt")):
        with pytest.raises(ConfigError, match=re.escape(f"data.path='{given}': {tmp_path / 'a.txt'} cannot be read (")):
            resolve_local_files(given)  # never skipped: the data would silently be other data

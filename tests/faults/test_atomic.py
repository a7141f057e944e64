"""altgrad.atomic: a write that fails half-way leaves the old file and no temporary file; a good one replaces it."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import torch

from altgrad.atomic import copy_file, write_bytes, write_json, write_text, write_with
from altgrad.checkpoint import AtomicCheckpointIO


class Boom(RuntimeError):
    pass


def _half_then_fail(tmp: Path) -> None:
    tmp.write_text("half of the new")
    raise Boom("disk gone mid-write")


def test_a_failure_mid_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    target.write_text("old")
    with pytest.raises(Boom):
        write_with(target, _half_then_fail)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_an_object_json_cannot_write_leaves_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "layer_map.json"
    target.write_text("{}")
    with pytest.raises(ValueError):
        write_json(target, {"loss": float("nan")}, allow_nan=False)
    assert target.read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == ["layer_map.json"]


def test_each_writer_replaces_the_file_whole(tmp_path: Path) -> None:
    write_text(tmp_path / "a.txt", "new text\n")
    write_bytes(tmp_path / "b.bin", b"\x00\x01")
    write_json(tmp_path / "c.json", {"x": [1, 2]}, indent=2)
    copy_file(tmp_path / "b.bin", tmp_path / "d.bin", mode=0o640)
    assert (tmp_path / "a.txt").read_text() == "new text\n"
    assert (tmp_path / "b.bin").read_bytes() == (tmp_path / "d.bin").read_bytes() == b"\x00\x01"
    assert json.loads((tmp_path / "c.json").read_text()) == {"x": [1, 2]}
    assert stat.S_IMODE((tmp_path / "d.bin").stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin", "c.json", "d.bin"]


def test_a_checkpoint_that_cannot_be_pickled_leaves_the_previous_one(tmp_path: Path) -> None:
    io = AtomicCheckpointIO()
    target = tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"step": 1}, target)
    with pytest.raises(Exception):
        io.save_checkpoint({"step": 2, "bad": lambda: None}, target)  # a lambda cannot be pickled
    assert torch.load(target, weights_only=True) == {"step": 1}
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]

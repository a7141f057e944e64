"""Atomic file writes: write a temporary file beside the target, then `os.replace` it onto the target's name.

Readers (a resume, a report, a parallel job) see the old file or the whole new one, never half of one; a failure or
a kill mid-write leaves the old file as it was, and a failure removes the temporary file.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

PathLike = str | os.PathLike


def temporary_name(path: Path) -> Path:
    """A hidden name beside `path`, unique to this write (parallel writers of one target never share one)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


def write_with(path: PathLike, write: Callable[[Path], Any], mode: int | None = None) -> Path:
    """Call `write(tmp)` to fill a temporary file, then put it in place as `path` (its folder must exist).

    mode: permission bits for the new file (None: what `write` created, i.e. the umask's).
    """
    target = Path(path)
    tmp = temporary_name(target)
    try:
        write(tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def write_text(path: PathLike, text: str, newline: str | None = None) -> Path:
    """Atomically write `text` to `path` (`newline` as for `open`)."""
    return write_with(path, lambda tmp: tmp.write_text(text, newline=newline))


def write_bytes(path: PathLike, data: bytes) -> Path:
    """Atomically write `data` to `path`."""
    return write_with(path, lambda tmp: tmp.write_bytes(data))


def write_json(path: PathLike, obj: Any, **dumps: Any) -> Path:
    """Atomically write `json.dumps(obj, **dumps)` to `path` (serialised first: a bad object writes nothing)."""
    return write_text(path, json.dumps(obj, **dumps))


def copy_file(src: PathLike, dst: PathLike, mode: int | None = None) -> Path:
    """Atomically copy the bytes of `src` to `dst` (`mode` as for `write_with`)."""
    return write_with(dst, lambda tmp: shutil.copyfile(src, tmp), mode=mode)

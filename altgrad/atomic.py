"""Atomic file writes: write a temporary file beside the target, then `os.replace` it onto the target's name.

Readers (a resume, a report, a parallel job) see the old file or the whole new one, never half of one; a failure or
a kill mid-write leaves the old file as it was. A failure (a full disk, say) closes and removes the temporary file,
so its space is free again for what is written next (the run's summary.json); what a kill leaves behind is removed
by the next run that claims the folder (`altgrad.run_dir`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

PathLike = str | os.PathLike


_TEMPORARY = re.compile(r"^\..+\.[0-9a-f]{32}\.tmp$")


def temporary_name(path: Path) -> Path:
    """A hidden name beside `path`, unique to this write (parallel writers of one target never share one)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


def is_temporary(path: Path) -> bool:
    """Whether `path` is named as `temporary_name` names the files of a write in progress."""
    return bool(_TEMPORARY.match(path.name))


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
    except OSError as err:
        if err.filename is None or str(err.filename) == str(tmp):  # name the file the caller meant
            raise OSError(err.errno, err.strerror, str(target)) from None
        raise
    finally:
        tmp.unlink(missing_ok=True)
    return target


def write_text(path: PathLike, text: str, newline: str | None = None) -> Path:
    """Atomically write `text` to `path` (`newline` as for `open`)."""
    return write_with(path, lambda tmp: tmp.write_text(text, newline=newline))


class _Writes:
    """A binary file's write/flush, remembering the OSError a write met (a library may report it as something
    vaguer: torch.save raises RuntimeError('unexpected pos …') when the disk is full)."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f, self.error = f, None

    def write(self, data: Any) -> int:
        try:
            return self._f.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self._f.flush()


def write_stream(path: PathLike, write: Callable[[Any], Any], mode: int | None = None) -> Path:
    """Atomically write what `write(file)` writes into a binary file object (write and flush). The file is closed
    before it is removed on a failure, so a full disk gets its space back at once (a path handed to a library that
    fails mid-write may stay open until that library's objects are collected), and the OSError (ENOSPC, EFBIG, …) is
    what is raised, whatever the library made of it."""
    def fill(tmp: Path) -> None:
        with tmp.open("wb") as f:
            writes = _Writes(f)
            try:
                write(writes)
            except Exception:
                if writes.error is not None:
                    raise writes.error from None
                raise

    return write_with(path, fill, mode=mode)


def write_bytes(path: PathLike, data: bytes) -> Path:
    """Atomically write `data` to `path`."""
    return write_with(path, lambda tmp: tmp.write_bytes(data))


def write_json(path: PathLike, obj: Any, **dumps: Any) -> Path:
    """Atomically write `json.dumps(obj, **dumps)` to `path` (serialised first: a bad object writes nothing)."""
    return write_text(path, json.dumps(obj, **dumps))


def copy_file(src: PathLike, dst: PathLike, mode: int | None = None) -> Path:
    """Atomically copy the bytes of `src` to `dst` (`mode` as for `write_with`)."""
    return write_with(dst, lambda tmp: shutil.copyfile(src, tmp), mode=mode)

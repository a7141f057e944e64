"""A folder of split text files (train and validation), checked against the folder's SHA256SUMS.

Real corpora that come as files per split (e.g. the eurlex-en folder of English EU legislation) are read from
`data.dir`: documents are separated by a blank line and each ends with the tokenizer's end-of-text token. The data's
identity is its files' sha256, not the folder's path: the token cache is keyed by them and every run records them,
so a run on a copy of the same files elsewhere is the same run, and a changed file is never read silently.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from altgrad.errors import ConfigError

CHUNK = 1 << 20


class DataChecksumError(RuntimeError):
    """A data file's sha256 differs from the one its folder's checksum file lists."""


@dataclass(frozen=True)
class SplitFiles:
    """The train and validation files of a folder, and the checksum file that vouches for them (or None)."""

    train: Path
    val: Path
    checksums: Path | None

    def named(self) -> dict[str, Path]:
        return {"train": self.train, "val": self.val}


def resolve_split_files(directory: str | None, train_file: str, val_file: str,
                        checksums: str | None) -> SplitFiles:
    """The files of `data.dir`, or one ConfigError line naming the missing setting or file."""
    if not directory:
        raise ConfigError("data.dir is not set; valid: data.dir=<folder holding "
                          f"{train_file} and {val_file}> (see docs/data.md for where the text comes from)")
    root = Path(os.path.expanduser(str(directory)))
    if not root.is_dir():
        raise ConfigError(f"data.dir={str(directory)!r} is not a folder; valid: a folder holding {train_file} "
                          f"and {val_file}")
    found = {key: root / name for key, name in (("train_file", train_file), ("val_file", val_file))}
    for key, path in found.items():
        if not path.is_file():
            present = sorted(p.name for p in root.iterdir() if p.is_file())[:8]
            raise ConfigError(f"data.{key}={path.name!r} is not a file in data.dir={str(directory)!r}; "
                              f"files there: {', '.join(present) or 'none'}")
    sums = None
    if checksums:
        sums = root / checksums
        if not sums.is_file():
            raise ConfigError(f"data.checksums={checksums!r} is not a file in data.dir={str(directory)!r}; valid: "
                              "the folder's sha256sum file, or data.checksums=null to skip the check")
    return SplitFiles(found["train_file"], found["val_file"], sums)


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, as `sha256sum` prints it."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_checksums(path: Path) -> dict[str, str]:
    """`sha256sum` output (`HASH  NAME` or `HASH *NAME` per line) as {name: hash}."""
    listed: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1)
        if len(parts) != 2 or len(parts[0]) != 64:
            raise DataChecksumError(f"{path}: line {number} is not `SHA256  NAME`: {line[:80]!r}")
        listed[parts[1].lstrip("*").strip()] = parts[0].lower()
    return listed


def checked_sha256(files: SplitFiles) -> dict[str, str]:
    """{file name: sha256} of the split files, each checked against the checksum file where it is listed."""
    listed = read_checksums(files.checksums) if files.checksums else {}
    hashes = {}
    for path in files.named().values():
        actual = file_sha256(path)
        expected = listed.get(path.name)
        if expected is not None and expected != actual:
            raise DataChecksumError(f"{path} has sha256 {actual[:16]}…, but {files.checksums.name} lists "
                                    f"{expected[:16]}…: the file is damaged or another version; valid: the files "
                                    f"{files.checksums.name} describes")
        hashes[path.name] = actual
    return hashes


def iter_documents(path: Path) -> Iterator[str]:
    """The documents of a text file: runs of non-blank lines, separated by one or more blank lines."""
    lines: list[str] = []
    with open(path, encoding="utf-8", newline="\n") as handle:
        for line in handle:
            line = line.rstrip("\n")
            if line.strip():
                lines.append(line)
            elif lines:
                yield "\n".join(lines)
                lines = []
    if lines:
        yield "\n".join(lines)

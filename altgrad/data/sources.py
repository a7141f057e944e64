"""Where training text comes from: the embedded generator, a Hugging Face dataset, or the user's own files.

Hub datasets and local files both go through `datasets.load_dataset`, so `data=eurlex` and `data=local` share one
code path (local files use the packaged `text`/`json`/`parquet` builders and never touch the network).
"""

from __future__ import annotations

import codecs
import glob
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from altgrad.data.corpus import iter_documents
from altgrad.errors import ConfigError

DATA_SOURCES = ("embedded", "hub", "local", "folder")
"""`data.source`: the embedded generator, a Hugging Face dataset (`data.hub_path`), local files (`data.path`), or a
folder of split files (`data.dir`: train and validation files, altgrad.data.folder)."""
# File suffix -> `datasets` packaged builder.
BUILDERS = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class DataUnavailableError(RuntimeError):
    """A dataset cannot be loaded (typically: offline and not in the cache); the message says what to do."""


def resolve_local_files(path: str | None) -> tuple[str, list[str]]:
    """The builder name and sorted files for `data.path`: a file, a glob, or a folder (searched recursively)."""
    if not path:
        raise ConfigError("data.path is required for data=local; set data.path=<file, glob or folder of "
                          f"{'/'.join(sorted(BUILDERS))} files>")
    expanded = os.path.expanduser(str(path))
    if os.path.isdir(expanded):
        matches = [str(p) for p in sorted(Path(expanded).rglob("*")) if not p.is_dir()]
    else:
        matches = sorted(glob.glob(expanded, recursive=True))
    files = []
    for m in (m for m in matches if Path(m).suffix.lower() in BUILDERS):
        try:
            if stat.S_ISREG(os.stat(m).st_mode):
                files.append(m)
        except OSError as err:  # a symbolic link loop, a dangling link, no permission: never skipped silently
            raise ConfigError(f"data.path={str(path)!r}: {m} cannot be read ({err.strerror}); valid: readable "
                              "files (a symbolic link must lead to one)") from None
    if not files:
        raise ConfigError(f"data.path={str(path)!r} matches no {'/'.join(sorted(BUILDERS))} file "
                          f"({'no such file or folder' if not matches else 'unsupported file types'})")
    builders = sorted({BUILDERS[Path(f).suffix.lower()] for f in files})
    if len(builders) > 1:
        raise ConfigError(f"data.path={str(path)!r} mixes file types ({', '.join(builders)}); "
                          "valid: files of one kind (.txt, .jsonl/.json or .parquet)")
    return builders[0], files


def local_identity(path: str | None) -> list[Any]:
    """What makes local files' tokens stale: each file's absolute path, size and modification time."""
    _, files = resolve_local_files(path)
    return [[os.path.abspath(f), os.path.getsize(f), os.stat(f).st_mtime_ns] for f in files]


def load_hf_dataset(
    path: str, name: str | None, split: str, *, data_files: list[str] | None = None, label: str | None = None
) -> Any:
    """`datasets.load_dataset(...)` with offline/missing failures turned into one actionable line."""
    import datasets

    label = label or f"{path!r}" + (f" (config {name!r})" if name else "")
    try:
        return datasets.load_dataset(path, name, split=split, data_files=data_files)
    except datasets.exceptions.DatasetGenerationError as err:
        if data_files is None:
            raise
        raise DataUnavailableError(f"{label}: {_unreadable(data_files, err)}") from None
    except (ConnectionError, OSError, FileNotFoundError, ValueError) as err:
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise DataUnavailableError(
            f"dataset {label} split {split!r} could not be loaded ({type(err).__name__}: {first}); if you are "
            "offline it is not in the Hugging Face cache: run once online (unset HF_HUB_OFFLINE / "
            "HF_DATASETS_OFFLINE), point HF_DATASETS_CACHE at a copy, or use data=embedded"
        ) from err


def _unreadable(files: list[str], err: BaseException) -> str:
    """Why local files could not be read, naming the file: empty, not UTF-8, or the reader's own words."""
    cause = err.__cause__ or err.__context__
    if isinstance(cause, UnicodeDecodeError):
        for f in files:
            decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
            try:
                with open(f, "rb") as handle:
                    for chunk in iter(lambda: handle.read(1 << 20), b""):  # noqa: B023 (used at once)
                        decoder.decode(chunk)
                        offset += len(chunk)
            except UnicodeDecodeError as bad:
                return (f"{f} is not UTF-8 text (undecodable byte near offset {offset + bad.start}); valid: UTF-8 "
                        "text files, or .jsonl/.parquet")
            except OSError:
                continue
        return f"a file is not UTF-8 text ({cause.reason}); valid: UTF-8 text files, or .jsonl/.parquet"
    if all(os.path.getsize(f) == 0 for f in files if os.path.isfile(f)):
        return "every file is empty; valid: files with some text"
    first = (str(cause or err).splitlines() or [type(err).__name__])[0]
    return f"cannot be read ({type(cause or err).__name__}: {first}); check the files' format"


def iter_texts(
    source: str,
    *,
    corpus_seed: int = 0,
    corpus_chars: int = 5_000_000,
    hub_path: str | None = None,
    config_name: str | None = None,
    split: str = "train",
    text_field: str = "text",
    path: str | None = None,
) -> Iterator[str]:
    """Documents of the configured source, in a fixed order."""
    if source == "embedded":
        yield from iter_documents(corpus_seed, corpus_chars)
        return
    if source == "hub":
        ds = load_hf_dataset(str(hub_path), config_name, split)
    elif source == "local":
        builder, files = resolve_local_files(path)
        ds = load_hf_dataset(builder, None, "train", data_files=files, label=f"data.path={path!r}")
    else:
        raise ConfigError(f"data.source={source!r} is not valid; valid: {', '.join(DATA_SOURCES)}")
    if text_field not in ds.column_names:
        raise ConfigError(f"data.text_field={text_field!r} is not a column of the dataset; valid: "
                          f"{', '.join(ds.column_names)}")
    for batch in ds.iter(batch_size=1000):
        for text in batch[text_field]:
            if text:
                yield text if isinstance(text, str) else str(text)

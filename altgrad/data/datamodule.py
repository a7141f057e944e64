"""TextDataModule: text source → token ids cached once on disk → random fixed-length training windows.

Tokens are stored as a flat uint16/uint32 memmap under `cache_dir`, keyed by the source, the tokenizer and
`TOKEN_CACHE_VERSION`, beside a record of what they hold; a cache whose size or source disagrees with its record is
rebuilt, never read. The last `val_fraction` of the stream is the validation split, except for a folder of split
files (`data.source=folder`), whose validation file is the validation split. Training batch i is drawn from
a counter-based generator (Philox, key = seed, counter = i): the data position is just the number of batches
consumed, saved in the checkpoint, so a resumed run continues the very same stream.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import tiktoken
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from altgrad.atomic import write_json, write_with
from altgrad.data.corpus import CORPUS_VERSION
from altgrad.data.folder import DataChecksumError, checked_sha256, file_sha256, iter_documents, resolve_split_files
from altgrad.data.sources import DataUnavailableError, iter_texts, local_identity, resolve_local_files
from altgrad.data.tokenizer import TokenizerUnavailableError, get_tokenizer

TOKEN_CACHE_VERSION = 1
log = logging.getLogger(__name__)
# Validation windows use their own fixed key, so runs with different seeds are scored on the same text.
VAL_KEY = 0x5EED_0F_7A1


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype holding every token id."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def _batch_generator(key: int, index: int) -> np.random.Generator:
    # Philox is counter-based: batch `index` gets its own stream without replaying the ones before it.
    return np.random.Generator(np.random.Philox(key=key, counter=[0, 0, 0, index]))


def draw_windows(tokens: np.ndarray, block_size: int, batch_size: int, key: int, index: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch `index`: batch_size random windows of block_size tokens (inputs) and the next tokens (targets)."""
    starts = _batch_generator(key, index).integers(0, len(tokens) - block_size, size=batch_size)
    rows = np.stack([tokens[s : s + block_size + 1] for s in starts]).astype(np.int64)
    chunk = torch.from_numpy(rows)
    return chunk[:, :-1], chunk[:, 1:]


class TrainWindows(IterableDataset):
    """An endless stream of training batches starting at batch `start`."""

    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, seed: int, start: int = 0) -> None:
        self.tokens, self.block_size, self.batch_size = tokens, block_size, batch_size
        self.seed, self.start = seed, start

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        index = self.start
        while True:
            yield draw_windows(self.tokens, self.block_size, self.batch_size, self.seed, index)
            index += 1


class ValWindows(Dataset):
    """A fixed set of validation batches (the same for every seed and every evaluation)."""

    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, n_batches: int) -> None:
        self.tokens, self.block_size, self.batch_size, self.n_batches = tokens, block_size, batch_size, n_batches

    def __len__(self) -> int:
        return self.n_batches

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.n_batches:
            raise IndexError(index)
        return draw_windows(self.tokens, self.block_size, self.batch_size, VAL_KEY, index)


class TextDataModule(L.LightningDataModule):
    """Embedded corpus, a Hugging Face dataset, or local files, as cached tokens and random windows."""

    def __init__(
        self,
        name: str,
        source: str = "embedded",
        tokenizer: str = "bytes",
        block_size: int = 128,
        batch_size: int = 16,
        seed: int = 0,
        val_fraction: float = 0.05,
        val_batches: int = 8,
        cache_dir: str = "~/.cache/altgrad",
        num_workers: int = 0,
        corpus_seed: int = 0,
        corpus_chars: int = 5_000_000,
        hub_path: str | None = None,
        config_name: str | None = None,
        split: str = "train",
        text_field: str = "text",
        path: str | None = None,
        dir: str | None = None,
        train_file: str = "train.txt",
        val_file: str = "val.txt",
        checksums: str | None = "SHA256SUMS",
    ) -> None:
        super().__init__()
        self.name, self.source, self.tokenizer_name = name, source, tokenizer
        self.block_size, self.batch_size, self.seed = block_size, batch_size, seed
        self.val_fraction, self.val_batches, self.num_workers = val_fraction, val_batches, num_workers
        self.cache_dir = Path(os.path.expanduser(cache_dir))
        self.source_args: dict[str, Any] = dict(
            corpus_seed=corpus_seed, corpus_chars=corpus_chars, hub_path=hub_path, config_name=config_name,
            split=split, text_field=text_field, path=path,
        )
        self.folder_args: dict[str, Any] = dict(directory=dir, train_file=train_file, val_file=val_file,
                                                checksums=checksums)
        self._data_files: dict[str, str] | None = None
        self.position = 0  # training batches consumed so far
        self._tokenizer: tiktoken.Encoding | None = None
        self.train_tokens: np.ndarray | None = None
        self.val_tokens: np.ndarray | None = None
        self._cache_path: Path | None = None
        self._identity: dict[str, Any] = {}

    # -- identity and cache ----------------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> tiktoken.Encoding:
        if self._tokenizer is None:
            try:
                self._tokenizer = get_tokenizer(self.tokenizer_name)
            except TokenizerUnavailableError as err:
                raise DataUnavailableError(f"data={self.name}: {err}") from err
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.n_vocab

    def source_identity(self) -> dict[str, Any]:
        """Everything that determines the token stream; its hash names the cache file."""
        a = self.source_args
        if self.source == "embedded":
            ident: dict[str, Any] = {"corpus_seed": a["corpus_seed"], "corpus_chars": a["corpus_chars"],
                                     "corpus_version": CORPUS_VERSION}
        elif self.source == "hub":
            ident = {k: a[k] for k in ("hub_path", "config_name", "split", "text_field")}
        elif self.source == "folder":
            ident = {"files": self.data_files}  # content, not location: a moved copy reuses the cache
        else:
            ident = {"files": local_identity(a["path"]), "text_field": a["text_field"]}
        return {"source": self.source, "tokenizer": self.tokenizer_name, "version": TOKEN_CACHE_VERSION, **ident}

    @property
    def data_files(self) -> dict[str, str] | None:
        """{file: sha256} of the files the tokens come from (None for the generated corpus and hub datasets);
        a folder's files are checked against its checksum file first. Computed once per run."""
        if self._data_files is None and self.source in ("folder", "local"):
            try:
                if self.source == "folder":
                    self._data_files = checked_sha256(resolve_split_files(**self.folder_args))
                else:
                    _, files = resolve_local_files(self.source_args["path"])
                    self._data_files = {os.path.abspath(f): file_sha256(Path(f)) for f in files}
            except DataChecksumError as err:
                raise DataUnavailableError(f"data={self.name}: {err}") from None
        return self._data_files

    def cache_path(self) -> Path:
        """The token file for this source and tokenizer (computed once, so a run never switches files midway)."""
        if self._cache_path is None:
            self._cache_path = self._compute_cache_path()
        return self._cache_path

    def _compute_cache_path(self) -> Path:
        ident = self._identity = self.source_identity()
        digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
        label = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{self.name}-{self.tokenizer_name}")
        return self.cache_dir / "tokens" / f"{label}-v{TOKEN_CACHE_VERSION}-{digest}.bin"

    def cache_problem(self) -> str | None:
        """Why the cache file cannot be used as it is (None: it can): missing, its record unreadable or of another
        source (stale), or its size not the n_tokens it records (truncated or cut to an odd size, a 0-byte entry)."""
        path = self.cache_path()
        record = path.with_suffix(".json")
        if not path.is_file() or not record.is_file():
            return "missing"
        try:
            meta = json.loads(record.read_text())
            dtype = np.dtype(meta["dtype"])
            n_tokens = int(meta["n_tokens"])
        except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError) as err:
            return f"its record {record.name} is unreadable ({type(err).__name__})"
        if meta.get("identity") != self._identity:
            return "its record names another source (stale)"
        size = path.stat().st_size
        if n_tokens <= 0 or size != n_tokens * dtype.itemsize:
            return (f"it holds {size} bytes where its record says {n_tokens} {dtype.name} tokens "
                    f"({n_tokens * dtype.itemsize} bytes)")
        return None

    def prepare_data(self) -> None:
        """Tokenize the source once into the cache (a no-op when the cache file is there and matches its record;
        a damaged or stale one is rebuilt, with a warning)."""
        path = self.cache_path()
        problem = self.cache_problem()
        if problem is None:
            return
        if problem != "missing":
            log.warning("token cache %s is unusable: %s; rebuilding it", path, problem)
        enc = self.tokenizer
        dtype = token_dtype(enc.n_vocab)
        meta: dict[str, Any] = {"identity": self._identity, "source": self.source}
        if self.source == "folder":
            # train tokens, then the validation file's: the split point is recorded, not a fraction
            files = resolve_split_files(**self.folder_args)
            train, n_train_docs = self._tokenize(self._read_documents(files.train), enc, dtype)
            val, n_val_docs = self._tokenize(self._read_documents(files.val), enc, dtype)
            tokens, n_docs = np.concatenate([train, val]), n_train_docs + n_val_docs
            meta["n_val"] = int(val.size)
        else:
            tokens, n_docs = self._tokenize(iter_texts(self.source, **self.source_args), enc, dtype)
        if tokens.size == 0 or n_docs == 0:  # e.g. a file of blank lines: no document, and no cache entry
            raise DataUnavailableError(f"data={self.name}: the source holds no text (every line is blank); valid: "
                                       "files with some text")
        meta.update({"n_tokens": int(tokens.size), "n_docs": n_docs, "dtype": dtype.name, "vocab_size": enc.n_vocab})
        # Atomic writes (tokens first, then the metadata that makes them valid): parallel jobs never read a
        # half-written cache, and a failure leaves nothing half-written behind.
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_with(path, tokens.tofile)
            write_json(path.with_suffix(".json"), meta, indent=2)
        except OSError as err:
            raise DataUnavailableError(
                f"data.cache_dir={str(self.cache_dir)!r} cannot be written ({err.strerror or type(err).__name__}); "
                "set data.cache_dir (or $ALTGRAD_CACHE) to a writable folder") from None

    def _tokenize(self, texts: Iterator[str], enc: tiktoken.Encoding, dtype: np.dtype) -> tuple[np.ndarray, int]:
        """All documents' tokens, each document followed by <|endoftext|>, and the number of documents."""
        chunks, n_docs, batch = [], 0, []
        for text in texts:
            batch.append(text)
            if len(batch) == 256:
                chunks.extend(self._encode(enc, batch, dtype))
                n_docs += len(batch)
                batch = []
        chunks.extend(self._encode(enc, batch, dtype))
        n_docs += len(batch)
        return (np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)), n_docs

    def _read_documents(self, path: Path) -> Iterator[str]:
        try:
            yield from iter_documents(path)
        except UnicodeDecodeError as err:
            raise DataUnavailableError(f"data={self.name}: {path} is not UTF-8 text (undecodable byte at offset "
                                       f"{err.start} of a line); valid: UTF-8 text files") from None

    @staticmethod
    def _encode(enc: tiktoken.Encoding, texts: list[str], dtype: np.dtype) -> list[np.ndarray]:
        # Every document ends with <|endoftext|>, so the model learns where documents stop.
        return [np.asarray(ids + [enc.eot_token], dtype=dtype) for ids in enc.encode_ordinary_batch(texts)]

    def setup(self, stage: str | None = None) -> None:
        if self.train_tokens is not None:
            return
        self.prepare_data()  # no-op when cached; makes setup() usable on its own (tests, notebooks)
        path = self.cache_path()
        meta = json.loads(path.with_suffix(".json").read_text())
        tokens = np.memmap(path, dtype=np.dtype(meta["dtype"]), mode="r")
        n_val = int(meta["n_val"]) if "n_val" in meta else int(len(tokens) * self.val_fraction)
        need = self.block_size + 1
        if len(tokens) - n_val <= need or n_val <= need:
            raise DataUnavailableError(
                f"data={self.name} has {len(tokens)} tokens: too few for train/val windows of "
                f"{self.block_size} tokens with val_fraction={self.val_fraction}; use more text "
                "(e.g. data.corpus_chars) or a smaller model.block_size"
            )
        self.train_tokens, self.val_tokens = tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :]

    # -- loaders -----------------------------------------------------------------------------------------------------
    def train_dataloader(self) -> DataLoader:
        assert self.train_tokens is not None, "call setup() first"
        data = TrainWindows(self.train_tokens, self.block_size, self.batch_size, self.seed, start=self.position)
        # Batches are built by the dataset itself (batch_size=None). One worker at most: the stream is sequential.
        return DataLoader(data, batch_size=None, num_workers=min(self.num_workers, 1),
                          pin_memory=torch.cuda.is_available())

    def val_dataloader(self) -> DataLoader:
        assert self.val_tokens is not None, "call setup() first"
        data = ValWindows(self.val_tokens, self.block_size, self.batch_size, self.val_batches)
        return DataLoader(data, batch_size=None, shuffle=False, num_workers=0)

    # -- checkpointed position ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The data position (batches consumed) — plain ints, so checkpoints load with weights_only."""
        trainer = self.trainer
        if trainer is not None:
            self.position = int(trainer.global_step) * int(trainer.accumulate_grad_batches)
        return {"position": int(self.position), "seed": int(self.seed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"checkpoint was trained with data seed {state['seed']}, this run uses seed="
                             f"{self.seed}; valid: the same seed to resume the same stream")
        self.position = int(state["position"])

"""Data: the embedded corpus, tokenizers, the token cache, train/val windows and the local/hub loading path."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from altgrad.config import ConfigError
from altgrad.data import datamodule as dm_mod
from altgrad.data.corpus import iter_documents
from altgrad.data.datamodule import TextDataModule, TrainWindows
from altgrad.data.sources import DataUnavailableError
from altgrad.data.tokenizer import TokenizerUnavailableError, byte_encoding, get_tokenizer


# --- corpus ----------------------------------------------------------------------------------------------------
def test_corpus_is_large_fast_and_seeded() -> None:
    start = time.perf_counter()
    docs = list(iter_documents(0, 5_000_000))
    elapsed = time.perf_counter() - start
    text = "".join(docs)
    assert len(text.encode()) >= 5_000_000
    assert elapsed < 30  # ≈0.5 s on an idle laptop core; generous for a loaded CI machine
    assert list(iter_documents(0, 100_000)) == docs[: len(list(iter_documents(0, 100_000)))]
    assert next(iter_documents(1, 1)) != docs[0]


def test_corpus_reads_like_legislation() -> None:
    text = "".join(iter_documents(3, 300_000))
    for pattern in [
        r"^Article \d+$",                      # article headings
        r"^Whereas:$", r"^\(\d+\) [A-Z]",        # recitals
        r"^\d\. [A-Z]",                         # numbered paragraphs
        r"^\([a-h]\) .*;",                      # lettered points
        r"'[a-z -]+' means ",                   # definitions
        r"Article \d+\(\d\)",                  # cross-references
        r"\b\d{1,2} (January|February|March|April|May|June|July|August|September|October|November|December) "
        r"\d{4}\b",                             # dates
        r"EUR \d[\d ]*( million)?",            # amounts
        r"^CHAPTER [IVX]+$",
    ]:
        assert re.search(pattern, text, flags=re.MULTILINE), pattern


# --- tokenizers ------------------------------------------------------------------------------------------------
def test_byte_encoding_has_257_tokens_and_round_trips() -> None:
    enc = byte_encoding()
    assert enc.n_vocab == 257 and enc.eot_token == 256
    text = "Article 5(2) — € 1 500 000, Überprüfung"
    ids = enc.encode_ordinary(text)
    assert ids == list(text.encode("utf-8"))
    assert enc.decode(ids) == text


def test_named_encoding_offline_fails_with_one_actionable_line(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TokenizerUnavailableError) as err:
        get_tokenizer("gpt2")
    msg = str(err.value)
    assert "\n" not in msg
    for needle in ("'gpt2'", "TIKTOKEN_CACHE_DIR", "HF_HUB_OFFLINE", "data=embedded"):
        assert needle in msg


def test_unknown_tokenizer_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="valid: bytes, .*gpt2"):
        get_tokenizer("nope")


# --- datamodule ------------------------------------------------------------------------------------------------
def embedded(tmp_path: Path, **kw) -> TextDataModule:
    args = dict(name="embedded", block_size=32, batch_size=4, corpus_chars=200_000, cache_dir=str(tmp_path),
                val_batches=3)
    args.update(kw)
    return TextDataModule(**args)


def test_tokens_are_cached_once_as_uint16(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dm = embedded(tmp_path)
    dm.setup()
    path = dm.cache_path()
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 257 and meta["source"] == "embedded"
    assert path.stat().st_size == 2 * meta["n_tokens"]
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]

    def no_regeneration(*args, **kwargs):
        raise AssertionError("the cache should have been reused")

    monkeypatch.setattr(dm_mod, "iter_texts", no_regeneration)
    again = embedded(tmp_path)
    again.setup()
    np.testing.assert_array_equal(again.train_tokens, dm.train_tokens)
    assert embedded(tmp_path, corpus_seed=1).cache_path() != path  # keyed by the source
    assert TextDataModule(name="x", tokenizer="gpt2", cache_dir=str(tmp_path)).cache_path() != path  # and tokenizer


def test_train_val_split_and_windows(tmp_path: Path) -> None:
    dm = embedded(tmp_path)
    dm.setup()
    n = len(dm.train_tokens) + len(dm.val_tokens)
    assert len(dm.val_tokens) == int(n * 0.05)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == (4, 32) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next tokens
    val = list(dm.val_dataloader())
    assert len(val) == 3
    other_seed = embedded(tmp_path, seed=7)
    other_seed.setup()
    assert all(torch.equal(a[0], b[0]) for a, b in zip(val, other_seed.val_dataloader()))  # same val set
    assert not torch.equal(next(iter(other_seed.train_dataloader()))[0], x)  # different training stream


def test_stream_resumes_from_checkpointed_position(tmp_path: Path) -> None:
    dm = embedded(tmp_path, seed=3)
    dm.setup()
    straight = [b[0] for _, b in zip(range(6), dm.train_dataloader())]
    dm.position = 4
    state = dm.state_dict()
    assert state == {"position": 4, "seed": 3}
    resumed = embedded(tmp_path, seed=3)
    resumed.setup()
    resumed.load_state_dict(state)
    tail = [b[0] for _, b in zip(range(2), resumed.train_dataloader())]
    assert all(torch.equal(a, b) for a, b in zip(straight[4:], tail))
    with pytest.raises(ValueError, match="seed"):
        embedded(tmp_path, seed=4).load_state_dict(state)


def test_windows_depend_only_on_seed_and_index() -> None:
    tokens = np.arange(10_000, dtype=np.uint16)
    a = list(zip(range(3), TrainWindows(tokens, 16, 2, seed=5)))
    b = list(zip(range(3), TrainWindows(tokens, 16, 2, seed=5, start=2)))
    assert torch.equal(a[2][1][0], b[0][1][0])


def test_too_little_text_is_a_clear_error(tmp_path: Path) -> None:
    dm = embedded(tmp_path, corpus_chars=100, block_size=4096)  # one document: a few thousand tokens
    with pytest.raises(DataUnavailableError, match="too few"):
        dm.setup()


# --- local files and the hub path (same load_dataset code), offline --------------------------------------------
DOCS = ["Article 1 This Regulation applies.", "Article 2 Definitions follow.", "Article 3 Penalties apply."] * 40


def write_files(folder: Path, kind: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "jsonl":
        path = folder / "train.jsonl"
        path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(DOCS)))
    elif kind == "parquet":
        path = folder / "train.parquet"
        pd.DataFrame({"text": DOCS}).to_parquet(path)
    else:
        path = folder / "train.txt"
        path.write_text("\n".join(DOCS) + "\n")
    return path


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "txt"])
def test_local_files_are_tokenized(tmp_path: Path, kind: str) -> None:
    path = write_files(tmp_path / "files", kind)
    dm = TextDataModule(name="local", source="local", path=str(path), tokenizer="bytes", block_size=16,
                        batch_size=2, val_fraction=0.2, cache_dir=str(tmp_path / "cache"))
    dm.setup()
    text = dm.tokenizer.decode(np.concatenate([dm.train_tokens, dm.val_tokens]).tolist())
    assert text.count("<|endoftext|>") == len(DOCS)
    assert text.startswith(DOCS[0])


def test_local_folder_and_glob(tmp_path: Path) -> None:
    write_files(tmp_path / "data" / "a", "jsonl")
    write_files(tmp_path / "data" / "b", "jsonl")
    for spec in (str(tmp_path / "data"), str(tmp_path / "data" / "*" / "*.jsonl")):
        dm = TextDataModule(name="local", source="local", path=spec, tokenizer="bytes", block_size=16,
                            batch_size=2, val_fraction=0.2, cache_dir=str(tmp_path / "cache"))
        dm.setup()
        assert dm.tokenizer.decode(dm.train_tokens.tolist()).count("<|endoftext|>") > len(DOCS)


def test_local_path_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data.path='.*missing.txt' matches no"):
        TextDataModule(name="local", source="local", path=str(tmp_path / "missing.txt"),
                       cache_dir=str(tmp_path)).cache_path()
    write_files(tmp_path / "mixed", "jsonl")
    write_files(tmp_path / "mixed", "txt")
    with pytest.raises(ConfigError, match="mixes file types"):
        TextDataModule(name="local", source="local", path=str(tmp_path / "mixed"), cache_dir=str(tmp_path)).setup()
    path = write_files(tmp_path / "j", "jsonl")
    dm = TextDataModule(name="local", source="local", path=str(path), text_field="body", tokenizer="bytes",
                        cache_dir=str(tmp_path / "c"))
    with pytest.raises(ConfigError, match="data.text_field='body'.*valid: text, id"):
        dm.setup()


def test_hub_source_reads_a_dataset_folder(tmp_path: Path) -> None:
    # data=eurlex's code path (load_dataset(hub_path, config_name, split)) on a local dataset folder.
    write_files(tmp_path / "lexfolder", "parquet")
    dm = TextDataModule(name="eurlex", source="hub", hub_path=str(tmp_path / "lexfolder"), config_name=None,
                        split="train", tokenizer="bytes", block_size=16, batch_size=2, val_fraction=0.2,
                        cache_dir=str(tmp_path / "cache"))
    dm.setup()
    assert dm.tokenizer.decode(dm.train_tokens[:40].tolist()).startswith(DOCS[0])


def test_hub_dataset_offline_names_the_dataset_and_the_way_out(tmp_path: Path) -> None:
    dm = TextDataModule(name="eurlex", source="hub", hub_path="coastalcph/lex_glue", config_name="eurlex",
                        tokenizer="bytes", cache_dir=str(tmp_path))
    with pytest.raises(DataUnavailableError) as err:
        dm.prepare_data()
    msg = str(err.value)
    assert "\n" not in msg
    for needle in ("coastalcph/lex_glue", "eurlex", "HF_HUB_OFFLINE", "data=embedded"):
        assert needle in msg


def test_gpt2_tokenizer_offline_names_the_dataset(tmp_path: Path) -> None:
    dm = TextDataModule(name="eurlex", source="hub", hub_path="coastalcph/lex_glue", tokenizer="gpt2",
                        cache_dir=str(tmp_path))
    with pytest.raises(DataUnavailableError, match=r"data=eurlex: .*TIKTOKEN_CACHE_DIR.*data=embedded"):
        _ = dm.vocab_size

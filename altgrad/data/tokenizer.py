"""Tokenizers as tiktoken `Encoding`s: a byte-level one built in code (no download), or a named tiktoken encoding.

`bytes` maps every UTF-8 byte to its own id (0..255) and `<|endoftext|>` to 256: 257 tokens, so an untrained model's
loss is ln 257 ≈ 5.55. Named encodings (`gpt2`, ...) come from tiktoken's cache or its download; offline without a
cache they fail at once with one line saying how to fix it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import tiktoken
import tiktoken.load

ENDOFTEXT = "<|endoftext|>"
BYTES = "bytes"
# GPT-2's pre-tokenization pattern (tiktoken's r50k): it only splits text into pieces; with no merges every byte of
# every piece becomes its own token, so the split does not change the ids, it only keeps pieces short.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TIKTOKEN_OFFLINE")


class TokenizerUnavailableError(RuntimeError):
    """A named tiktoken encoding is neither cached nor downloadable."""


def offline() -> bool:
    """True when the user asked for no network (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE or TIKTOKEN_OFFLINE set)."""
    return any(os.environ.get(v, "").strip().lower() in {"1", "true", "yes", "on"} for v in _OFFLINE_VARS)


def byte_encoding() -> tiktoken.Encoding:
    """The 257-token byte-level encoding: one id per byte value plus <|endoftext|>."""
    return tiktoken.Encoding(
        name=BYTES,
        pat_str=GPT2_PATTERN,
        mergeable_ranks={bytes([i]): i for i in range(256)},
        special_tokens={ENDOFTEXT: 256},
    )


@contextlib.contextmanager
def _no_download() -> Iterator[None]:
    """Make tiktoken's downloader fail immediately, so only its cache can serve a vocabulary."""

    def refuse(blobpath: str) -> bytes:
        if "://" not in blobpath:
            with open(blobpath, "rb") as f:
                return f.read()
        raise OSError(f"offline: not downloading {blobpath}")

    original = tiktoken.load.read_file
    tiktoken.load.read_file = refuse
    try:
        yield
    finally:
        tiktoken.load.read_file = original


def get_tokenizer(name: str) -> tiktoken.Encoding:
    """`bytes` or a tiktoken encoding name (e.g. `gpt2`); raises TokenizerUnavailableError when it cannot load."""
    if name == BYTES:
        return byte_encoding()
    if name not in tiktoken.list_encoding_names():
        raise ValueError(f"data.tokenizer={name!r} is not valid; valid: {BYTES}, "
                         f"{', '.join(sorted(tiktoken.list_encoding_names()))}")
    guard = _no_download() if offline() else contextlib.nullcontext()
    try:
        with guard:
            return tiktoken.get_encoding(name)
    except Exception as err:  # tiktoken raises requests/OS errors of several kinds
        cache = os.environ.get("TIKTOKEN_CACHE_DIR", "<unset: tiktoken uses $TMPDIR/data-gym-cache>")
        raise TokenizerUnavailableError(
            f"tiktoken encoding {name!r} is not cached and cannot be downloaded "
            f"({'offline mode (HF_HUB_OFFLINE)' if offline() else type(err).__name__}); "
            f"TIKTOKEN_CACHE_DIR={cache}: run once online or copy a tiktoken cache there, "
            f"or use data.tokenizer=bytes, or data=embedded"
        ) from err

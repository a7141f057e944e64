"""Tokenize a run's data into its token cache ahead of time, on a machine with network, so that the run itself needs
none: ``python -m altgrad.data.prepare experiment=evidence_gpu``.

The data section is composed exactly as ``python -m altgrad.train`` composes it from the same overrides, so the cache
file has the name the run will look for. With ``TIKTOKEN_CACHE_DIR`` set, tiktoken keeps the tokenizer's files
there: ship that folder and the token cache (``data.cache_dir``, default ``$ALTGRAD_CACHE``) with the command, and
run it with ``HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1``. Prints the cache file, its token count and the tokenizer.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def prepare(overrides: Sequence[str], conf_dir: Path = CONF_DIR) -> Path:
    """Write (or find) the token cache of the data the overrides select; return its path."""
    import hydra
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose(config_name="train", overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()
    datamodule = hydra.utils.instantiate(cfg.data, _convert_="all")
    datamodule.prepare_data()
    datamodule.setup()  # checks there are enough tokens for the model's windows
    return datamodule.cache_path()


def main(argv: Sequence[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    from altgrad.data.sources import DataUnavailableError

    try:
        path = prepare(argv)
    except (DataUnavailableError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # Hydra composition errors: one line, as the entry point prints them
        first = (str(err).splitlines() or [type(err).__name__])[0]
        print(f"error: {first}", file=sys.stderr)
        return 2
    meta = json.loads(path.with_suffix(".json").read_text())
    tiktoken_dir = os.environ.get("TIKTOKEN_CACHE_DIR", "<unset>")
    print(f"tokens: {path} ({meta['n_tokens']} tokens of {meta['n_docs']} documents, {meta['dtype']}, "
          f"vocab {meta['vocab_size']}); TIKTOKEN_CACHE_DIR={tiktoken_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

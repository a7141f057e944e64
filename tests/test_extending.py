"""docs/extending.md followed once: its format recipe (a 6-bit e3m2 of its own, in a config folder of its own) is
checked bit for bit against ml_dtypes' float6_e3m2fn and trained for 3 steps through the real entry point. The
YAML is read from the guide itself, so the page and what runs cannot drift apart."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from altgrad.config import validate
from altgrad.preflight import check_overrides
from altgrad.quant import quantize
from altgrad.quant.layer_map import FORMAT_FIELDS, resolve_format

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "extending.md"
TINY = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=32", "data.batch_size=4",
        "data.corpus_chars=200000", "data.val_batches=2", "schedule.warmup_steps=1", "trainer.max_steps=3",
        "trainer.val_check_interval=3", "trainer.checkpoint_every_n_steps=3", "trainer.sample_tokens=0",
        "logger=csv", "callbacks=none"]


def guide_format_yaml() -> str:
    """The YAML block that follows the guide's `conf/format/e3m2.yaml` line."""
    text = GUIDE.read_text()
    match = re.search(r"`conf/format/e3m2\.yaml`[^\n]*\n+```yaml\n(.*?)```", text, re.S)
    assert match, "docs/extending.md lost its format recipe (conf/format/e3m2.yaml and its YAML block)"
    return match.group(1)


@pytest.fixture()
def own_conf(tmp_path: Path) -> Path:
    """A config folder of one's own holding the guide's format file, as `-cd DIR` adds it to the search path."""
    (tmp_path / "conf" / "format").mkdir(parents=True)
    (tmp_path / "conf" / "format" / "e3m2.yaml").write_text(guide_format_yaml())
    return tmp_path / "conf"


def composed_format(own_conf: Path) -> dict:
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose("train", overrides=[f"hydra.searchpath=[file://{own_conf}]", "format=e3m2"])
    finally:
        GlobalHydra.instance().clear()
    run = validate(cfg, paths=False)
    assert run.format_label == "e3m2"
    return OmegaConf.to_container(cfg.format, resolve=True)


def test_the_guides_format_is_ml_dtypes_float6_e3m2fn_bit_for_bit(own_conf: Path) -> None:
    cfg = composed_format(own_conf)
    fmt = resolve_format(cfg["name"], {k: cfg[k] for k in FORMAT_FIELDS})
    assert (fmt.name, fmt.bits, fmt.max, fmt.min_subnormal) == ("e3m2", 6, 28.0, 0.0625)
    rng = np.random.default_rng(0)
    x = np.concatenate([(np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32),  # every bf16 pattern
                        (rng.standard_normal(50_000) * np.exp2(rng.integers(-8, 7, 50_000))).astype(np.float32)])
    x = x[np.isfinite(x)]  # float6_e3m2fn has neither Inf nor NaN: their conversion is not defined there
    ref = x.astype(ml_dtypes.float6_e3m2fn).astype(np.float32)
    ours = quantize(torch.from_numpy(x), fmt).numpy()
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))  # signs of zero included


def test_a_format_of_its_own_needs_all_four_fields_and_a_possible_format() -> None:
    message = check_overrides(["format.name=e3m2"], REPO / "conf")
    assert message.startswith("format.name='e3m2' is not valid; valid: ") and "format.ebits, format.mbits, " \
        "format.bias, format.policy all set" in message
    fields = ["format.name=e3m2", "format.ebits=3", "format.mbits=2", "format.bias=3"]
    assert "policy 'p3109' is the 8-bit family" in check_overrides([*fields, "format.policy=p3109"], REPO / "conf")
    assert check_overrides([*fields, "format.policy=finite"], REPO / "conf") is None


def test_the_guides_format_trains_three_steps_through_the_entry_point(own_conf: Path, tmp_path: Path) -> None:
    env = {**os.environ, "ALTGRAD_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "altgrad.train", "-cd", str(own_conf), "format=e3m2", *TINY,
                           f"hydra.run.dir={run_dir}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 3 and summary["format"] == "e3m2"
    assert summary["final_val_loss"] < summary["initial_val_loss"]
    layers = json.loads((run_dir / "layer_map.json").read_text())
    assert layers["transformer.h.0.mlp.c_fc"]["weight"]["format"] == {
        "name": "e3m2", "ebits": 3, "mbits": 2, "bias": 3, "policy": "finite"}

"""Each default is stated once, in conf/: the schemas in altgrad/config.py and the Python classes the configs build
hold types and checks, not a second copy of the values; the trainer presets state only what differs from
conf/trainer/default.yaml."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import MISSING, OmegaConf

from altgrad.config import (
    FormatSchema,
    ModelSchema,
    QuantSchema,
    ScheduleSchema,
    TrainerSchema,
    validate,
)
from altgrad.errors import ConfigError
from altgrad.model import GPTConfig

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


@pytest.mark.parametrize("schema", [ModelSchema, TrainerSchema, ScheduleSchema, QuantSchema, FormatSchema])
def test_schemas_of_sections_conf_states_in_full_hold_no_values(schema: type) -> None:
    with_values = [f.name for f in dataclasses.fields(schema) if f.default is not MISSING]
    assert with_values == []


def test_the_gpt_shape_has_no_default_in_python() -> None:
    required = [f.name for f in dataclasses.fields(GPTConfig) if f.default is dataclasses.MISSING]
    assert required == ["block_size", "vocab_size", "n_layer", "n_head", "n_embd"]


def test_trainer_presets_state_only_what_differs_from_default_yaml() -> None:
    default = yaml.safe_load((CONF / "trainer" / "default.yaml").read_text())
    assert set(default) == {f.name for f in dataclasses.fields(TrainerSchema)}  # every key, once
    for name in ("cpu", "gpu", "ddp"):
        own = yaml.safe_load((CONF / "trainer" / f"{name}.yaml").read_text())
        restated = {k for k, v in own.items() if k not in ("defaults", "name") and default.get(k) == v}
        assert restated == set(), f"trainer/{name}.yaml restates default.yaml's {sorted(restated)}"
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cpu, gpu = compose("train", overrides=["trainer=cpu"]), compose("train", overrides=["trainer=gpu"])
    assert OmegaConf.to_container(cpu.trainer) == {**default, "name": "cpu"}
    assert (gpu.trainer.accelerator, gpu.trainer.compile, gpu.trainer.log_every_n_steps) == ("gpu", True, 10)


def test_a_key_the_yaml_leaves_out_is_required_not_filled_in() -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["~trainer.max_steps"])
    with pytest.raises(ConfigError, match="trainer.max_steps is required but not set"):
        validate(cfg, paths=False)

"""An arm keeps what it declares inside every experiment a study runs it with. An experiment's group overrides come
after the arm in the defaults list, so an arm that only chose a group in its defaults (study 2's failure-stage arms:
`override /layer_map: uniform`) silently lost it to the experiment's own (`weights_only`), and the ladder's stages
ran as stage 1. Every (experiment, arm) pair of conf/study/*.yaml is composed with and without the experiment and
the arm's choices (its groups' names, a layer map's rules, every key of its body) must come out the same; the
ladder's stages must quantize the roles they name."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from altgrad.model import GPT, GPTConfig
from altgrad.quant.layer_map import LayerMap

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"


def _values(override: str) -> list[str]:
    return override.split("=", 1)[1].strip("\"'").split(",")


def _pairs() -> list[tuple[str, str]]:
    """Every (experiment, arm) that a study plan's sweeps run."""
    pairs = set()
    for plan in sorted((CONF / "study").glob("*.yaml")):
        for stage in yaml.safe_load(plan.read_text()).get("stages", []):
            for sweep in stage.get("sweeps", []) or []:
                exps = [v for o in sweep if o.startswith("experiment=") for v in _values(o)]
                arms = [v for o in sweep if o.startswith("arm=") for v in _values(o)]
                pairs.update((e, a) for e in exps for a in arms)
    return sorted(pairs)


PAIRS = _pairs()


def _declared(arm: str) -> tuple[list[str], list[str]]:
    """(the groups the arm's defaults override, the dotted keys its body sets)."""
    text = yaml.safe_load((CONF / "arm" / f"{arm}.yaml").read_text())
    groups = [next(iter(d)).removeprefix("override /") for d in text.get("defaults", []) if isinstance(d, dict)]

    def keys(node: object, prefix: str) -> list[str]:
        if isinstance(node, dict):
            return [k for name, v in node.items() for k in keys(v, f"{prefix}{name}.")]
        return [prefix.rstrip(".")]

    return groups, keys({k: v for k, v in text.items() if k != "defaults"}, "")


@lru_cache(maxsize=None)  # an arm alone is composed once for all its experiments
def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=["format=e4m3", "paths.output_dir=/tmp/x",
                                           *overrides])


def test_the_study_plans_name_arm_and_experiment_pairs() -> None:
    assert ("ongrid_stages", "stage_wag") in PAIRS and ("ongrid", "manifold_sr") in PAIRS


@pytest.mark.parametrize(("experiment", "arm"), PAIRS, ids=[f"{e}+{a}" for e, a in PAIRS])
def test_an_arm_keeps_what_it_declares_inside_the_experiment(experiment: str, arm: str) -> None:
    alone, inside = _compose(f"arm={arm}"), _compose(f"experiment={experiment}", f"arm={arm}")
    groups, keys = _declared(arm)
    # a chosen group is its name (an experiment may still set its lr, say); a layer map is all of its rules
    chosen = [f"{g}.name" for g in groups] + ["layer_map"] * ("layer_map" in groups)
    for key in [*chosen, *keys]:
        a, b = OmegaConf.select(alone, key), OmegaConf.select(inside, key)
        a = OmegaConf.to_container(a, resolve=True) if OmegaConf.is_config(a) else a
        b = OmegaConf.to_container(b, resolve=True) if OmegaConf.is_config(b) else b
        assert a == b, f"{experiment} changes {arm}'s {key}: {a!r} → {b!r}"


LADDER = {  # stage → (weight, input, grad) quantized, and the weight storage
    "stage_w": ((True, False, False), "fp32"),
    "stage_wa": ((True, True, False), "fp32"),
    "stage_wag": ((True, True, True), "fp32"),
    "stage_wag_rn": ((True, True, True), "none"),
    "stage_wag_sr": ((True, True, True), "none"),
}


@pytest.mark.parametrize("arm", sorted(LADDER))
def test_the_failure_stage_ladder_quantizes_the_roles_each_stage_names(arm: str) -> None:
    cfg = _compose("experiment=ongrid_stages", f"arm={arm}")
    gpt = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0))
    torch.manual_seed(0)
    resolved = LayerMap.from_config(cfg.layer_map, cfg.format).resolve(gpt)
    roles, master = LADDER[arm]
    for name, r in resolved.items():
        got = tuple(spec is not None and spec.format.name == "e4m3" for spec in (r.weight, r.input, r.grad))
        assert got == roles, (arm, name, got)
    assert cfg.quant.master == master

"""build_optimizer: every conf/optimizer option instantiates over a quantized GPT, with the right groups."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from altgrad.callbacks.fake_quant import FakeQuantCallback
from altgrad.model import GPT, GPTConfig
from altgrad.optim import GridOptim, ManifoldAdamW, QuantAwareOptimizer, build_optimizer

CONF = Path(__file__).resolve().parents[2] / "conf"
OPTIONS = sorted(p.stem for p in (CONF / "optimizer").glob("*.yaml"))
FORMAT = {"name": "e4m3", "grad": None, "rounding": "nearest", "overflow": "saturate",
          "scaling": {"kind": "tensor", "pow2": True}}
QUANTIZED = {f"transformer.h.{i}.{m}.weight" for i in range(2)
             for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}


def gpt(quantized: bool = True) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16, bias=True))
    if quantized:
        FakeQuantCallback(FORMAT, {"base_rules": []}).apply(model)  # every Linear, lm_head tied to wte
    return model


def optimizer_config(option: str):
    """The option as a run composes it (through train.yaml, so `${baseline.*}` resolves), resolved."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"optimizer={option}"])
    return OmegaConf.create(OmegaConf.to_container(cfg.optimizer, resolve=True))


def test_the_option_list_has_the_issue_optimizers():
    assert {"adamw", "sgd", "manifold", "manifold_grad", "grid", "madam", "relative"} <= set(OPTIONS)


@pytest.mark.parametrize("option", OPTIONS)
def test_every_option_builds_and_steps(option):
    cfg = optimizer_config(option)
    assert cfg.name == option and "_target_" in cfg
    model = gpt()
    optimizer, info = build_optimizer(cfg, model)
    assert info["name"] == option and info["label"] == cfg.get("label", option)
    names = dict(model.named_parameters())
    assert sorted(info["rule_params"] + info["plain_params"]) == sorted(names)
    if isinstance(optimizer, QuantAwareOptimizer):
        rule = QUANTIZED if isinstance(optimizer, GridOptim) else QUANTIZED | {"transformer.wte.weight"}
        assert set(info["rule_params"]) == rule  # GridOptim leaves the tied wte/lm_head weight to plain AdamW
        assert info["plain_lr"] == cfg.plain_lr
    else:
        assert info["plain_params"] == [] and info["plain_lr"] is None
    decays = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    plain = set(info["plain_params"])
    for n, p in names.items():
        wd = cfg.get("plain_weight_decay") if n in plain else cfg.get("weight_decay", 0.0)
        assert decays[id(p)] == (wd if p.dim() >= 2 else 0.0), n
    idx = torch.randint(0, 64, (2, 16))
    before = {n: p.detach().clone() for n, p in names.items()}

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        logits = model(idx)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten())
        loss.backward()
        return loss

    assert torch.isfinite(optimizer.step(closure))
    assert all(not torch.equal(before[n], p.detach()) for n, p in names.items() if p.dim() >= 2), option


def test_composed_through_train_yaml_too():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["optimizer=manifold_grad"])
    assert cfg.optimizer.stiffness_on == "grad" and cfg.optimizer.label == "manifold[grad]"
    optimizer, info = build_optimizer(cfg.optimizer, gpt())
    assert isinstance(optimizer, ManifoldAdamW) and optimizer.defaults["lr"] == 5e-3


def test_explicit_grids_override_the_model_and_an_unquantized_model_is_all_plain():
    model = gpt(quantized=False)
    cfg = optimizer_config("manifold")
    optimizer, info = build_optimizer(cfg, model)
    assert info["rule_params"] == [] and len(info["plain_params"]) == len(list(model.parameters()))
    with pytest.raises(ValueError, match="needs at least one quantized weight"):
        build_optimizer(optimizer_config("grid"), model)
    from optim_helpers import quantizer

    w = model.transformer.h[0].mlp.c_fc.weight
    optimizer, info = build_optimizer(cfg, model, grids={w: quantizer("e4m3", "tensor")})
    assert info["rule_params"] == ["transformer.h.0.mlp.c_fc.weight"]


def test_config_without_target_is_rejected():
    with pytest.raises(ValueError, match="lacks `_target_`"):
        build_optimizer({"name": "x", "lr": 1.0}, gpt())

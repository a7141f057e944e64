"""LayerMap resolution: defaults, precedence, globs, {last}, unmatched rules, tied weights, config presets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from altgrad.model import GPT, GPTConfig
from altgrad.quant import get_format
from altgrad.quant.layer_map import FormatDefaults, LayerMap, linear_names

CONF = Path(__file__).resolve().parents[2] / "conf"
FORMAT = {"name": "e4m3", "grad": "e5m2", "rounding": "nearest", "overflow": "saturate",
          "scaling": {"kind": "tensor", "pow2": True}}


def tiny_gpt(n_layer: int = 3) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=n_layer, n_head=2, n_embd=16, dropout=0.0))


def fmt_names(resolved, name):
    r = resolved[name]
    return tuple(None if s is None else s.format.name for s in (r.weight, r.input, r.grad))


def test_defaults_apply_to_every_linear_and_nothing_else():
    model = tiny_gpt()
    resolved = LayerMap([], FormatDefaults.from_config(FORMAT)).resolve(model)
    assert list(resolved) == linear_names(model)
    assert set(resolved) == {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert all(fmt_names(resolved, n) == ("e4m3", "e4m3", "e5m2") for n in resolved)
    assert not any("wte" in n or "ln" in n or "wpe" in n for n in resolved)


def test_later_rules_override_earlier_ones_role_by_role():
    rules = [
        {"match": "transformer.h.*.attn.*", "weight": "bf16", "input": "bf16"},
        {"match": "*.attn.c_proj", "weight": "e7m0"},
        {"match": "lm_head", "grad": None},
    ]
    resolved = LayerMap(rules, FormatDefaults.from_config(FORMAT)).resolve(tiny_gpt())
    assert fmt_names(resolved, "transformer.h.1.attn.c_attn") == ("bf16", "bf16", "e5m2")
    assert fmt_names(resolved, "transformer.h.1.attn.c_proj") == ("e7m0", "bf16", "e5m2")
    assert fmt_names(resolved, "transformer.h.1.mlp.c_fc") == ("e4m3", "e4m3", "e5m2")
    assert fmt_names(resolved, "lm_head") == ("e4m3", "e4m3", None)


def test_role_mappings_set_rounding_scaling_and_custom_fields():
    rules = [{"match": "*.mlp.c_fc", "weight": {"format": "e3m4", "bias": 3, "policy": "ieee",
                                                "rounding": "stochastic", "scaling": {"kind": "channel"}}}]
    spec = LayerMap(rules, FormatDefaults.from_config(FORMAT)).resolve(tiny_gpt())["transformer.h.0.mlp.c_fc"].weight
    assert (spec.format.ebits, spec.format.mbits, spec.format.bias, spec.format.policy) == (3, 4, 3, "ieee")
    assert spec.rounding == "stochastic" and spec.scaling.kind == "channel" and spec.scaling.pow2 is True


def test_last_block_placeholder_follows_n_layer():
    rules = [{"match": "transformer.h.{last}.*", "weight": "bf16"}]
    for n_layer in (2, 4):
        resolved = LayerMap(rules, FormatDefaults.from_config(FORMAT)).resolve(tiny_gpt(n_layer))
        last = n_layer - 1
        assert fmt_names(resolved, f"transformer.h.{last}.mlp.c_fc")[0] == "bf16"
        assert fmt_names(resolved, f"transformer.h.{last - 1}.mlp.c_fc")[0] == "e4m3"


def test_unmatched_rule_lists_module_names():
    with pytest.raises(ValueError, match=r"matches no Linear.*transformer\.h\.0\.attn\.c_attn.*lm_head"):
        LayerMap([{"match": "*.ffn.*", "weight": "e7m0"}], FormatDefaults.from_config(FORMAT)).resolve(tiny_gpt())


@pytest.mark.parametrize("rule, message", [
    ({"weight": "e7m0"}, "needs a 'match'"),
    ({"match": "*", "wieght": "e7m0"}, "unknown keys"),
    ({"match": "*", "weight": "e9m9"}, "e9m9"),
    ({"match": "*", "weight": 3}, "valid: null, default"),
    ("*.mlp.*", "a rule is a mapping"),
])
def test_malformed_rules_fail_with_a_readable_message(rule, message):
    with pytest.raises(ValueError, match=message):
        LayerMap([rule], FormatDefaults.from_config(FORMAT)).resolve(tiny_gpt())


def test_tied_head_is_marked():
    resolved = LayerMap([], FormatDefaults.from_config(FORMAT)).resolve(tiny_gpt())
    assert resolved["lm_head"].tied and not resolved["transformer.h.0.mlp.c_fc"].tied


def test_fp32_format_quantizes_nothing_and_grad_override_changes_only_grad():
    resolved = LayerMap([], FormatDefaults.from_config({"name": "fp32", "grad": None})).resolve(tiny_gpt())
    assert all(fmt_names(resolved, n) == (None, None, None) for n in resolved)
    resolved = LayerMap([], FormatDefaults.from_config({**FORMAT, "grad": "e4m3"})).resolve(tiny_gpt())
    assert fmt_names(resolved, "lm_head") == ("e4m3", "e4m3", "e4m3")


def compose_layer_map(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONF / "layer_map").glob("*.yaml")))
def test_every_layer_map_preset_composes_and_resolves(preset):
    cfg = compose_layer_map(f"layer_map={preset}", "format=e7m0")
    resolved = LayerMap.from_config(cfg.layer_map, cfg.format).resolve(tiny_gpt())
    assert len(resolved) == 13
    quantized = {n for n, r in resolved.items() if r.weight is not None and r.weight.format == get_format("e7m0")}
    expected = {
        "uniform": set(resolved),
        "attn_bf16": {n for n in resolved if ".attn." not in n},
        "mlp_only": {n for n in resolved if ".mlp." in n},
        "head_bf16": {n for n in resolved if n != "lm_head"},
        "first_last_bf16": {n for n in resolved if n.startswith("transformer.h.1.")},
        "single_family": {n for n in resolved if ".mlp." in n},
        "weights_only": set(resolved),  # weights on the grid; inputs and gradients float32 (checked below)
    }[preset]
    if preset == "weights_only":
        assert all(r.input is None and r.grad is None for r in resolved.values())
    assert quantized == expected


def test_command_line_rules_and_extra_are_appended():
    cfg = compose_layer_map("layer_map=attn_bf16", "format=e7m0",
                            '+layer_map.rules=[{match: "*.mlp.*", weight: e7m0, input: e4m3}]',
                            "+layer_map.extra=[{match: lm_head, weight: null}]")
    resolved = LayerMap.from_config(cfg.layer_map, cfg.format).resolve(tiny_gpt())
    assert fmt_names(resolved, "transformer.h.0.mlp.c_fc") == ("e7m0", "e4m3", "e5m2")
    assert fmt_names(resolved, "transformer.h.0.attn.c_attn") == ("bf16", "bf16", "bf16")
    assert fmt_names(resolved, "lm_head") == (None, "e7m0", "e5m2")


def test_single_family_switches_by_override():
    cfg = compose_layer_map("layer_map=single_family", "layer_map.family=attn", "format=e4m3")
    resolved = LayerMap.from_config(cfg.layer_map, cfg.format).resolve(tiny_gpt())
    assert {n for n, r in resolved.items() if r.weight is not None} == {n for n in resolved if ".attn." in n}
    assert cfg.layer_map.name == "only_attn"

"""The nanoGPT backbone: shapes, presets' sizes, tying, causality, init, weight-decay groups, MFU."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from altgrad.model import GPT, GPTConfig
from altgrad.optim.factory import weight_decay_groups

from bench_helpers import REPO


def preset(name: str, vocab_size: int) -> GPTConfig:
    cfg = yaml.safe_load((REPO / "conf" / "model" / f"{name}.yaml").read_text())
    cfg.pop("name")
    cfg["vocab_size"] = cfg["vocab_size"] or vocab_size
    return GPTConfig(**cfg)


@pytest.mark.parametrize(("name", "vocab", "low", "high"), [
    ("nano", 257, 0.7e6, 1.3e6),
    ("gpt_50m", 50257, 45e6, 56e6),
    ("gpt2_124m", 50257, 120e6, 128e6),
])
def test_preset_sizes(name: str, vocab: int, low: float, high: float) -> None:
    with torch.device("meta"):  # no memory, no init cost
        model = GPT(preset(name, vocab))
    assert low < model.num_params(non_embedding=False) < high


def small() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=16, vocab_size=50, n_layer=2, n_head=2, n_embd=32))


def test_forward_shape_and_tied_head() -> None:
    model = small()
    logits = model(torch.randint(0, 50, (3, 16)))
    assert logits.shape == (3, 16, 50)
    assert model.lm_head.weight is model.transformer.wte.weight


def test_attention_is_causal() -> None:
    model = small().eval()
    idx = torch.randint(0, 50, (1, 16))
    changed = idx.clone()
    changed[0, 10] = (idx[0, 10] + 1) % 50
    a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10], rtol=0, atol=0)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_sequence_longer_than_block_is_rejected() -> None:
    with pytest.raises(ValueError, match="block_size=16"):
        small()(torch.zeros(1, 17, dtype=torch.long))


def test_nanogpt_init() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=512, n_layer=4, n_head=4, n_embd=256))
    h0 = model.transformer.h[0]
    assert h0.attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert h0.mlp.c_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.05)


def test_weight_decay_groups_cover_every_parameter_once() -> None:
    model = small()
    (decay, no_decay), _ = weight_decay_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    ids = [id(p) for g in (decay, no_decay) for p in g["params"]]
    assert len(ids) == len(set(ids)) == len({id(p) for p in model.parameters()})


def test_mfu_estimate_scales_with_throughput_and_peak() -> None:
    model = small()
    cfg = model.config
    expected = 6 * model.num_params() + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size
    assert model.flops_per_token() == expected
    assert model.estimate_mfu(1000.0, 1e12) == pytest.approx(expected * 1000 / 1e12)
    assert model.estimate_mfu(2000.0, 1e12) == pytest.approx(2 * model.estimate_mfu(1000.0, 1e12))


def test_generate_appends_tokens() -> None:
    model = small().eval()
    out = model.generate(torch.zeros(1, 1, dtype=torch.long), 20, generator=torch.Generator().manual_seed(0))
    assert out.shape == (1, 21) and int(out.max()) < 50


def test_embd_must_split_into_heads() -> None:
    with pytest.raises(ValueError, match="n_head"):
        GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_embd=30, n_head=4)

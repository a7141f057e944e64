"""Distinct grids: which formats quantize identically under a run's scaling, checked against the quantizer itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from altgrad.quant import QuantSpec, ScalingSpec, TensorQuantizer, get_format, list_formats
from altgrad.quant.grids import grid_classes, grid_key, run_grid_classes, run_grid_key, same_grid

CONF = Path(__file__).resolve().parents[2] / "conf"
AMAX_SCALINGS = [ScalingSpec(kind="tensor"), ScalingSpec(kind="channel"), ScalingSpec(kind="block"),
                 ScalingSpec(kind="delayed"), ScalingSpec(kind="tensor", pow2=False)]
SAME = [("e0m7", "e1m6"), ("e4m3", "p3109_p4")]
NEAR = [("p3109_p1", "e7m0"), ("p3109_p3", "e5m2"), ("p3109_p5", "e3m4"), ("p3109_p7", "e1m6")]


@pytest.mark.parametrize("scaling", AMAX_SCALINGS, ids=lambda s: f"{s.kind}{'-pow2' if s.pow2 else ''}")
@pytest.mark.parametrize(("a", "b"), SAME)
def test_e0m7_is_e1m6_and_p3109_p4_is_e4m3_under_amax_scaling(a, b, scaling):
    assert same_grid(a, b, scaling)


@pytest.mark.parametrize(("a", "b"), SAME)
def test_without_scaling_they_are_different_grids(a, b):
    assert not same_grid(a, b, None) and not same_grid(a, b, "none")


@pytest.mark.parametrize(("a", "b"), NEAR)
def test_the_near_twins_differ_in_the_top_code_or_the_subnormal_extent(a, b):
    ka, kb = grid_key(a, "tensor"), grid_key(b, "tensor")
    assert ka != kb
    top_a, top_b = ka.values[-1], kb.values[-1]
    low_a, low_b = ka.values[1], kb.values[1]  # the smallest positive value, relative to the top binade
    assert top_a != top_b or low_a != low_b


def test_the_presets_fall_into_thirteen_grids_under_the_default_scaling():
    classes = grid_classes(list_formats(), "tensor")
    assert ("e0m7", "e1m6") in classes and ("e4m3", "p3109_p4") in classes
    assert all(len(c) == 1 for c in classes if c not in (("e0m7", "e1m6"), ("e4m3", "p3109_p4")))
    assert len(classes) == len(list_formats()) - 2
    assert len(grid_classes(list_formats(), None)) == len(list_formats())  # no scaling: every preset its own


def quantized(name: str, x: torch.Tensor, kind: str, pow2: bool = True) -> torch.Tensor:
    spec = QuantSpec(get_format(name), scaling=ScalingSpec(kind=kind, pow2=pow2))
    return TensorQuantizer(spec, "weight", track_stats=False)(x)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**20), exponent=st.integers(-30, 30), kind=st.sampled_from(["tensor", "channel", "block"]),
       pow2=st.booleans())
def test_same_grid_means_the_quantizer_gives_the_same_bits(seed, exponent, kind, pow2):
    x = torch.randn(16, 48, generator=torch.Generator().manual_seed(seed)) * 2.0**exponent
    for a, b in SAME:
        assert torch.equal(quantized(a, x, kind, pow2), quantized(b, x, kind, pow2)), (a, b)


@pytest.mark.parametrize(("a", "b", "kind"), [(*p, "tensor") for p in NEAR] + [(*p, "none") for p in SAME])
def test_different_grids_quantize_some_tensor_differently(a, b, kind):
    """The witnesses: every value of both grids (normalised as the key says) and the midpoints between them, up to
    either format's top (the amax decides each format's power-of-two scale; one of the two tells them apart)."""
    ka, kb = grid_key(a, kind), grid_key(b, kind)
    differ = []
    for top in (ka.values[-1], kb.values[-1]):
        values = sorted(v for v in set(ka.values) | set(kb.values) if v <= top)
        mids = [(lo + hi) / 2 for lo, hi in zip(values, values[1:])]
        x = torch.tensor(values + mids, dtype=torch.float64).float()
        differ.append(not torch.equal(quantized(a, x, kind), quantized(b, x, kind)))
    assert any(differ)


def run_format(option: str, *overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"format={option}", *overrides])
    return OmegaConf.to_container(cfg.format, resolve=True)


def test_runs_are_grouped_by_weight_and_gradient_grid():
    runs = {o: run_format(o) for o in ("bf16", "bf16_ref", "e0m7", "e1m6", "e4m3", "p3109_p4", "fp32")}
    assert run_grid_key(runs["fp32"]) is None
    assert run_grid_key(runs["bf16_ref"])[1] is None and run_grid_key(runs["bf16"])[1] is not None
    assert run_grid_classes(runs) == [("bf16",), ("bf16_ref",), ("e0m7", "e1m6"), ("e4m3", "p3109_p4"), ("fp32",)]
    unscaled = {o: run_format(o, "format.scaling.kind=none") for o in ("e0m7", "e1m6")}
    assert run_grid_classes(unscaled) == [("e0m7",), ("e1m6",)]
    custom = run_format("e3m4", "format.bias=3", "format.policy=ieee")  # ml_dtypes' float8_e3m4: another grid
    assert run_grid_key(custom) != run_grid_key(runs["e4m3"]) and run_grid_key(custom) != run_grid_key(
        run_format("e3m4"))


def test_the_wide_reference_is_bf16_with_unquantized_gradients_under_its_own_label():
    ref, bf16 = run_format("bf16_ref"), run_format("bf16")
    assert ref["name"] == "bf16" and ref["grad"] is None and bf16["grad"] == "e5m2"
    assert (ref["label"], bf16["label"]) == ("bf16_ref", "bf16")  # what runs record and reports show
    differs = ("grad", "label")
    assert {k: v for k, v in ref.items() if k not in differs} == {k: v for k, v in bf16.items() if k not in differs}


def test_bad_arguments_fail_in_one_line():
    with pytest.raises(ValueError, match="scaling.kind='amax' is not valid; valid: none, tensor"):
        same_grid("e4m3", "e5m2", "amax")
    with pytest.raises(ValueError, match="overflow='wrap' is not valid; valid: saturate, overflow"):
        grid_key("e4m3", "tensor", "wrap")
    with pytest.raises(ValueError, match="unknown format 'e9m9'"):
        grid_key("e9m9", "tensor")

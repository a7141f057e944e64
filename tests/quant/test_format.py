"""FloatFormat: validation, presets and every derived constant, computed here from the definition."""

from __future__ import annotations

import math

import gfloat
import numpy as np
import pytest
import torch
from code_oracle import all_values
from gfloat.formats import format_info_p3109

from altgrad.quant import FloatFormat, get_format, list_formats
from altgrad.quant.codes import encode

PRESETS = list_formats()


def test_preset_names() -> None:
    expected = {"e0m7", "e1m6", "e3m4", "e4m3", "e5m2", "e7m0", "bf16", "fp16"} | {f"p3109_p{p}" for p in range(1, 8)}
    assert expected <= set(PRESETS)
    for name in PRESETS:
        assert get_format(name).name == name


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="unknown format 'e9m9'.*e4m3.*p3109_p7"):
        get_format("e9m9")


@pytest.mark.parametrize("name", PRESETS)
def test_derived_constants_match_an_independent_decoder(name: str) -> None:
    fmt = get_format(name)
    vals = np.array(all_values(fmt)) if fmt.bits <= 16 else None
    finite = vals[np.isfinite(vals)]
    assert fmt.max == finite.max()
    assert fmt.min_subnormal == finite[finite > 0].min()
    if fmt.ebits == 0:
        assert fmt.min_normal is None
    else:
        assert fmt.min_normal == 2.0 ** (1 - fmt.bias)
    ours = fmt.values().numpy()
    np.testing.assert_array_equal(ours, np.unique(finite))  # sorted, each finite value once (±0 once)
    assert ours.dtype == np.float32


def test_table_of_formats_md() -> None:
    """Cross-check with the docs/formats.md table (values there were computed by hand; here by gfloat / the decoder)."""
    for p in range(1, 8):
        fi, fmt = format_info_p3109(8, p), get_format(f"p3109_p{p}")
        assert (fmt.ebits, fmt.mbits, fmt.bias) == (8 - p, p - 1, fi.bias)
        assert (fmt.max, fmt.min_normal, fmt.min_subnormal) == (fi.max, fi.smallest_normal, fi.smallest_subnormal)
    assert get_format("e4m3").max == 448 and get_format("e5m2").max == 57344
    assert get_format("e7m0").max == 2.0**64 and get_format("e3m4").max == 124
    assert get_format("bf16").max == float(torch.finfo(torch.bfloat16).max)
    assert get_format("fp16").max == float(torch.finfo(torch.float16).max)
    assert get_format("fp16").min_subnormal == float(torch.finfo(torch.float16).smallest_normal) / 1024


@pytest.mark.parametrize("name", [n for n in PRESETS if n.startswith("p3109")])
def test_p3109_codes_decode_like_gfloat(name: str) -> None:
    fmt = get_format(name)
    p = fmt.mbits + 1
    ref = gfloat.decode_ndarray(format_info_p3109(8, p), np.arange(256))
    ours = fmt.decode(torch.arange(256)).numpy()
    np.testing.assert_array_equal(ours, ref.astype(np.float32))


@pytest.mark.parametrize("name", PRESETS)
def test_every_code_decodes_and_reencodes_to_itself(name: str) -> None:
    fmt = get_format(name)
    codes = torch.arange(1 << fmt.bits)
    vals = fmt.decode(codes)
    expected = np.array(all_values(fmt), dtype=np.float32)
    np.testing.assert_array_equal(vals.numpy(), expected)
    # −0 decodes to −0.0 where the policy has it (so it re-encodes to its own code)
    neg_zero = 1 << (fmt.ebits + fmt.mbits)
    if fmt.policy != "p3109":
        assert math.copysign(1.0, float(vals[neg_zero])) == -1.0
    back = encode(vals, fmt, overflow="overflow").to(torch.int64)
    nan = torch.isnan(vals)
    assert torch.equal(back[~nan], codes[~nan])
    assert torch.isnan(fmt.decode(back[nan])).all()  # NaN codes map to the (canonical) NaN code
    assert encode(torch.zeros(1), fmt).dtype == (torch.uint8 if fmt.bits <= 8 else torch.int32)


def test_encode_rounds_and_saturates() -> None:
    e4m3 = get_format("e4m3")
    codes = encode(torch.tensor([1.0, 1.0625, 1.0626, 1000.0, -1000.0, float("nan")]), e4m3)
    assert codes.tolist() == [0x38, 0x38, 0x39, 0x7E, 0xFE, 0x7F]
    with pytest.raises(ValueError, match="no NaN code"):
        encode(torch.tensor([float("nan")]), get_format("e3m4"))


@pytest.mark.parametrize("name", PRESETS)
def test_ulp_is_the_grid_spacing(name: str) -> None:
    fmt = get_format(name)
    v = fmt.values().double()
    pos = v[v > 0]
    # spacing above each positive value within one binade equals ulp(value); at 0 it is min_subnormal
    gaps = pos[1:] - pos[:-1]
    ulp = fmt.ulp(pos[:-1].float()).double()
    e = torch.floor(torch.log2(pos[:-1]))
    same_binade = torch.floor(torch.log2(pos[1:] - 1e-300)) == e
    assert torch.equal(gaps[same_binade | (pos[:-1] < fmt.quantum * 2**fmt.mbits)],
                       ulp[same_binade | (pos[:-1] < fmt.quantum * 2**fmt.mbits)])
    assert float(fmt.ulp(torch.zeros(1))) == fmt.min_subnormal
    assert torch.equal(fmt.ulp(-pos.float()), fmt.ulp(pos.float()))
    assert (fmt.ulp(torch.tensor([1e-30, 3.0, 1e30])) > 0).all()
    assert torch.isnan(fmt.ulp(torch.tensor([float("inf"), float("nan")]))).all()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(ebits=4, mbits=4, bias=7, policy="p3109"), "ebits \\+ mbits must be 7"),
        (dict(ebits=-1, mbits=3, bias=7, policy="fn"), "ebits=-1"),
        (dict(ebits=4, mbits=-2, bias=7, policy="fn"), "mbits=-2"),
        (dict(ebits=9, mbits=3, bias=7, policy="fn"), "ebits=9.*0..8"),
        (dict(ebits=4, mbits=24, bias=7, policy="fn"), "mbits=24.*0..23"),
        (dict(ebits=4, mbits=3, bias=7, policy="ocp"), "policy='ocp'.*finite, fn, ieee, p3109"),
        (dict(ebits=1, mbits=3, bias=1, policy="ieee"), "ieee.*ebits >= 2"),
        (dict(ebits=0, mbits=0, bias=1, policy="finite"), "ebits \\+ mbits >= 1"),
        (dict(ebits=8, mbits=7, bias=127, policy="finite"), "bias=127 is too small"),
        (dict(ebits=8, mbits=7, bias=130, policy="ieee"), "bias=130 is too large"),
        (dict(ebits=0, mbits=1, bias=-110, policy="finite"), "grid spacing.*bias >= -104"),
        (dict(ebits=4.0, mbits=3, bias=7, policy="fn"), "ebits must be an int"),
        (dict(ebits=0, mbits=1, bias=1, policy="fn"), "no positive finite value"),
    ],
)
def test_impossible_formats_are_rejected_with_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        FloatFormat(**kwargs)


def test_name_is_a_label_only() -> None:
    assert FloatFormat(4, 3, 7, "fn") == get_format("e4m3")
    assert hash(FloatFormat(4, 3, 7, "fn")) == hash(get_format("e4m3"))
    assert FloatFormat(3, 4, 3, "ieee") != get_format("e3m4")

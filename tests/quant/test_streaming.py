"""The streaming-store kernel for large CPU tensors: the eager kernel's bits for every preset, mode, policy and seed
(and ml_dtypes' directly); quantize takes it exactly where it should; it falls back when it cannot be built."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from quant_testlib import assert_same_bits, inputs_for, random_inputs
from test_properties import formats

import altgrad.quant.rounding as rounding
import altgrad.quant.streaming as streaming
from altgrad.quant import OVERFLOWS, ROUNDINGS, FloatFormat, get_format, list_formats, quantize, quantize_eager
from altgrad.quant.rounding import kernel_params, kernel_variant

pytestmark = [pytest.mark.skipif(streaming._library() is None, reason="no AVX2 or no C++ compiler here"),
              pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")]
CPU = torch.device("cpu")


def streamed(x: torch.Tensor, fmt: FloatFormat, mode: str, overflow: str = "saturate", seed: int = 0,
             stream: bool = True, threads: int = 2) -> torch.Tensor:
    """The streaming kernel on ``threads`` threads (the quant tests' own default is 1: then no span starts mid-way)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return streaming.quantize_streaming(x, kernel_params(fmt, mode, overflow, CPU),
                                            kernel_variant(fmt, mode, overflow), torch.tensor(seed, dtype=torch.int32),
                                            stream)
    finally:
        torch.set_num_threads(before)


def same_int_bits(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    ai, bi = a.view(torch.int32), b.view(torch.int32)
    bad = (ai != bi).nonzero().flatten()[:5].tolist()
    assert not bad, f"{what}: {int((ai != bi).sum())} mismatches at {bad}: {ai[bad].tolist()} vs {bi[bad].tolist()}"


@pytest.mark.parametrize("mode", ROUNDINGS)
@pytest.mark.parametrize("stream", [True, False], ids=["streaming stores", "ordinary stores"])
def test_every_preset_and_policy_gives_the_eager_kernels_bits(mode: str, stream: bool) -> None:
    for name in list_formats():
        fmt = get_format(name)
        # every bf16 pattern (specials, NaN payloads, subnormals) and values over the format's range; an odd length
        # leaves a partial vector, and the threads' spans start mid-stream (the stochastic counter must follow)
        x = torch.from_numpy(inputs_for(fmt, 20_003, seed=3))
        for overflow in OVERFLOWS:
            same_int_bits(streamed(x, fmt, mode, overflow, seed=77, stream=stream),
                          quantize_eager(x, fmt, mode, overflow, seed=77), f"{name} {mode} {overflow}")


@pytest.mark.parametrize("mode", ["stochastic", "toward_zero"])
def test_the_quantum_at_float32s_smallest_normal(mode: str) -> None:
    """Below the smallest normal the kernel forms k·q with one float multiply-add while q = 2^(emin−M) is a normal
    float32 and by rounding.py's magic number from 2^−127 down: both sides of that edge give the eager bits."""
    for mbits in range(4):  # q = 2^−126 (the smallest normal float32), 2^−127, 2^−128, 2^−129
        fmt = FloatFormat(8, mbits, 127, "ieee")
        x = torch.from_numpy(inputs_for(fmt, 20_003, seed=5))
        for overflow in OVERFLOWS:
            same_int_bits(streamed(x, fmt, mode, overflow, seed=11), quantize_eager(x, fmt, mode, overflow, seed=11),
                          f"{fmt} {mode} {overflow}")


def test_against_ml_dtypes_directly() -> None:
    for fmt, dtype in [(get_format("e4m3"), ml_dtypes.float8_e4m3fn), (get_format("e5m2"), ml_dtypes.float8_e5m2)]:
        x = inputs_for(fmt, 200_000, seed=1)
        ref = np.clip(x, -fmt.max, fmt.max).astype(dtype).astype(np.float32)
        assert_same_bits(streamed(torch.from_numpy(x), fmt, "nearest"), ref, x, f"{fmt.name} vs ml_dtypes")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(formats(), st.sampled_from(ROUNDINGS), st.sampled_from(OVERFLOWS), st.integers(1, 70),
       st.integers(0, 2**31 - 1), st.integers(0, 2**32 - 1))
def test_random_formats_lengths_and_seeds(fmt: FloatFormat, mode: str, overflow: str, n: int, seed: int,
                                          data_seed: int) -> None:
    x = torch.from_numpy(random_inputs(n, fmt.emin - fmt.mbits - 3, fmt.emax + 2, seed=data_seed))
    same_int_bits(streamed(x, fmt, mode, overflow, seed=seed), quantize_eager(x, fmt, mode, overflow, seed=seed),
                  f"{fmt} {mode} {overflow} n={n}")


@pytest.mark.parametrize("threads", [1, 3, 16])
def test_any_thread_count_and_an_unaligned_input(threads: int) -> None:
    fmt = get_format("e5m2")
    x = torch.from_numpy(random_inputs(40_011, -20, 20, seed=5))[3:]  # input 12 bytes past an aligned start
    for mode in ROUNDINGS:
        same_int_bits(streamed(x, fmt, mode, seed=9, threads=threads), quantize_eager(x, fmt, mode, seed=9), mode)


@pytest.fixture
def small_threshold(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """quantize takes the streaming road from 64 elements on, with the compiler on; the calls it makes are recorded."""
    monkeypatch.setattr(streaming, "STREAM_MIN_NUMEL", 64)
    monkeypatch.setenv("ALTGRAD_COMPILE", "1")
    taken: list[torch.Tensor] = []
    real = streaming.quantize_streaming

    def spy(x: torch.Tensor, *args: object) -> torch.Tensor:
        taken.append(x)
        return real(x, *args)

    monkeypatch.setattr(rounding, "quantize_streaming", spy)
    return taken


@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_quantize_takes_it_for_large_plain_tensors_only(small_threshold: list[torch.Tensor]) -> None:
    fmt = get_format("e4m3")
    x = torch.randn(2, 100, requires_grad=True)
    for mode in ROUNDINGS:
        y = quantize(x, fmt, mode, seed=5)
        assert y.shape == x.shape and not y.requires_grad
        same_int_bits(y, quantize_eager(x.detach(), fmt, mode, seed=5), mode)
    assert len(small_threshold) == 3
    assert streaming.takes_streaming(torch.nn.Parameter(torch.randn(64)))
    assert not streaming.takes_streaming(torch.randn(63))  # below the threshold
    assert not streaming.takes_streaming(torch.randn(200, 2).t())  # not contiguous
    assert not streaming.takes_streaming(torch.randn(200, dtype=torch.float64))  # not float32
    assert not streaming.takes_streaming(torch.randn(200, device="meta"))
    quantize_eager(torch.randn(200), fmt)  # the eager reference stays eager
    batch = torch.randn(3, 100)
    same_int_bits(torch.vmap(lambda t: quantize(t, fmt))(batch), quantize_eager(batch, fmt), "vmap")  # no storage
    torch.compile(lambda t: quantize(t, fmt), backend="eager", fullgraph=True)(torch.randn(200))  # traced
    assert len(small_threshold) == 3


def test_the_compile_switch_keeps_it_off(small_threshold: list[torch.Tensor],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALTGRAD_COMPILE", "0")
    quantize(torch.randn(200), get_format("e4m3"))
    assert small_threshold == []


def test_a_failed_build_warns_once_and_quantize_keeps_the_inductor_kernel(
        small_threshold: list[torch.Tensor], monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    broken = tmp_path / "streaming.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(streaming, "_SOURCE", broken)
    monkeypatch.setattr(streaming, "_LIB", [])
    x, fmt = torch.randn(300), get_format("e4m3")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = quantize(x, fmt)
        quantize(x, fmt)
    assert [str(w.message) for w in caught if "streaming.cpp" in str(w.message)] == [
        next(str(w.message) for w in caught if "building streaming.cpp failed" in str(w.message))]
    assert small_threshold == []
    same_int_bits(y, quantize_eager(x, fmt), "fallback")
    with pytest.raises(RuntimeError, match="not available"):
        streamed(x, fmt, "nearest")


def test_bad_arguments_are_named() -> None:
    fmt = get_format("e4m3")
    with pytest.raises(ValueError, match="contiguous float32 CPU tensor"):
        streamed(torch.randn(16, dtype=torch.float64), fmt, "nearest")
    with pytest.raises(ValueError, match="needs a seed"):
        streaming.quantize_streaming(torch.randn(16), kernel_params(fmt, "stochastic", "saturate", CPU),
                                     kernel_variant(fmt, "stochastic", "saturate"), None)

"""The native CPU kernel: bit for bit the eager torch quantizer call (scale, quantize, unscale, statistics, new
scaler state) over formats × roundings × overflows × scalings × seeds, NaN/Inf/−0/subnormals included; and the
fallback to the compiled road where it cannot be built."""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from quant_testlib import assert_same_bits, inputs_for, random_inputs
from test_properties import formats

from altgrad.quant import QuantSpec, ScalingSpec, TensorQuantizer, get_format, list_formats, native, quantize
from altgrad.quant.quantizer_call import quant_call_body
from altgrad.quant.rounding import kernel_params, kernel_variant, quantize_eager, quantize_scaled
from altgrad.quant.scaling import delayed_scale, none_scale, scale_consts, tensor_scale

CPU = torch.device("cpu")
needs_native = pytest.mark.skipif(native.kernel() is None, reason="no C++ compiler here")
SCALE_FNS = {"none": none_scale, "tensor": tensor_scale, "delayed": delayed_scale}


def run_both(x: torch.Tensor, fmt, rounding: str, overflow: str, kind: str, pow2: bool, margin: int, seed: int,
             with_stats: bool, state: tuple[torch.Tensor, ...], reduce: str = "max") -> None:
    """Native call against the eager quant_call_body on the same input and state: y, stats and new state."""
    p = kernel_params(fmt, rounding, overflow, CPU)
    consts = scale_consts(fmt, margin, CPU)
    s = torch.tensor(seed, dtype=torch.int32) if rounding == "stochastic" else None
    variant = kernel_variant(fmt, rounding, overflow)
    ref_y, ref_stats, ref_new = quant_call_body(x, p, consts, s, tuple(t.clone() for t in state), SCALE_FNS[kind],
                                                pow2, reduce, 32, variant, with_stats)
    hist = state[0].clone() if kind == "delayed" else None
    scale = state[-1].clone() if kind != "none" else None
    stats = torch.full((6,), -7.0) if with_stats else None
    y = native.quant_call(native.kernel(), x, p, rounding, native.variant_flags(variant), s, kind, pow2, consts,
                          scale=scale, history=hist, reduce_max=reduce == "max", update=True, stats=stats)
    what = f"{fmt} {rounding} {overflow} {kind} pow2={pow2} margin={margin}"
    assert_same_bits(y.reshape(-1), ref_y.reshape(-1).numpy(), x.reshape(-1).numpy(), what)
    if with_stats:
        assert_same_bits(stats, ref_stats.numpy(), what=what + " stats")
    if kind == "delayed":
        assert_same_bits(hist, ref_new[0].numpy(), what=what + " history")
    if kind != "none":
        assert_same_bits(scale.reshape(1), ref_new[-1].reshape(1).numpy(), what=what + " scale")


def state_for(kind: str, history: list[float] | None = None, prev: float = 1.0) -> tuple[torch.Tensor, ...]:
    prev_t = torch.tensor(prev, dtype=torch.float32)
    if kind == "none":
        return ()
    if kind == "tensor":
        return (prev_t,)
    return torch.tensor(history or [0.0] * 4, dtype=torch.float32), prev_t


@needs_native
@pytest.mark.parametrize("name", list_formats())
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "toward_zero"])
def test_every_preset_mode_and_policy_on_every_bf16_pattern(name: str, rounding: str) -> None:
    fmt = get_format(name)
    x = torch.from_numpy(inputs_for(fmt, 4099))  # n mod 8 = 3: the scalar tail runs as well
    for overflow in ("saturate", "overflow"):
        run_both(x, fmt, rounding, overflow, "none", False, 0, 1234, True, ())
        ref = quantize_eager(x, fmt, rounding, overflow, seed=99)
        assert_same_bits(quantize(x, fmt, rounding, overflow, seed=99), ref.numpy(), x.numpy(), f"{name} quantize")
        each = torch.exp2(torch.randint(-8, 8, x.shape, generator=torch.Generator().manual_seed(1)).float())
        ref = quantize_scaled(x, fmt, each, rounding, overflow, seed=3, compiled=False, scale_pow2=True)
        ours = quantize_scaled(x, fmt, each, rounding, overflow, seed=3, scale_pow2=True)
        assert_same_bits(ours, ref.numpy(), x.numpy(), f"{name} per-element scales")


@needs_native
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(formats(), st.sampled_from(["nearest", "stochastic", "toward_zero"]), st.sampled_from(["saturate", "overflow"]),
       st.sampled_from(["none", "tensor", "delayed"]), st.booleans(), st.integers(-3, 3), st.integers(0, 2**31 - 1),
       st.booleans(), st.integers(1, 300), st.integers(0, 2**32 - 1), st.sampled_from(["max", "most_recent"]),
       st.sampled_from([0.0, 1.0, 3.0e-30, 5.0e30, float("nan"), float("inf")]))
def test_native_call_equals_the_eager_call(fmt, rounding: str, overflow: str, kind: str, pow2: bool, margin: int,
                                           seed: int, with_stats: bool, n: int, data_seed: int, reduce: str,
                                           prev: float) -> None:
    """Random formats and inputs (subnormals, NaN payloads, ±Inf, −0), every scale kind, state and statistic."""
    x = torch.from_numpy(random_inputs(n, fmt.emin - fmt.mbits - 3, fmt.emax + 2, data_seed % 2**31))
    rng = np.random.default_rng(data_seed)
    history = [float(v) for v in rng.choice([0.0, 1e-3, 2.5, 7e20, float("nan")], size=4)]
    run_both(x, fmt, rounding, overflow, kind, pow2, margin, seed, with_stats, state_for(kind, history, prev),
             reduce)


@needs_native
def test_amax_edge_cases_fall_back_to_the_previous_scale() -> None:
    """An input with no finite nonzero value keeps the previous scale; a tiny amax saturates the scale at 2^126."""
    fmt = get_format("e4m3")
    for values in ([0.0, -0.0], [float("nan"), float("inf")], [1e-44, -3e-45], [], [3e38, -float("inf")]):
        x = torch.tensor(values, dtype=torch.float32)
        for kind in ("tensor", "delayed"):
            run_both(x, fmt, "nearest", "saturate", kind, True, 0, 0, True, state_for(kind, prev=0.25))
            run_both(x, fmt, "nearest", "saturate", kind, False, 2, 0, True, state_for(kind, prev=3.0))


@needs_native
def test_a_given_scale_and_a_noncontiguous_input() -> None:
    """quantize_scaled with a 0-dim, per-row or per-element scale (power of two or not) and a transposed input."""
    fmt = get_format("e5m2")
    x = torch.from_numpy(random_inputs(60 * 7, -20, 20, 3)).reshape(60, 7).t()
    per_row = torch.exp2(torch.arange(-3.0, 4.0)).reshape(7, 1)
    per_element = torch.rand(7, 60, generator=torch.Generator().manual_seed(0)) * 40
    for scale, pow2 in ((torch.tensor(2.0**-9), True), (torch.tensor(3.7), False), (per_row, True),
                        (per_element, False), (per_element.abs().log2().floor().exp2(), True)):
        for rounding in ("nearest", "stochastic"):
            ref = quantize_scaled(x, fmt, scale, rounding, seed=5, compiled=False, scale_pow2=pow2)
            ours = quantize_scaled(x, fmt, scale, rounding, seed=5, scale_pow2=pow2)
            assert ours.shape == x.shape
            assert_same_bits(ours.reshape(-1), ref.reshape(-1).numpy(), what=f"scale of shape {tuple(scale.shape)}")


@needs_native
@pytest.mark.parametrize("threads", [2, 3])
def test_threads_split_the_work_without_changing_bits(threads: int) -> None:
    """Several threads (one part of the elements each, cut at a multiple of 16, none under 2^13 elements) give the
    single-threaded bits and statistics: sizes with one part, with parts that do not divide evenly, and with a
    scalar tail."""
    fmt = get_format("e4m3")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for n in (2**13 - 1, 2 * 2**13 + 7, 3 * 2**15 + 5):
            x = torch.from_numpy(random_inputs(n, -12, 10, 7))
            for rounding in ("nearest", "stochastic"):
                run_both(x, fmt, rounding, "saturate", "tensor", True, 0, 42, True, state_for("tensor"))
    finally:
        torch.set_num_threads(before)


@needs_native
def test_a_thread_count_under_one_runs_the_call_on_one_thread() -> None:
    """The library takes any int for its thread count: 0 and −1 give the one-thread output, amax and scale."""
    fmt = get_format("e4m3")
    k = native.kernel()
    n = 3 * 2**15 + 5
    x = torch.from_numpy(random_inputs(n, -12, 10, 7))
    p = kernel_params(fmt, "nearest", "saturate", CPU)
    flags = native.variant_flags(kernel_variant(fmt, "nearest", "saturate"))
    consts = scale_consts(fmt, 0, CPU)
    got = []
    for threads in (1, 0, -1):
        y, scale, stats = torch.empty_like(x), torch.tensor(1.0), torch.zeros(6)
        rc = k.call(x.data_ptr(), y.data_ptr(), n, p.data_ptr(), 0, flags, 0, native.KINDS["tensor"], 1,
                    consts.data_ptr(), scale.data_ptr(), None, 0, 1, 1, stats.data_ptr(), threads, None)
        assert rc == 0
        got.append((y, scale, stats))
    for threads, other in zip((0, -1), got[1:]):
        for ours, ref in zip(other, got[0]):
            _exact(ours, ref, f"threads={threads}")


@pytest.fixture(scope="module")
def eight_lanes(tmp_path_factory: pytest.TempPathFactory) -> native.NativeKernel:
    """The kernel built without AVX-512: its eight-lane road over every element the sixteen-lane road takes here."""
    k = native.kernel()
    if k is None or k.lanes < 16:
        pytest.skip("the kernel built here has no sixteen-lane (AVX-512) road")
    path = tmp_path_factory.mktemp("native") / "quant-eight-lanes.so"
    native._build(shutil.which(native._compiler()), path, (*native.FLAGS, "-mno-avx512f"))
    narrow = native.NativeKernel(path)
    assert narrow.lanes == 8
    return narrow


def _exact(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """The same float32 bit patterns, NaN payloads included."""
    a, b = ours.reshape(-1).view(torch.int32), ref.reshape(-1).view(torch.int32)
    bad = (a != b).nonzero().flatten()
    assert bad.numel() == 0, f"{what}: {bad.numel()} patterns differ, first at {bad[:4].tolist()}"


@needs_native
@pytest.mark.parametrize("name", list_formats())
def test_the_sixteen_lane_road_gives_the_eight_lane_roads_bits(name: str, eight_lanes: native.NativeKernel) -> None:
    """AVX-512 against AVX2, pattern for pattern: every bf16 pattern and random values of the format's range, every
    rounding mode and overflow policy, unscaled, tensor-scaled by a power of two or not (the float64 division),
    with a per-element scale, with the statistics, at one and two threads."""
    fmt = get_format(name)
    x = torch.from_numpy(inputs_for(fmt, 4099, seed=5))
    each = torch.exp2(torch.randint(-8, 8, x.shape, generator=torch.Generator().manual_seed(2)).float())
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for rounding in ("nearest", "stochastic", "toward_zero"):
                for overflow in ("saturate", "overflow"):
                    p = kernel_params(fmt, rounding, overflow, CPU)
                    flags = native.variant_flags(kernel_variant(fmt, rounding, overflow))
                    for kind, pow2, margin in (("none", False, 0), ("tensor", True, 0), ("tensor", False, 2),
                                               ("given", True, 0)):
                        consts = scale_consts(fmt, margin, CPU)
                        got = []
                        for k in (native.kernel(), eight_lanes):
                            scale = each.clone() if kind == "given" else torch.tensor(0.75)
                            stats = None if kind == "given" else torch.full((6,), -7.0)
                            y = native.quant_call(k, x, p, rounding, flags, 977, kind, pow2, consts, scale=scale,
                                                  update=True, stats=stats)
                            got.append((y, stats, scale))
                        what = f"{name} {rounding} {overflow} {kind} pow2={pow2} threads={threads}"
                        for ours, ref in zip(got[0], got[1]):
                            if ours is not None:
                                _exact(ours, ref, what)
    finally:
        torch.set_num_threads(before)


@needs_native
def test_a_quantizer_takes_the_native_road_and_says_so() -> None:
    q = TensorQuantizer(QuantSpec(get_format("e4m3"), scaling=ScalingSpec(kind="tensor")))
    assert q.road == "native" and "road=native" in repr(q)
    q_block = TensorQuantizer(QuantSpec(get_format("e4m3"), scaling=ScalingSpec(kind="block")))
    assert q_block.road != "native"  # per-block scales stay on the torch road


@needs_native
def test_buffers_of_another_dtype_take_the_compiled_road() -> None:
    """After ``.double()`` the kernel cannot write the buffers in place: the call goes the torch way, same values."""
    fmt = get_format("e4m3")
    x = torch.from_numpy(random_inputs(500, -12, 10, 2))
    reference = TensorQuantizer(QuantSpec(fmt, scaling=ScalingSpec(kind="delayed", history=3)))
    q = TensorQuantizer(QuantSpec(fmt, scaling=ScalingSpec(kind="delayed", history=3))).double()
    for _ in range(3):
        assert_same_bits(q(x).detach(), reference(x).detach().numpy(), what="float64 buffers")
    assert q.scaler.amax_history.dtype == torch.float64
    assert torch.equal(q.scaler.amax_history.float(), reference.scaler.amax_history)
    assert torch.equal(q.stats.float(), reference.stats)


@pytest.mark.filterwarnings("default")
def test_a_missing_compiler_warns_once_and_the_compiled_road_serves(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path) -> None:
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no cached build to load either
    monkeypatch.setattr(native, "_KERNEL", [])
    fmt = get_format("e4m3")
    x = torch.from_numpy(random_inputs(999, -12, 10, 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        q = TensorQuantizer(QuantSpec(fmt))
        y1 = q(x)
        y2 = quantize(x, fmt)
    assert native.kernel() is None and q.road != "native"
    assert [str(w.message) for w in caught if "native CPU kernel" in str(w.message)] == [
        next(str(w.message) for w in caught if "no-such-compiler" in str(w.message))]
    assert_same_bits(y2, quantize_eager(x, fmt).numpy(), what="fallback quantize")
    monkeypatch.setattr(native, "_KERNEL", [])  # the real kernel again, for the reference
    monkeypatch.delenv("CXX")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert_same_bits(y1.detach(), TensorQuantizer(QuantSpec(fmt))(x).detach().numpy(), what="fallback quantizer")


@needs_native
def test_flip_sums_equal_the_eager_segment_sums() -> None:
    """The flips diagnostic's per-tensor sums: the eager index_add_ bits (float32, element order), NaN and ±0 too."""
    from altgrad.diagnostics.flip_counts import segment_sums

    gen = torch.Generator().manual_seed(4)
    sizes = torch.tensor([5, 1000, 37, 4096, 3])
    n = int(sizes.sum())
    grid = torch.tensor([-1.0, -0.5, -0.0, 0.0, 0.25, 0.5, 1.0, float("nan")])
    q_before = grid[torch.randint(0, 8, (n,), generator=gen)]
    q_after = grid[torch.randint(0, 8, (n,), generator=gen)]
    intended = torch.randn(n, generator=gen) * (torch.rand(n, generator=gen) > 0.2)
    last = torch.randint(-1, 2, (n,), generator=gen).to(torch.int8)
    segments = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
    ref_sums, ref_last = segment_sums(q_before, q_after, intended, last, segments, len(sizes))
    sums, new_last = native.flip_sums(native.kernel(), q_before, q_after, intended, last,
                                      torch.cat([sizes.new_zeros(1), sizes.cumsum(0)]))
    assert_same_bits(sums.reshape(-1), ref_sums.reshape(-1).numpy(), what="flip sums")
    assert torch.equal(new_last, ref_last)


@needs_native
def test_the_native_gather_is_index_select_and_cat_then_the_difference() -> None:
    """GatherPlan: each tensor's indexed elements (or all of them) end to end, and out − before, exact."""
    gen = torch.Generator().manual_seed(2)
    tensors = [torch.randn(64, 48, generator=gen), torch.randn(7, generator=gen), torch.randn(300, generator=gen)]
    indices = [torch.randperm(64 * 48, generator=gen)[:500].sort().values, None,
               torch.randperm(300, generator=gen)[:299].sort().values]
    plan = native.GatherPlan(tensors, indices)
    ref = torch.cat([t.reshape(-1) if i is None else torch.index_select(t.reshape(-1), 0, i)
                     for t, i in zip(tensors, indices)])
    out, none = plan(native.kernel())
    assert none is None and torch.equal(out, ref)
    before = torch.randn(ref.numel(), generator=gen)
    tensors[0].mul_(3.0)  # written in place: the plan reads the storage as it is now
    ref = torch.cat([t.reshape(-1) if i is None else torch.index_select(t.reshape(-1), 0, i)
                     for t, i in zip(tensors, indices)])
    out, diff = plan(native.kernel(), before)
    assert torch.equal(out, ref)
    assert_same_bits(diff, (ref - before).numpy(), what="gathered − before")
    with pytest.raises(ValueError, match="contiguous float32 CPU tensor of 806 elements"):
        plan(native.kernel(), before[:-1])  # never read past a too short ``before``


@needs_native
@pytest.mark.parametrize("name", ["e0m7", "e1m6", "e3m4", "e4m3", "e5m2", "e7m0", "p3109_p1", "fp16"])
def test_the_native_bits_pass_is_code_index_and_log2_stiffness(name: str) -> None:
    """The bits diagnostic's pass: torch's code indices and log2 stiffness bit for bit, with power-of-two scales per
    element (tensor and channel scaling), weights across the whole float32 range, ±0, subnormals, ±inf and NaN."""
    from altgrad.diagnostics import code_index, log2_stiffness
    from altgrad.diagnostics.flip_counts import top_rank
    from altgrad.quant import get_format, quantize

    fmt = get_format(name)
    gen = torch.Generator().manual_seed(len(name))
    n = 20_003
    w = torch.randn(n, generator=gen) * torch.exp2(torch.randint(-40, 20, (n,), generator=gen).float())
    w[::97] = w[::97] * 2.0**-120  # float32 subnormals among them
    for i, value in enumerate((0.0, -0.0, float("inf"), float("-inf"), float("nan"), 2.0**-149, 3.0e38)):
        w[i::1009] = value
    s = torch.exp2(torch.randint(-20, 21, (n,), generator=gen).float())  # one power of two per weight
    q = quantize(w * s, fmt, overflow="saturate")
    idx, log2s = native.bits_pass(native.kernel(), w, s, q, fmt, top_rank(fmt))
    ref_idx = code_index(q, fmt)
    finite = torch.isfinite(q)
    assert idx.dtype == ref_idx.dtype == torch.int32
    assert torch.equal(idx[finite], ref_idx[finite])
    assert torch.equal(idx[~finite], ref_idx[~finite])  # the "undefined" index of NaN is torch's, too
    assert_same_bits(log2s, log2_stiffness(w, fmt, s).numpy(), what=f"{name} log2 stiffness")


# --- the enum table both sides are built from, and the quant.kernel choice -------------------------------------
def test_the_enum_table_is_the_one_both_sides_use() -> None:
    """kernel_abi is the only statement of the enums: the torch kernels take them from it, and the C++ source
    declares none of its own (native.py generates kernel_abi.h from the table)."""
    from altgrad.quant import kernel_abi, rounding, stats
    from altgrad.quant.fake_quant import NATIVE_KINDS

    assert rounding.ROUNDINGS is kernel_abi.ROUNDINGS and stats.STAT_NAMES is kernel_abi.STAT_NAMES
    assert {n: getattr(rounding, f"_P_{n.upper()}") for n in kernel_abi.PARAMS} == {
        n: i for i, n in enumerate(kernel_abi.PARAMS)}
    assert len(rounding._params(get_format("e4m3"), "nearest", "saturate")) == len(kernel_abi.PARAMS)
    assert set(rounding.Variant._fields) - {"rounding"} == set(kernel_abi.VARIANT_FLAGS)
    assert native.ROUNDING_CODES == {"nearest": 0, "stochastic": 1, "toward_zero": 2}
    assert native.VARIANT_FLAGS == {name: 1 << i for i, name in enumerate(kernel_abi.VARIANT_FLAGS)}
    assert set(NATIVE_KINDS) < set(native.KINDS) == set(kernel_abi.SCALE_KINDS)
    source = native.SOURCE.read_text()
    assert '#include "kernel_abi.h"' in source and "enum {" not in source
    header = kernel_abi.header()
    for used in ("P_SHIFT", "P_CSHIFT", "NEAREST", "STOCHASTIC", "TOWARD_ZERO", "BIT_ROUND", "TIE_FLIP",
                 "ZERO_SIGN", "SATURATES", "WIDE_QUANTUM", "KIND_NONE", "KIND_GIVEN", "S_FRAC_SATURATED", "S_AMAX",
                 "S_SCALE"):
        assert used in source and f"{used} = " in header, used
    assert "BIT_ROUND = 1, TIE_FLIP = 2, ZERO_SIGN = 4, SATURATES = 8, WIDE_QUANTUM = 16" in header


@needs_native
def test_the_built_kernel_reports_the_table_and_a_stale_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from altgrad.quant import kernel_abi

    k = native.kernel()
    assert k.abi == kernel_abi.describe()
    monkeypatch.setattr(kernel_abi, "STAT_NAMES", kernel_abi.STAT_NAMES[::-1])
    with pytest.raises(RuntimeError, match="another enum table"):
        native.NativeKernel(k.path)


@needs_native
@pytest.mark.parametrize(("kind", "rounding"), [("tensor", "nearest"), ("delayed", "stochastic"),
                                                ("none", "toward_zero")])
def test_every_kernel_choice_gives_the_same_bits_state_and_stats(kind: str, rounding: str) -> None:
    """quant.kernel=native / eager / auto: one quantizer's outputs, statistics and scaler state over several calls."""
    fmt = get_format("e4m3")
    spec = QuantSpec(fmt, rounding=rounding, scaling=ScalingSpec(kind=kind, history=3))
    quantizers = {k: TensorQuantizer(spec, kernel=k) for k in ("native", "eager", "auto")}
    assert {k: q.road for k, q in quantizers.items()} == {"native": "native", "eager": "eager", "auto": "native"}
    for step in range(3):
        x = torch.from_numpy(random_inputs(3000, -12, 10, step)).reshape(30, 100)
        torch.manual_seed(step)
        ref = quantizers["eager"](x).detach()
        for k in ("native", "auto"):
            torch.manual_seed(step)  # the same stochastic seed draw
            assert_same_bits(quantizers[k](x).detach().reshape(-1), ref.reshape(-1).numpy(), what=f"{k} step {step}")
            for a, b in zip(quantizers[k].buffers(), quantizers["eager"].buffers()):
                assert_same_bits(a.reshape(-1), b.reshape(-1).numpy(), what=f"{k} buffers step {step}")


def test_a_kernel_choice_that_cannot_serve_fails_in_one_line() -> None:
    fmt = get_format("e4m3")
    block = QuantSpec(fmt, scaling=ScalingSpec(kind="block"))
    with pytest.raises(ValueError, match="quant.kernel=native does not serve scaling.kind='block'"):
        TensorQuantizer(block, kernel="native")
    with pytest.raises(ValueError, match="quant.kernel='fast' is not valid; valid: auto, native, compiled, eager"):
        TensorQuantizer(QuantSpec(fmt), kernel="fast")
    assert TensorQuantizer(block, kernel="auto").road == "compiled"
    if native.kernel() is not None:
        q = TensorQuantizer(QuantSpec(fmt), kernel="native")
        with pytest.raises(ValueError, match="takes float32 CPU tensors only, not a torch.bfloat16 tensor"):
            q(torch.ones(4, dtype=torch.bfloat16))
        with pytest.raises(ValueError, match="runs on the CPU only"):
            q.use_kernel("native", "cuda")
        assert q.use_kernel("auto", "cuda") == "compiled"


@needs_native
def test_a_quantizer_resolves_its_call_once_and_again_when_its_buffers_change() -> None:
    """The native call plan points into the quantizer's own buffers: a deep copy or a new spec gets a plan of its
    own, a switch of track_stats is written into the same plan, and the results stay the eager road's."""
    import copy

    fmt = get_format("e4m3")
    spec = QuantSpec(fmt, scaling=ScalingSpec(kind="delayed", history=3))
    q, ref = TensorQuantizer(spec), TensorQuantizer(spec, kernel="eager")
    x = torch.from_numpy(random_inputs(4000, -12, 10, 3))
    q(x), ref(x)
    plan = q.native_plan()
    assert plan is not None and q.native_plan() is plan
    c = copy.deepcopy(q)
    before = [b.clone() for b in q.buffers()]
    c(x * 64)
    assert c.native_plan() is not plan
    assert all(torch.equal(a, b) for a, b in zip(q.buffers(), before))  # the copy wrote its own buffers
    assert not torch.equal(c.scaler.amax_history, q.scaler.amax_history)
    q.track_stats = ref.track_stats = False
    assert q.native_plan() is plan
    stats = q.stats.clone()
    for t in (x * 3, x / 5):
        assert_same_bits(q(t).detach(), ref(t).detach().numpy(), what="after a switch")
    assert all(torch.equal(a, b) for a, b in zip(q.buffers(), ref.buffers())) and torch.equal(q.stats, stats)
    q.track_stats = ref.track_stats = True
    assert q.native_plan() is plan
    q(x * 7), ref(x * 7)
    assert all(torch.equal(a, b) for a, b in zip(q.buffers(), ref.buffers())) and not torch.equal(q.stats, stats)
    q.spec = QuantSpec(get_format("e5m2"), scaling=spec.scaling)
    assert q.native_plan() is not plan


@needs_native
@pytest.mark.parametrize(("kind", "pow2", "rounding"), [("tensor", True, "nearest"), ("tensor", False, "stochastic"),
                                                        ("delayed", True, "stochastic"), ("none", True, "nearest")])
def test_storage_rounding_in_one_native_call_equals_the_eager_road(kind: str, pow2: bool, rounding: str) -> None:
    """project_ (quant.master=none) on the native road: the forward's scale, not updated, and the rounding at once."""
    fmt = get_format("e5m2")
    spec = QuantSpec(fmt, scaling=ScalingSpec(kind=kind, pow2=pow2, history=3, margin=1))
    native_q, eager_q = TensorQuantizer(spec), TensorQuantizer(spec, kernel="eager")
    for step in range(3):
        x = torch.from_numpy(random_inputs(2000, -14, 14, 20 + step)).reshape(20, 100)
        native_q(x), eager_q(x)  # a forward: the scaler state the projection reads
        w = torch.from_numpy(random_inputs(2000, -10, 10, 40 + step)).reshape(40, 50)
        a, b = native_q.project_(w.clone(), rounding, seed=step), eager_q.project_(w.clone(), rounding, seed=step)
        assert_same_bits(a.reshape(-1), b.reshape(-1).numpy(), what=f"{kind} pow2={pow2} {rounding} step {step}")
        assert all(torch.equal(p, q) for p, q in zip(native_q.buffers(), eager_q.buffers()))


@needs_native
@pytest.mark.parametrize("plans", ["extension", "ctypes"])
def test_storage_rounding_writes_the_weight_in_place_as_an_in_place_op_would(plans: str, monkeypatch) -> None:
    """project_'s native call writes the weight's own storage and moves its version counter (FlipCallback reads
    the counter to see the storage policy's write), on the extension's Plan and on ctypes' CallPlan alike; a seedless
    stochastic projection takes one draw of torch's RNG on either road; a transposed (non-contiguous) weight goes the
    eager road with the same bits; the plan is resolved again once the scaler's buffers are replaced."""
    if plans == "ctypes":
        monkeypatch.setattr(native, "_LINEAR", [None, "switched off by the test"])
    elif native.linear_ext() is None:
        pytest.skip("the native Linear extension is not built here")
    spec = QuantSpec(get_format("e5m2"), scaling=ScalingSpec(kind="tensor", pow2=True))
    native_q, eager_q = TensorQuantizer(spec), TensorQuantizer(spec, kernel="eager")
    x = torch.from_numpy(random_inputs(3000, -14, 14, 5)).reshape(30, 100)
    native_q(x), eager_q(x)
    w = torch.nn.Parameter(torch.from_numpy(random_inputs(3000, -10, 10, 6)).reshape(60, 50))
    ref = w.detach().clone()
    ptr, version = w.data_ptr(), w._version
    plan = native_q.storage_plan("nearest")
    assert type(plan).__name__ == ("CallPlan" if plans == "ctypes" else "Plan")
    assert native_q.project_(w, "nearest") is w and w.data_ptr() == ptr and w._version > version
    assert_same_bits(w.detach().reshape(-1), eager_q.project_(ref, "nearest").reshape(-1).numpy(), what="in place")
    assert native_q.storage_plan("nearest") is plan
    for seeded in (3, None):  # the RNG: one draw on either road, the same seed from it
        w2, ref2 = w.detach().clone() * 1.37, w.detach().clone() * 1.37
        torch.manual_seed(11)
        native_q.project_(w2, "stochastic", seed=seeded)
        after_native = torch.randint(0, 1 << 30, (4,))
        torch.manual_seed(11)
        eager_q.project_(ref2, "stochastic", seed=seeded)
        assert torch.equal(after_native, torch.randint(0, 1 << 30, (4,)))
        assert_same_bits(w2.reshape(-1), ref2.reshape(-1).numpy(), what=f"stochastic, seed {seeded}")
    wt, reft = (w.detach().clone() * 0.61).t(), (w.detach().clone() * 0.61).t()
    assert not wt.is_contiguous()
    native_q.project_(wt, "nearest"), eager_q.project_(reft, "nearest")
    assert_same_bits(wt.contiguous().reshape(-1), reft.contiguous().reshape(-1).numpy(), what="non-contiguous")
    native_q.double()  # new buffers (float64): no native plan for them, the eager road's bits
    assert native_q.storage_plan("nearest") is None
    eager_q.double()
    w3, ref3 = w.detach().clone() * 3.1, w.detach().clone() * 3.1
    assert_same_bits(native_q.project_(w3).reshape(-1), eager_q.project_(ref3).reshape(-1).numpy(), what=".double()")


@pytest.mark.slow
@needs_native
def test_flip_counts_past_two_to_the_24_are_the_float32_sums() -> None:
    """A tensor tracked whole can hold more than 2^24 weights; the native kernel counts in integers and gives the
    float32 sum of that many ones in order (it stops at 2^24), as the eager index_add_ does."""
    from altgrad.diagnostics.flip_counts import segment_sums

    n = (1 << 24) + 5
    q_before = torch.zeros(n)
    q_after = torch.ones(n)                        # every weight flips, upwards
    intended = torch.ones(n)
    last = torch.full((n,), -1, dtype=torch.int8)  # ... against its last flip: every flip reverses
    segments = torch.zeros(n, dtype=torch.int64)
    ref_sums, ref_last = segment_sums(q_before, q_after, intended, last, segments, 1)
    sums, new_last = native.flip_sums(native.kernel(), q_before, q_after, intended, last, torch.tensor([0, n]))
    assert ref_sums[0, :3].tolist() == [float(1 << 24)] * 3   # the float32 sums stop at 2^24
    assert_same_bits(sums.reshape(-1), ref_sums.reshape(-1).numpy(), what="flip sums past 2^24")
    assert torch.equal(new_last, ref_last)

"""The pure metric maths on tensors whose answers are known by construction."""

from __future__ import annotations

import math

import pytest
import torch

from altgrad.diagnostics import (
    DivergenceDetector,
    attention_entropy,
    attention_probs,
    clip_to_range_,
    code_histogram,
    code_index,
    cosine,
    effective_rank,
    ema_debiased,
    ema_update,
    entropy_bits,
    flip_counts,
    flip_step,
    grid_index,
    grid_midpoints,
    index_dtype,
    kurtosis,
    log2_stiffness,
    pearson,
    range_limit,
    range_use,
    snr_db,
    stable_rank,
    segment_flip_counts,
    stall_ratio,
)
from altgrad.quant import get_format


# -- flips, stalls, oscillations ---------------------------------------------------------------------------------
def test_grid_index_is_the_nearest_value_and_saturates():
    grid = torch.tensor([-2.0, -1.0, 0.0, 0.5, 1.0, 2.0])
    mid = grid_midpoints(grid)
    x = torch.tensor([-9.0, -1.2, -0.1, 0.3, 0.7, 1.9, 50.0])
    idx = grid_index(x, mid, torch.uint8)
    assert idx.dtype == torch.uint8
    assert idx.tolist() == [0, 1, 2, 3, 3, 5, 5]
    assert torch.equal(grid[idx.long()], torch.tensor([-2.0, -1.0, 0.0, 0.5, 0.5, 2.0, 2.0]))


def test_grid_index_matches_the_format_encoder_on_e4m3():
    fmt = get_format("e4m3")
    grid = fmt.values()
    x = torch.randn(4096) * 30
    idx = grid_index(x, grid_midpoints(grid), index_dtype(grid.numel()))
    from altgrad.quant import quantize

    assert torch.equal(grid[idx.long()], quantize(x, fmt))


def test_index_dtype_fits_the_grid():
    assert index_dtype(253) == torch.uint8
    assert index_dtype(256) == torch.uint8
    assert index_dtype(257) == torch.int16
    assert index_dtype(get_format("bf16").values().numel()) == torch.int32


def test_an_update_that_flips_exactly_these_codes():
    grid = torch.arange(-8, 9, dtype=torch.float32)  # a unit grid
    mid = grid_midpoints(grid)
    w = torch.tensor([0.0, 1.0, 2.0, 3.0, -1.0, 4.0])
    intended = torch.tensor([0.7, 0.2, -0.6, 0.0, -0.45, 1.4])  # flips at 0, 2, 5; stalls at 1, 4; no update at 3
    q_before = grid[grid_index(w, mid).long()]
    q_after = grid[grid_index(w + intended, mid).long()]
    step, last = flip_step(q_before, q_after, intended, torch.zeros(6, dtype=torch.int8))
    assert step.flips.item() == 3
    assert step.updated.item() == 5
    assert step.reversals.item() == 0
    assert last.dtype == torch.int8 and last.tolist() == [1, 0, -1, 0, 0, 1]
    assert stall_ratio(step.flips.item(), step.updated.item()) == pytest.approx(1 - 3 / 5)
    applied = q_after - q_before
    assert applied.tolist() == [1, 0, -1, 0, 0, 1]
    expected_cos = float(torch.dot(intended, applied) / (intended.norm() * applied.norm()))
    assert step.descent_cos.item() == pytest.approx(expected_cos)


def test_signed_zeros_are_one_value():
    step, _ = flip_step(torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]), torch.tensor([-1e-9, 0.0]),
                        torch.zeros(2, dtype=torch.int8))
    assert step.flips.item() == 0 and step.updated.item() == 1


def test_an_oscillating_sequence_reverses_every_flip():
    seq = [1.0, 2.0, 1.0, 2.0, 1.0]  # weight 0 oscillates between two grid values; weight 1 walks up
    walk = [0.0, 1.0, 2.0, 3.0, 3.0]
    last = torch.zeros(2, dtype=torch.int8)
    reversals, flips = [], []
    for t in range(len(seq) - 1):
        b = torch.tensor([seq[t], walk[t]])
        a = torch.tensor([seq[t + 1], walk[t + 1]])
        step, last = flip_step(b, a, a - b, last)
        reversals.append(step.reversals.item())
        flips.append(step.flips.item())
    assert flips == [2, 2, 2, 1]
    assert reversals == [0, 1, 1, 1]  # the first flip has nothing to reverse; the walker never reverses


def test_stall_ratio_without_updates_is_nan():
    assert math.isnan(stall_ratio(0, 0))
    assert stall_ratio(4, 4) == 0.0


def test_debiased_ema_of_a_constant_is_that_constant():
    ema = torch.tensor(0.0)
    for _ in range(7):
        ema = ema_update(ema, torch.tensor(0.25), 0.01)
    assert ema_debiased(ema.item(), 0.01, 7) == pytest.approx(0.25)
    assert math.isnan(ema_debiased(0.0, 0.01, 0))
    with pytest.raises(ValueError, match="momentum"):
        ema_debiased(0.0, 0.0, 3)


# -- format utilization ------------------------------------------------------------------------------------------
def test_entropy_of_uniform_codes_is_log2_of_their_number():
    idx = torch.arange(256).repeat(3)
    counts = code_histogram(idx, 256)
    assert counts.tolist() == [3] * 256
    assert entropy_bits(counts).item() == pytest.approx(8.0)
    assert entropy_bits(code_histogram(torch.tensor([5, 5, 5]), 256)).item() == pytest.approx(0.0)
    two = code_histogram(torch.tensor([1, 2, 1, 2]), 8)
    assert entropy_bits(two).item() == pytest.approx(1.0)


def test_stiffness_is_the_ulp_on_the_scaled_grid():
    fmt = get_format("e4m3")  # M = 3: ulp(x) = 2^(floor(log2|x|) - 3) for normals
    w = torch.tensor([1.0, 3.0, 0.25])
    scale = torch.tensor(4.0)  # w·s = 4, 12, 1 → ulp 0.5, 1, 0.125; divided by s
    assert log2_stiffness(w, fmt, scale).tolist() == pytest.approx([-3.0, -2.0, -5.0])


def test_pearson_correlation():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert pearson(a, 2 * a + 1).item() == pytest.approx(1.0)
    assert pearson(a, -a).item() == pytest.approx(-1.0)
    assert pearson(torch.tensor([1.0, -1.0, 1.0, -1.0]), torch.tensor([1.0, 1.0, -1.0, -1.0])).item() == 0.0


# -- range use and clipping ----------------------------------------------------------------------------------------
def test_range_use_counts_octaves():
    fmt = get_format("e4m3")  # 448 / 2^-9 → log2 = log2(448) + 9
    x = torch.tensor([0.0, 1.0, -2.0, 8.0, float("nan")])  # 1 … 8: three octaves
    assert range_use(x, fmt).item() == pytest.approx(3.0 / (math.log2(448) + 9))
    assert range_use(torch.zeros(4), fmt).item() == 0.0


def _range_use_by_masks(x: torch.Tensor, octaves_of_format: float) -> torch.Tensor:
    """The definition with explicit masks (float32 throughout, as range_use computes it)."""
    a = x.detach().float().abs().reshape(-1)
    a = torch.where(torch.isfinite(a), a, torch.zeros_like(a))
    amax = a.max()
    amin = torch.where(a > 0, a, torch.full_like(a, float("inf"))).min()
    return torch.where(amax > 0, torch.log2(amax / amin), torch.zeros_like(amax)) / octaves_of_format


@pytest.mark.parametrize("seed", range(20))
def test_range_use_matches_its_definition(seed):
    """Bit for bit the masked definition, and within float32 rounding of log2(max |x| / min nonzero |x|) over the
    finite elements in float64; with infinities, NaNs, zeros and bf16 inputs among them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(257, generator=g) * torch.exp2(torch.randint(-30, 30, (257,), generator=g).float())
    picks = torch.randint(0, 257, (12,), generator=g)
    x[picks[:3]], x[picks[3:6]], x[picks[6:9]], x[picks[9:]] = 0.0, float("inf"), float("-inf"), float("nan")
    fmt = get_format(("e4m3", "e5m2", "e3m4", "e7m0")[seed % 4])
    octaves_of_format = math.log2(fmt.max / fmt.min_subnormal)
    for t in (x, x.bfloat16(), x[picks[:3]], torch.full((3,), float("nan")), x[:256], x[1:]):
        got = range_use(t, fmt)  # float32 on the CPU: the native pass where the kernel is built
        assert got.dtype == torch.float32 and got.shape == ()
        assert got.item() == _range_use_by_masks(t, octaves_of_format).item()
        assert got.item() == range_use(t, fmt, kernel="eager").item()  # torch's ops
        a = [abs(v) for v in t.float().tolist() if math.isfinite(v)]
        nonzero = [v for v in a if v > 0]
        want = (math.log2(max(a) / min(nonzero)) if nonzero else 0.0) / octaves_of_format
        assert got.item() == pytest.approx(want, rel=1e-6, abs=1e-7)


def test_the_native_range_ends_are_torchs_max_and_masked_min():
    """The one-pass ends (eight lanes and the tail) against torch's reductions: subnormals, −0, ±inf and NaN in
    every lane position, and the empty cases (no nonzero: +inf; nothing finite: 0)."""
    from altgrad.quant import native

    k = native.kernel()
    if k is None:
        pytest.skip("the native kernel is not built here")
    g = torch.Generator().manual_seed(5)
    for n in (1, 7, 8, 9, 64, 1003):
        x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-140, 120, (n,), generator=g).float())
        for value in (-0.0, float("inf"), float("-inf"), float("nan"), 2.0**-149):
            x[torch.randint(0, n, (max(1, n // 7),), generator=g)] = value
        a = torch.nan_to_num(x.abs(), nan=0.0, posinf=0.0)
        want = torch.stack([a.max(), a.masked_fill(a == 0, float("inf")).min()])
        assert torch.equal(native.magnitude_range(k, x), want), n
    assert native.magnitude_range(k, torch.tensor([0.0, -0.0, float("nan")])).tolist() == [0.0, float("inf")]
    assert native.magnitude_range(k, torch.full((11,), float("-inf"))).tolist() == [0.0, float("inf")]


def test_range_clip_clips_exactly_the_values_outside():
    g = torch.tensor([0.5, -3.0, 2.0, 7.0, -0.1])
    n = clip_to_range_(g, 2.0)
    assert n.item() == 2
    assert g.tolist() == pytest.approx([0.5, -2.0, 2.0, 2.0, -0.1])
    assert range_limit(448.0, torch.tensor(4.0), 2).item() == pytest.approx(448 / 4 / 4)
    assert range_limit(448.0, torch.tensor(0.0), 0).item() == pytest.approx(448.0)


# -- rank ----------------------------------------------------------------------------------------------------------
def test_rank_of_a_matrix_of_known_rank():
    torch.manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(32, 32))
    v, _ = torch.linalg.qr(torch.randn(16, 16))
    s = torch.zeros(32, 16)
    s[0, 0], s[1, 1], s[2, 2] = 2.0, 2.0, 2.0  # rank 3, equal singular values
    w = u @ s @ v.T
    assert stable_rank(w).item() == pytest.approx(3.0, rel=1e-4)
    assert effective_rank(w).item() == pytest.approx(3.0, rel=1e-4)
    s[0, 0] = 4.0  # σ = 4, 2, 2: ‖W‖²_F / σ²_max = 24 / 16
    w = u @ s @ v.T
    assert stable_rank(w).item() == pytest.approx(1.5, rel=1e-4)
    p = torch.tensor([0.5, 0.25, 0.25])
    assert effective_rank(w).item() == pytest.approx(math.exp(-(p * p.log()).sum().item()), rel=1e-4)
    assert stable_rank(torch.zeros(3, 3)).item() == 0.0
    with pytest.raises(ValueError, match="matrix"):
        stable_rank(torch.ones(3))


# -- activations ---------------------------------------------------------------------------------------------------
def test_kurtosis_of_known_distributions():
    assert kurtosis(torch.tensor([-1.0, 1.0] * 50)).item() == pytest.approx(1.0)  # two-point: minimal
    torch.manual_seed(0)
    assert kurtosis(torch.randn(200_000)).item() == pytest.approx(3.0, abs=0.05)
    spike = torch.zeros(1000)
    spike[0] = 1.0  # one outlier in n: kurtosis ≈ n
    assert kurtosis(spike).item() == pytest.approx(998.0, rel=1e-3)


# -- attention -----------------------------------------------------------------------------------------------------
def test_uniform_attention_has_entropy_log_t():
    b, h, t = 2, 3, 10
    uniform = torch.full((b, h, t, t), 1.0 / t)
    assert attention_entropy(uniform).tolist() == pytest.approx([math.log(t)] * h)
    one_hot = torch.eye(t).expand(b, h, t, t)
    assert attention_entropy(one_hot).tolist() == pytest.approx([0.0] * h)


def test_attention_probs_from_fused_qkv_with_zero_queries_are_uniform_over_the_causal_window():
    b, t, c, n_head = 1, 6, 8, 2
    qkv = torch.randn(b, t, 3 * c)
    qkv[..., :c] = 0.0  # q = 0 → every score equal → uniform over the keys each query may see
    probs = attention_probs(qkv, n_head)
    assert probs.shape == (b, n_head, t, t)
    expected = torch.tril(torch.ones(t, t)) / torch.arange(1, t + 1).unsqueeze(1)
    assert torch.allclose(probs[0, 1], expected)
    ent = attention_entropy(probs)
    mean_log = sum(math.log(i) for i in range(1, t + 1)) / t
    assert ent.tolist() == pytest.approx([mean_log] * n_head, rel=1e-5)
    noncausal = attention_probs(qkv, n_head, causal=False)
    assert attention_entropy(noncausal).tolist() == pytest.approx([math.log(t)] * n_head, rel=1e-5)
    with pytest.raises(ValueError, match="n_head"):
        attention_probs(torch.randn(1, 4, 10), n_head=3)


def test_attention_probs_match_sdpa():
    torch.manual_seed(0)
    b, t, c, n_head = 2, 5, 8, 2
    qkv = torch.randn(b, t, 3 * c)
    q, k, v = (x.view(b, t, n_head, c // n_head).transpose(1, 2) for x in qkv.split(c, dim=2))
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(attention_probs(qkv, n_head) @ v, y, atol=1e-6)


# -- gradient fidelity ---------------------------------------------------------------------------------------------
def test_cosine_and_snr_of_identical_tensors():
    g = torch.randn(7, 5)
    assert cosine(g, g.clone()).item() == pytest.approx(1.0)
    assert snr_db(g, g.clone()).item() == math.inf


def test_cosine_and_snr_of_a_constructed_case():
    ref = torch.tensor([3.0, 4.0, 0.0])  # ‖ref‖² = 25
    noisy = ref + torch.tensor([0.0, 0.0, 0.5])  # noise power 0.25 → SNR 100 → 20 dB
    assert snr_db(ref, noisy).item() == pytest.approx(20.0)
    assert cosine(ref, noisy).item() == pytest.approx(5.0 / math.sqrt(25.25))
    assert cosine(ref, -ref).item() == pytest.approx(-1.0)
    assert cosine(torch.zeros(3), torch.zeros(3)).item() == 1.0
    assert cosine(torch.zeros(3), ref).item() == 0.0
    assert snr_db(torch.zeros(3), ref).item() == -math.inf


# -- divergence ----------------------------------------------------------------------------------------------------
def test_divergence_on_non_finite_loss():
    d = DivergenceDetector(factor=3.0, patience=5)
    assert d.update(4.0) is None
    assert "non-finite" in d.update(float("nan"))
    assert d.diverged and d.update(1.0) is not None  # stays diverged


def test_divergence_needs_patience_consecutive_steps_above_k_times_min():
    d = DivergenceDetector(factor=2.0, patience=3)
    for loss in [5.0, 4.0, 3.0]:
        assert d.update(loss) is None
    assert d.update(7.0) is None and d.update(7.0) is None  # two suspect steps
    assert d.update(5.0) is None  # back below 2 × 3: healthy again
    assert d.update(6.5) is None and d.update(6.5) is None
    reason = d.update(6.5)
    assert reason is not None and "running min 3" in reason and "3 steps" in reason
    restored = DivergenceDetector(2.0, 3)
    restored.load_state_dict(d.state_dict())
    assert restored.diverged and restored.running_min == 3.0


def test_divergence_rejects_bad_settings():
    with pytest.raises(ValueError, match="factor"):
        DivergenceDetector(factor=1.0)
    with pytest.raises(ValueError, match="patience"):
        DivergenceDetector(patience=0)


@pytest.mark.parametrize("name", ["e0m7", "e1m6", "e3m4", "e4m3", "e5m2", "e7m0", "p3109_p1", "p3109_p4",
                                  "p3109_p7", "fp16", "bf16"])
def test_code_index_is_the_position_in_the_sorted_values(name):
    fmt = get_format(name)
    values = fmt.values()
    assert torch.equal(code_index(values, fmt).long(), torch.arange(values.numel()))
    from altgrad.quant import quantize

    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * float(values.max()) / 4
    q = quantize(x, fmt)
    assert torch.equal(code_index(q, fmt).long(), torch.searchsorted(values, q))


def test_segmented_counts_equal_per_tensor_counts():
    torch.manual_seed(0)
    grid = torch.arange(-8, 9, dtype=torch.float32)
    mid = grid_midpoints(grid)
    parts = []
    for n in (5, 9, 3):
        w = torch.randn(n) * 3
        intended = torch.randn(n) * torch.tensor([0.0, 1.0]).repeat(n)[:n]
        last = torch.randint(-1, 2, (n,), dtype=torch.int8)
        q_b = grid[grid_index(w, mid).long()]
        q_a = grid[grid_index(w + intended, mid).long()]
        parts.append((q_b, q_a, intended, last))
    segments = torch.cat([torch.full((p[0].numel(),), i) for i, p in enumerate(parts)])
    counts, last = segment_flip_counts(*(torch.cat([p[k] for p in parts]) for k in range(4)), segments, len(parts))
    for i, part in enumerate(parts):
        expected, expected_last = flip_counts(*part)
        assert counts[i].tolist() == pytest.approx(expected.tolist(), abs=1e-6)
        assert torch.equal(last[segments == i], expected_last)


@pytest.mark.parametrize("seed", range(10))
def test_range_uses_are_each_tensors_range_use(seed):
    """Many tensors at once (the stability instrument's logging step): each value bit for bit the one range_use gives
    alone, with zeros, infinities, NaN, an all-zero and a one-value tensor, in one format and in two interleaved."""
    from altgrad.diagnostics.range_use import range_uses

    g = torch.Generator().manual_seed(seed)
    xs = []
    for n in (257, 40, 1, 3, 1000, 17, 64):
        x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-40, 40, (n,), generator=g).float())
        if n > 20:
            x[torch.randint(0, n, (6,), generator=g)] = torch.tensor([0.0, 0.0, float("inf"), float("-inf"),
                                                                        float("nan"), 0.0])
        xs.append(x)
    xs += [torch.zeros(5), torch.full((4,), 3.0)]
    one = get_format(("e4m3", "e5m2", "e3m4", "e7m0")[seed % 4])
    for fmts in ([one] * len(xs), [get_format("e4m3") if i % 2 else get_format("e5m2") for i in range(len(xs))]):
        for kernel in ("auto", "eager"):
            got = range_uses(xs, fmts, [kernel] * len(xs))
            assert got.dtype == torch.float32 and got.shape == (len(xs),)
            alone = torch.stack([range_use(x, f, kernel) for x, f in zip(xs, fmts)])
            assert torch.equal(got.view(torch.int32), alone.view(torch.int32))

"""Each instrument on a constructed layer whose answer is known (hooks called in Lightning's order)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from altgrad.callbacks.attention import AttentionCallback
from altgrad.callbacks.activations import ActivationCallback
from altgrad.callbacks.bits import BitsCallback
from altgrad.callbacks.fallback import FallbackCallback
from altgrad.callbacks import flips
from altgrad.callbacks.flips import FlipCallback
from altgrad.callbacks.range_clip import RangeClipCallback
from altgrad.callbacks.rank import RankCallback
from altgrad.callbacks.stability import StabilityCallback
from altgrad.diagnostics import ema_debiased, ema_update
from altgrad.diagnostics.flip_counts import counts_from_sums
from altgrad.quant import QuantSpec, ScalingSpec, get_format, native, quantize
from altgrad.quant.layers import QuantLinear

from diag_helpers import RecordingLogger, fake_trainer, tiny_gpt


def unscaled(name: str) -> QuantSpec:
    return QuantSpec(get_format(name), scaling=ScalingSpec(kind="none"))


class Holder(nn.Module):
    """A stand-in LightningModule: ``model`` is the backbone, ``run_summary`` the summary dict."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.run_summary: dict = {}


def one_layer(weight: QuantSpec | None, input: QuantSpec | None = None, grad: QuantSpec | None = None,  # noqa: A002
              shape=(4, 8)) -> tuple[Holder, QuantLinear]:
    root = nn.Module()
    root.fc = QuantLinear(nn.Linear(shape[1], shape[0], bias=False), "fc", weight=weight, input=input, grad=grad)
    return Holder(root), root.fc


def run_step(cbs, trainer, module, optimizer, batch=None):
    """Lightning's hook order around one optimizer step."""
    for cb in cbs:
        cb.on_train_batch_start(trainer, module, batch, 0)
    for cb in cbs:
        cb.on_before_optimizer_step(trainer, module, optimizer)
    optimizer.step()
    trainer.global_step += 1
    for cb in cbs:
        cb.on_train_batch_end(trainer, module, None, batch, 0)


def flip_rig(w0: torch.Tensor, momentum: float):
    """One e0m7 layer (grid spacing 2^-7) holding ``w0``, plain SGD at lr 1 (the step is −grad), and a FlipCallback
    logging every step: (module, layer, optimizer, logger, trainer, callback)."""
    module, fc = one_layer(weight=unscaled("e0m7"), shape=tuple(w0.shape))
    with torch.no_grad():
        fc.weight.copy_(w0)
    opt = torch.optim.SGD([fc.weight], lr=1.0)
    logger = RecordingLogger()
    trainer = fake_trainer(logger, optimizers=[opt])
    cb = FlipCallback(every_n_steps=1, oscillation_momentum=momentum)
    cb.on_train_start(trainer, module)
    return module, fc, opt, logger, trainer, cb


# -- stability -----------------------------------------------------------------------------------------------------
def test_stability_reports_exactly_k_saturating_values():
    module, fc = one_layer(weight=None, input=unscaled("e4m3"))
    x = torch.full((5, 8), 3.0)
    x[0, :3] = 1000.0  # three values above e4m3's max 448
    x[1, 0] = float("nan")
    fc(x)
    logger = RecordingLogger()
    trainer = fake_trainer(logger)
    cb = StabilityCallback(every_n_steps=1)
    cb.on_train_batch_start(trainer, module, None, 0)
    trainer.global_step = 1
    cb.on_train_batch_end(trainer, module, None, None, 0)
    got = logger.last()
    assert got["stability/fc/input/frac_saturated"] == pytest.approx(3 / 40)
    assert got["stability/fc/input/nonfinite"] == 1.0
    assert got["stability/fc/input/amax"] == 1000.0
    assert module.run_summary["diagnostics"]["max_frac_saturated"] == pytest.approx(3 / 40)


def test_stability_range_use_of_a_weight():
    module, fc = one_layer(weight=unscaled("e4m3"))
    with torch.no_grad():
        fc.weight.copy_(torch.tensor([1.0, 2.0, 4.0, 8.0]).repeat(8, 1).T)  # 1 … 8: three octaves
    logger = RecordingLogger()
    trainer = fake_trainer(logger)
    cb = StabilityCallback(every_n_steps=1)
    cb.on_train_batch_start(trainer, module, None, 0)
    cb.on_train_batch_end(trainer, module, None, None, 0)
    assert logger.last()["stability/fc/weight/range_use"] == pytest.approx(3 / (math.log2(448) + 9))


# -- flips ---------------------------------------------------------------------------------------------------------
def test_an_update_flips_exactly_these_codes():
    # e0m7 without scaling: a uniform grid of spacing 2^-7 on [-127/128, 127/128]
    q = 2.0**-7
    w0 = torch.tensor([[0.0, 10 * q, 20 * q, 30 * q], [-5 * q, 5 * q, 0.5, -0.5]])
    step = torch.tensor([[0.7, 0.2, -0.6, 0.0], [1.6, -0.3, 0.0, 0.0]]) * q  # flips: (0,0) (0,2) (1,0)
    module, fc, opt, logger, trainer, cb = flip_rig(w0, momentum=1.0)
    fc.weight.grad = -step.clone()
    run_step([cb], trainer, module, opt)
    got = logger.last()
    assert got["flips/fc/weight/flip_rate"] == pytest.approx(3 / 8)
    assert got["flips/fc/weight/stall_ratio"] == pytest.approx(1 - 3 / 5)  # five weights received an update
    applied = torch.tensor([[1.0, 0, -1, 0], [2, 0, 0, 0]]) * q
    cos = float((step * applied).sum() / (step.norm() * applied.norm()))
    assert got["flips/fc/weight/descent_cos"] == pytest.approx(cos, rel=1e-5)
    assert got["flips/fc/weight/oscillation_rate"] == 0.0
    assert module.run_summary["diagnostics"]["final_flip_rate"] == pytest.approx(3 / 8)
    # the reverse step undoes every flip: each one reverses its previous direction
    fc.weight.grad = step.clone()
    run_step([cb], trainer, module, opt)
    got = logger.last()
    assert got["flips/fc/weight/flip_rate"] == pytest.approx(3 / 8)
    assert got["flips/fc/weight/oscillation_rate"] == pytest.approx(3 / 8)  # momentum 1: this step's share
    cb.on_train_end(trainer, module)


def test_flips_see_a_write_between_the_optimizer_step_and_the_batch_end(monkeypatch):
    """The weights read after the optimizer step are reused at the batch end only while no one wrote them since
    (a storage projection writes in place: its version counter moves); then they are read again."""
    q = 2.0**-7
    w0 = torch.tensor([[0.0, 10 * q, 20 * q, 30 * q]])
    module, fc, opt, logger, trainer, cb = flip_rig(w0, momentum=1.0)
    reads = []
    gather = type(cb.groups[0]).gather_less  # every read of the weights goes through it
    monkeypatch.setattr(type(cb.groups[0]), "gather_less", lambda g, *a: reads.append(1) or gather(g, *a))

    fc.weight.grad = -torch.tensor([[0.7, 0.7, 0.0, 0.0]]) * q  # two codes flip up
    run_step([cb], trainer, module, opt)
    assert logger.last()["flips/fc/weight/flip_rate"] == pytest.approx(2 / 4)
    assert len(reads) == 2  # the first "before", then one read after the step, reused at the batch end

    class Projection:  # a storage policy's place in the hook order: after the step, before FlipCallback's batch end
        def __getattr__(self, name):
            return lambda *a, **k: None

        def on_train_batch_end(self, *a, **k):
            with torch.no_grad():
                fc.weight.copy_(w0)  # back onto the starting codes

    reads.clear()
    fc.weight.grad = -torch.tensor([[0.0, 0.0, 0.7, 0.7]]) * q
    run_step([Projection(), cb], trainer, module, opt)
    got = logger.last()
    # against the written weights: the first two codes flipped back (reversals), the other two never changed
    assert got["flips/fc/weight/flip_rate"] == pytest.approx(2 / 4)
    assert got["flips/fc/weight/oscillation_rate"] == pytest.approx(2 / 4)
    assert len(reads) == 2  # read after the step, and again after the write
    assert torch.equal(cb.groups[0].after, w0.reshape(-1))
    cb.on_train_end(trainer, module)


def test_an_oscillating_weight_is_counted_every_step():
    q = 2.0**-7
    module, fc, opt, logger, trainer, cb = flip_rig(torch.tensor([[0.0, 0.0]]), momentum=0.5)
    rates = []
    for t in range(6):
        sign = 1.0 if t % 2 == 0 else -1.0
        fc.weight.grad = torch.tensor([[-sign * q, -q]])  # weight 0 goes up/down; weight 1 walks up
        run_step([cb], trainer, module, opt)
        rates.append(logger.last()["flips/fc/weight/oscillation_rate"])
    # per-step reversal share: 0 then 1/2 every step; debiased EMA(0.5) of [0, .5, .5, ...]
    shares = [0.0] + [0.5] * 5
    ema, expected = 0.0, []
    for i, s in enumerate(shares, 1):
        ema = 0.5 * ema + 0.5 * s
        expected.append(ema / (1 - 0.5**i))
    assert rates == pytest.approx(expected)
    cb.on_train_end(trainer, module)


def test_flips_on_a_fixed_sample_of_weights():
    module, fc = one_layer(weight=unscaled("e0m7"), shape=(2, 4))
    q = 2.0**-7
    step = torch.tensor([[0.7, 0.2, -0.6, 0.0], [1.6, -0.3, 0.0, 0.0]]) * q
    flipped = torch.tensor([1, 0, 1, 0, 1, 0, 0, 0], dtype=torch.bool)
    with torch.no_grad():
        fc.weight.zero_()
    fc.weight.grad = -step.clone()
    opt = torch.optim.SGD([fc.weight], lr=1.0)
    logger = RecordingLogger()
    trainer = fake_trainer(logger, optimizers=[opt])
    cb = FlipCallback(every_n_steps=1, max_weights_per_tensor=4, seed=3)
    cb.on_train_start(trainer, module)
    index = cb.tracked[0].index
    assert index.numel() == 4 and torch.equal(index, index.sort().values)
    run_step([cb], trainer, module, opt)
    assert logger.last()["flips/fc/weight/flip_rate"] == pytest.approx(flipped[index].float().mean().item())
    again = FlipCallback(max_weights_per_tensor=4, seed=3)
    again.on_train_start(trainer, module)
    assert torch.equal(again.tracked[0].index, index)  # the same sample every run
    cb.on_train_end(trainer, module)
    again.on_train_end(trainer, module)


def test_flips_use_the_grid_of_the_steps_forward():
    module, fc = one_layer(weight=QuantSpec(get_format("e4m3"), scaling=ScalingSpec(kind="tensor")), shape=(8, 16))
    torch.manual_seed(0)
    fc(torch.randn(3, 16))  # the forward records the weight's scale
    w0 = fc.weight.detach().clone()
    s = fc.weight_q.scale_for(w0)
    assert s.item() == fc.weight_q.stats[-1].item()
    fc.weight.grad = torch.randn(8, 16) * 0.01
    opt = torch.optim.SGD([fc.weight], lr=1.0)
    logger = RecordingLogger()
    trainer = fake_trainer(logger, optimizers=[opt])
    cb = FlipCallback(every_n_steps=1)
    cb.on_train_start(trainer, module)
    run_step([cb], trainer, module, opt)
    fmt = get_format("e4m3")
    before = quantize(w0 * s, fmt) / s
    after = quantize(fc.weight.detach() * s, fmt) / s
    expected = (before != after).float().mean().item()
    assert 0 < expected < 1
    assert logger.last()["flips/fc/weight/flip_rate"] == pytest.approx(expected)
    cb.on_train_end(trainer, module)


def test_flips_over_steps_whose_scale_moves_and_stays():
    # the last step's quantized "after" stands in for this step's "before" only while the scale is the same:
    # every step's flips must equal a fresh quantization of both sides on that step's grid
    module, fc = one_layer(weight=QuantSpec(get_format("e4m3"), scaling=ScalingSpec(kind="tensor")), shape=(8, 16))
    torch.manual_seed(2)
    opt = torch.optim.SGD([fc.weight], lr=1.0)
    logger = RecordingLogger()
    trainer = fake_trainer(logger, optimizers=[opt])
    cb = FlipCallback(every_n_steps=1)
    cb.on_train_start(trainer, module)
    fmt = get_format("e4m3")
    kept = []
    for step in range(6):
        fc(torch.randn(3, 16))  # the forward records this step's scale
        w0 = fc.weight.detach().clone()
        s = fc.weight_q.scale_for(w0)
        # steps 2 and 4 grow the weights fourfold (the power-of-two scale moves); the others nudge them
        fc.weight.grad = -3.0 * w0 if step in (2, 4) else torch.randn(8, 16) * 0.01
        run_step([cb], trainer, module, opt)
        kept.append(cb.groups[0].scale_kept)
        expected = (quantize(w0 * s, fmt) != quantize(fc.weight.detach() * s, fmt)).float().mean().item()
        assert logger.last()["flips/fc/weight/flip_rate"] == pytest.approx(expected, abs=0), step
    assert kept[1] and not kept[3] and not kept[5]  # both cases were met: the last "after" reused, and not
    cb.on_train_end(trainer, module)


@pytest.mark.skipif(native.kernel() is None, reason="no C++ compiler here")
@pytest.mark.parametrize("fold_at", [256, 3])  # 3: a long interval folds on the way, before it is read
def test_flip_accumulators_folded_when_read_are_the_step_by_step_ones(monkeypatch, fold_at):
    # the native path keeps each step's sums and adds them to the accumulators only when they are read (a logging
    # step, a checkpoint): the interval counts, the descent cosine and the oscillation EMA must be the bits of
    # adding every step as it came (counts_from_sums, then acc and ema_update, one step at a time)
    sums_seen = []
    flip_sums = native.flip_sums

    def recording(*args, **kwargs):
        out = flip_sums(*args, **kwargs)
        sums_seen.append(out[0].clone())
        return out

    monkeypatch.setattr(native, "flip_sums", recording)
    monkeypatch.setattr(flips, "FOLD_AT", fold_at)
    module, fc = one_layer(weight=QuantSpec(get_format("e4m3"), scaling=ScalingSpec(kind="tensor")), shape=(8, 16))
    torch.manual_seed(5)
    opt = torch.optim.SGD([fc.weight], lr=1.0)
    logger = RecordingLogger()
    trainer = fake_trainer(logger, optimizers=[opt])
    cb = FlipCallback(every_n_steps=4, oscillation_momentum=0.3)
    cb.on_train_start(trainer, module)
    acc, ema = torch.zeros(1, 5), torch.zeros(1)
    for step in range(1, 11):
        fc(torch.randn(3, 16))
        fc.weight.grad = torch.randn(8, 16) * 0.05 * (1 + step % 3)
        run_step([cb], trainer, module, opt)
        counts = counts_from_sums(sums_seen[-1])  # the accumulators as the steps came
        acc += torch.cat([counts, counts.new_ones(1, 1)], dim=1)
        ema = ema_update(ema, counts[:, 2] / 128.0, 0.3)
        if step == 6:  # a checkpoint between two logging steps reads them too
            layer = cb.state_dict()["layers"]["fc"]
            assert torch.equal(layer[1], acc[0]) and torch.equal(layer[2], ema[0])
        if step % 4 == 0:  # a logging step: the interval's means, then the interval starts again
            logged = logger.last()
            assert logged["flips/fc/weight/flip_rate"] == acc[0, 0].item() / (128 * acc[0, 4].item())
            assert logged["flips/fc/weight/descent_cos"] == acc[0, 3].item() / acc[0, 4].item()
            assert logged["flips/fc/weight/oscillation_rate"] == ema_debiased(ema.item(), 0.3, step)
            acc.zero_()
    assert len(sums_seen) == 10  # the native path ran
    assert len(cb.groups[0].unfolded) == 2  # steps 9 and 10 wait unread (fold_at 3: steps 1–3 were folded on the way)
    cb.on_train_end(trainer, module)


def test_flips_of_layers_in_different_formats():
    root = nn.Module()
    root.a = QuantLinear(nn.Linear(4, 2, bias=False), "a", weight=unscaled("e0m7"))
    root.b = QuantLinear(nn.Linear(4, 2, bias=False), "b", weight=unscaled("e1m6"))
    module = Holder(root)
    torch.manual_seed(1)
    for layer in (root.a, root.b):
        with torch.no_grad():
            layer.weight.copy_(torch.randn(2, 4) * 0.3)
        layer.weight.grad = torch.randn(2, 4) * 0.02
    before = {n: getattr(root, n).weight.detach().clone() for n in "ab"}
    opt = torch.optim.SGD(root.parameters(), lr=1.0)
    logger = RecordingLogger()
    trainer = fake_trainer(logger, optimizers=[opt])
    cb = FlipCallback(every_n_steps=1)
    cb.on_train_start(trainer, module)
    assert len(cb.groups) == 2
    run_step([cb], trainer, module, opt)
    for n, fmt in (("a", "e0m7"), ("b", "e1m6")):
        f = get_format(fmt)
        flips = (quantize(before[n], f) != quantize(getattr(root, n).weight.detach(), f)).float().mean().item()
        assert logger.last()[f"flips/{n}/weight/flip_rate"] == pytest.approx(flips)
    cb.on_train_end(trainer, module)


def test_flips_follow_a_format_switch_and_keep_their_history():
    from altgrad.callbacks.fallback import switch_format

    module, fc = one_layer(weight=unscaled("e0m7"), shape=(2, 4))
    opt = torch.optim.SGD([fc.weight], lr=1.0)
    logger = RecordingLogger()
    trainer = fake_trainer(logger, optimizers=[opt])
    cb = FlipCallback(every_n_steps=1)
    cb.on_train_start(trainer, module)
    fc.weight.grad = torch.full((2, 4), -0.02)
    run_step([cb], trainer, module, opt)
    history = cb.groups[0].last_direction.clone()
    assert history.abs().sum() > 0
    switch_format(fc.weight_q, get_format("e3m4"))
    fc.weight.grad = torch.zeros(2, 4)
    run_step([cb], trainer, module, opt)
    assert cb.groups[0].spec_key[0].name == "e3m4"
    assert torch.equal(cb.groups[0].last_direction, history)  # no flips this step: history carried over
    assert logger.last()["flips/fc/weight/flip_rate"] == 0.0
    cb.on_train_end(trainer, module)


# -- bits ----------------------------------------------------------------------------------------------------------
def test_effective_bits_of_a_tensor_using_four_codes_equally_is_two():
    module, fc = one_layer(weight=unscaled("e4m3"), shape=(4, 8))
    with torch.no_grad():
        fc.weight.copy_(torch.tensor([0.5, 1.0, -2.0, 4.0]).repeat(8, 1).T)
    fc.weight.grad = fc.weight.detach().abs() * 3  # |g| ∝ |w| ∝ S within an octave-aligned grid
    logger = RecordingLogger()
    trainer = fake_trainer(logger)
    cb = BitsCallback(every_n_steps=1, samples_per_tensor=3)
    cb.on_train_batch_start(trainer, module, None, 0)
    cb.on_before_optimizer_step(trainer, module, None)
    trainer.global_step = 1
    cb.on_train_batch_end(trainer, module, None, None, 0)
    got = logger.last()
    assert got["bits/fc/weight/effective_bits"] == pytest.approx(2.0)
    # ulp at 2^k with M = 3 is 2^(k-3): log2 S = -4, -3, -2, -1
    assert got["bits/fc/weight/log2_stiffness_mean"] == pytest.approx(-2.5)
    assert got["bits/fc/weight/log2_stiffness_min"] == -4.0
    assert got["bits/fc/weight/log2_stiffness_max"] == -1.0
    assert got["bits/fc/weight/grad_stiffness_corr"] == pytest.approx(1.0)
    assert len(cb.trajectories) == 3
    grid = get_format("e4m3").values()
    for step, layer, _, element, code, value in cb.trajectories:
        assert (step, layer) == (1, "fc")
        assert grid[code].item() == value == fc.weight.reshape(-1)[element].item()
    assert module.run_summary["diagnostics"]["mean_effective_bits"] == pytest.approx(2.0)


@pytest.mark.parametrize("pass_elements", [2**24, 50])
def test_bits_of_layers_in_two_formats_match_each_tensor_on_its_own(monkeypatch, pass_elements):
    """The whole-format pass gives every tensor's values as computed from that tensor alone: two formats, a
    per-tensor and a per-channel scale, a layer without a gradient; the pass cut into parts (50 weights: each tensor
    alone) gives them too."""
    from altgrad.callbacks import bits

    monkeypatch.setattr(bits, "PASS_ELEMENTS", pass_elements)
    from altgrad.diagnostics import code_histogram, code_index, entropy_bits, log2_stiffness, pearson

    root = nn.Module()
    root.a = QuantLinear(nn.Linear(8, 6, bias=False), "a", weight=QuantSpec(get_format("e4m3")))
    root.b = QuantLinear(nn.Linear(8, 5, bias=False), "b",
                         weight=QuantSpec(get_format("e5m2"), scaling=ScalingSpec(kind="channel")))
    root.c = QuantLinear(nn.Linear(6, 4, bias=False), "c", weight=QuantSpec(get_format("e4m3")))
    module = Holder(root)
    torch.manual_seed(3)
    for layer in (root.a, root.b, root.c):
        with torch.no_grad():
            layer.weight.copy_(torch.randn_like(layer.weight) * torch.logspace(-3, 1, layer.weight.shape[1]))
        layer(torch.randn(2, layer.weight.shape[1]))  # the step's forward: the scale the weights are read at
    root.a.weight.grad = torch.randn(6, 8)
    root.b.weight.grad = torch.randn(5, 8)
    hist = {}
    fake = type("W", (), {"log_metrics": lambda self, payload, step: hist.update(payload)})()
    monkeypatch.setattr(BitsCallback, "wandb_logger", staticmethod(lambda trainer: fake))
    logger = RecordingLogger()
    trainer = fake_trainer(logger)
    cb = BitsCallback(every_n_steps=1, samples_per_tensor=4)
    cb.on_train_batch_start(trainer, module, None, 0)
    cb.on_before_optimizer_step(trainer, module, None)
    pending_hists = dict(cb._pending[1])
    trainer.global_step = 1
    cb.on_train_batch_end(trainer, module, None, None, 0)
    got = logger.last()
    for name in "abc":
        layer = getattr(root, name)
        fmt, w = layer.weight_q.spec.format, layer.weight.detach()
        s = layer.weight_q.scale_for(w).float()
        q = quantize(w * s, fmt)
        counts = code_histogram(code_index(q, fmt), fmt.values().numel())
        log2s = log2_stiffness(w, fmt, s).reshape(-1)
        expected = {"effective_bits": entropy_bits(counts), "log2_stiffness_mean": log2s.mean(),
                    "log2_stiffness_std": log2s.std(), "log2_stiffness_min": log2s.min(),
                    "log2_stiffness_max": log2s.max()}
        if layer.weight.grad is not None:
            expected["grad_stiffness_corr"] = pearson(layer.weight.grad.abs(), torch.exp2(log2s))
        else:
            assert f"bits/{name}/weight/grad_stiffness_corr" not in got
        for metric, value in expected.items():
            assert got[f"bits/{name}/weight/{metric}"] == value.item(), (name, metric)  # the same bits
        assert torch.equal(pending_hists[f"bits/{name}/weight/codes"][0], counts)
        assert torch.equal(pending_hists[f"bits/{name}/weight/log2_stiffness"], log2s)
        rows = [r for r in cb.trajectories if r[1] == name]
        assert len(rows) == 4
        for _, _, _, element, code, value in rows:
            assert code == code_index(q, fmt).reshape(-1)[element].item()
            assert value == (q.reshape(-1)[element] / torch.broadcast_to(s, w.shape).reshape(-1)[element]).item()
    assert set(hist) == {f"bits/{n}/weight/{k}" for n in "abc" for k in ("codes", "log2_stiffness")}


@pytest.mark.parametrize("kind", ["tensor", "delayed", "channel", "none"])
def test_bits_reads_the_weights_at_the_scale_of_their_forward(kind):
    # the scale bits reads from the scaler is the one scale_for computes from the weights after their forward,
    # for an all-zero weight (the kept fallback) too
    from altgrad.callbacks.bits import forward_scale

    layer = QuantLinear(nn.Linear(8, 6, bias=False), "a",
                        weight=QuantSpec(get_format("e4m3"), scaling=ScalingSpec(kind=kind)))
    torch.manual_seed(4)
    for scale_of in (0.003, 40.0, 0.0):
        with torch.no_grad():
            layer.weight.copy_(torch.randn(6, 8) * scale_of)
        layer(torch.randn(2, 8))
        w = layer.weight.detach()
        expected = layer.weight_q.scale_for(w).detach().float()
        got = forward_scale(layer.weight_q, w)
        assert got.dtype == torch.float32 and torch.equal(torch.broadcast_to(got, expected.shape), expected)


def _histogram_alone(v):
    """One W&B histogram the straightforward way (the finite values moved to the host, then binned there)."""
    if isinstance(v, tuple):
        counts, n = v
        return counts.cpu().float().tolist(), [i - 0.5 for i in range(n + 1)]
    x = v.detach().float()
    x = x[torch.isfinite(x)].cpu()
    if x.numel() == 0:
        return [0.0], [0.0, 1.0]
    lo, hi = float(x.min()), float(x.max())
    hi = hi if hi > lo else lo + 1.0
    return torch.histc(x, bins=64, min=lo, max=hi).tolist(), torch.linspace(lo, hi, 65).tolist()


def test_bits_pass_parts():
    from altgrad.callbacks.bits import _parts

    assert _parts([0, 1, 2, 3, 4], [10, 20, 5, 40, 1], 35) == [[0, 1, 2], [3], [4]]
    assert _parts([7], [100], 10) == [[7]]


def test_bits_histograms_in_one_go_are_each_tensors_own():
    from altgrad.callbacks.bits import np_histograms

    g = torch.Generator().manual_seed(5)
    spread = torch.randn(300, generator=g) * 4
    with_bad = spread.clone()
    with_bad[[3, 50, 51]] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    hists = {"spread": spread, "with non-finite": with_bad, "constant": torch.full((7,), -2.5),
             "nothing finite": torch.tensor([float("nan"), float("inf")]),
             "codes": (torch.bincount(torch.randint(0, 9, (50,), generator=g), minlength=12), 12),
             "edges on bins": torch.arange(-8.0, 8.0, 0.25), "more codes": (torch.arange(5), 5)}
    got = np_histograms(hists)
    assert list(got) == list(hists)
    for name, v in hists.items():
        assert got[name] == _histogram_alone(v), name


# -- rank ----------------------------------------------------------------------------------------------------------
def test_rank_relative_to_step_zero():
    root = nn.Module()
    root.fc = nn.Linear(6, 6, bias=False)
    with torch.no_grad():
        root.fc.weight.copy_(torch.diag(torch.tensor([2.0, 2.0, 2.0, 0.0, 0.0, 0.0])))
    module = Holder(root)
    logger = RecordingLogger()
    trainer = fake_trainer(logger)
    cb = RankCallback(every_n_steps=1)
    cb.on_train_start(trainer, module)
    with torch.no_grad():
        root.fc.weight[0, 0] = 4.0  # σ = 4, 2, 2
    cb.on_train_batch_start(trainer, module, None, 0)
    cb.on_train_batch_end(trainer, module, None, None, 0)
    got = logger.last()
    assert got["rank/fc/weight/stable_rank"] == pytest.approx(1.5)
    assert got["rank/fc/weight/stable_rank_rel"] == pytest.approx(0.5)
    p = torch.tensor([0.5, 0.25, 0.25])
    assert got["rank/fc/weight/eff_rank_rel"] == pytest.approx(math.exp(-(p * p.log()).sum().item()) / 3, rel=1e-5)
    restored = RankCallback()
    restored.load_state_dict(cb.state_dict())
    assert restored.reference == cb.reference


# -- attention and activations ---------------------------------------------------------------------------------------
def test_attention_with_zero_queries_is_uniform_over_the_causal_window():
    model = tiny_gpt(fmt=None)
    c = model.config.n_embd
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight[:c].zero_()  # q = 0: every key scores the same
    module = Holder(model)
    logger = RecordingLogger()
    trainer = fake_trainer(logger)
    cb = AttentionCallback(every_n_steps=1)
    cb.on_train_batch_start(trainer, module, None, 0)
    x = torch.randint(0, 32, (3, 8))
    cb.on_train_batch_end(trainer, module, None, (x, x), 0)
    got = logger.last()
    expected = sum(math.log(t) for t in range(1, 9)) / 8
    names = [f"attn/transformer.h.{i}.attn/head{k}/entropy" for i in range(2) for k in range(2)]
    assert sorted(got) == sorted(names)
    for name in names:
        assert got[name] == pytest.approx(expected, rel=1e-5)


def test_dead_units_and_kurtosis_on_a_probe():
    model = tiny_gpt(fmt=None, bias=True)
    hidden = 4 * model.config.n_embd
    with torch.no_grad():
        for block in model.transformer.h:
            block.mlp.c_fc.weight.zero_()
            block.mlp.c_fc.bias.fill_(1.0)
            block.mlp.c_fc.bias[:5] = -1.0  # five units never fire
    module = Holder(model)
    logger = RecordingLogger()
    trainer = fake_trainer(logger)
    cb = ActivationCallback(every_n_steps=1, max_sequences=2)
    x = torch.randint(0, 32, (4, 8))
    seen = {}
    handle = model.transformer.h[1].register_forward_hook(lambda m, i, o: seen.setdefault("out", o.detach()))
    cb.on_train_batch_start(trainer, module, None, 0)
    cb.on_train_batch_end(trainer, module, None, (x, x), 0)
    handle.remove()
    got = logger.last()
    assert got["act/transformer.h.0.mlp.c_fc/output/dead_frac"] == pytest.approx(5 / hidden)
    out = seen["out"]
    assert out.shape[0] == 2  # only the probe's sequences
    c = out - out.mean()
    assert got["act/transformer.h.1/output/kurtosis"] == pytest.approx(((c**4).mean() / (c**2).mean() ** 2).item())
    assert "act/lm_head/input/kurtosis" in got
    assert module.run_summary["diagnostics"]["max_kurtosis"] >= got["act/transformer.h.1/output/kurtosis"]


def hook_counts(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize("cls", [ActivationCallback, AttentionCallback])
def test_probe_hooks_are_removed_also_when_the_probe_fails(cls):
    model = tiny_gpt(fmt=None, bias=True)
    module, trainer, cb = Holder(model), fake_trainer(RecordingLogger()), cls(every_n_steps=1, max_sequences=2)
    before = hook_counts(model)
    assert cb.measure(trainer, module, (torch.randint(0, 32, (3, 8)),) * 2)
    assert hook_counts(model) == before
    too_long = torch.randint(0, 32, (3, model.config.block_size + 1))  # the GPT refuses it mid-probe
    with pytest.raises(ValueError, match="exceeds model.block_size"):
        cb.measure(trainer, module, (too_long, too_long))
    assert hook_counts(model) == before


def test_probes_leave_quantizer_state_and_rng_untouched():
    model = tiny_gpt(fmt={"name": "e4m3", "grad": "e5m2", "rounding": "stochastic",
                          "scaling": {"kind": "delayed", "pow2": True}})
    x = torch.randint(0, 32, (2, 8))
    model(x)  # fill the amax histories
    before = {k: v.clone() for k, v in model.state_dict().items()}
    module = Holder(model)
    trainer = fake_trainer(RecordingLogger())
    torch.manual_seed(123)
    for cb in (ActivationCallback(every_n_steps=1), AttentionCallback(every_n_steps=1)):
        cb.on_train_batch_start(trainer, module, None, 0)
        cb.on_train_batch_end(trainer, module, None, (x, x), 0)
    after_rng = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(after_rng, torch.rand(3))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert model.training


# -- range clipping and fallback -------------------------------------------------------------------------------------
def test_range_clip_clips_to_the_grad_format_range():
    module, fc = one_layer(weight=None, grad=QuantSpec(get_format("e4m3"), scaling=ScalingSpec(kind="tensor")),
                           shape=(2, 2))
    fc.grad_q.scaler.scale.fill_(4.0)  # the scale the last backward used for grad_output (tensor scaling keeps it)
    fc.weight.grad = torch.tensor([[100.0, -200.0], [500.0, 3.0]])
    logger = RecordingLogger()
    trainer = fake_trainer(logger)
    cb = RangeClipCallback(enabled=True, margin=1, every_n_steps=1)  # limit = 448 / 2 / 4 = 56
    cb.on_train_batch_start(trainer, module, None, 0)
    cb.on_before_optimizer_step(trainer, module, None)
    cb.on_train_batch_end(trainer, module, None, None, 0)
    assert fc.weight.grad.tolist() == [[56.0, -56.0], [56.0, 3.0]]
    assert logger.last()["clip/fc/grad/clipped"] == 3.0
    assert module.run_summary["diagnostics"]["clip_events"] == 3.0
    off = RangeClipCallback()
    fc.weight.grad = torch.tensor([[100.0, -200.0], [500.0, 3.0]])
    off.on_before_optimizer_step(trainer, module, None)
    assert fc.weight.grad[1, 0] == 500.0


def test_fallback_widens_a_persistently_saturating_role():
    module, fc = one_layer(weight=None, input=unscaled("e4m3"))
    logger = RecordingLogger()
    trainer = fake_trainer(logger)
    cb = FallbackCallback(enabled=True, check_every_n_steps=1, patience=3, overflow_format="e5m2")
    big = torch.full((2, 8), 1000.0)
    for step in range(1, 4):
        fc(big)
        trainer.global_step = step
        cb.on_train_batch_end(trainer, module, None, None, 0)
        assert (fc.input_q.spec.format.name == "e5m2") == (step == 3)
    assert module.run_summary["fallbacks"] == [
        {"step": 3, "layer": "fc", "role": "input", "reason": "overflow", "from": "e4m3", "to": "e5m2"}]
    assert logger.last()["fallback/fc/input/switched"] == 1.0
    fc(big)
    assert fc.input_q.stats[0].item() == 0.0  # 1000 fits e5m2: nothing saturates any more


def test_fallback_refuses_a_narrower_target_and_is_off_by_default():
    module, fc = one_layer(weight=None, input=unscaled("e5m2"))
    trainer = fake_trainer(RecordingLogger())
    big = torch.full((2, 8), 1e6)
    for cb in (FallbackCallback(), FallbackCallback(enabled=True, check_every_n_steps=1, patience=1,
                                                    overflow_format="e4m3")):
        fc(big)
        trainer.global_step += 1
        cb.on_train_batch_end(trainer, module, None, None, 0)
    assert fc.input_q.spec.format.name == "e5m2"
    assert "fallbacks" not in module.run_summary


@pytest.mark.parametrize("cls,kw", [
    (StabilityCallback, {"every_n_steps": 0}), (FlipCallback, {"oscillation_momentum": 0}),
    (BitsCallback, {"samples_per_tensor": -1}), (FallbackCallback, {"patience": 0}),
    (ActivationCallback, {"max_sequences": 0})])
def test_bad_settings_fail_with_a_clear_message(cls, kw):
    with pytest.raises(ValueError, match="valid"):
        cls(**kw)


def test_fallback_rejects_an_unknown_format():
    with pytest.raises(ValueError):
        FallbackCallback(overflow_format="e9m9")



def test_histograms_and_tables_go_to_wandb_only(monkeypatch, tmp_path):
    import wandb

    class FakeWandb:
        def __init__(self) -> None:
            self.metrics: list[dict] = []
            self.tables: list[tuple] = []

        def log_metrics(self, metrics, step=None):
            self.metrics.append(dict(metrics))

        def log_table(self, key, columns=None, data=None, step=None):
            self.tables.append((key, columns, data))

    fake = FakeWandb()
    module, fc = one_layer(weight=unscaled("e4m3"), shape=(4, 8))
    fc.weight.grad = torch.randn(4, 8)
    logger = RecordingLogger()
    trainer = fake_trainer(logger)
    cb = BitsCallback(every_n_steps=1, samples_per_tensor=2, csv_path=str(tmp_path / "traj.csv"))
    monkeypatch.setattr(BitsCallback, "wandb_logger", staticmethod(lambda trainer: fake))
    cb.on_train_batch_start(trainer, module, None, 0)
    cb.on_before_optimizer_step(trainer, module, None)
    cb.on_train_batch_end(trainer, module, None, None, 0)
    cb.on_train_end(trainer, module)
    hist = fake.metrics[0]
    assert set(hist) == {"bits/fc/weight/codes", "bits/fc/weight/log2_stiffness"}
    assert all(isinstance(h, wandb.Histogram) for h in hist.values())
    assert fake.tables[0][0] == "bits/code_trajectories" and len(fake.tables[0][2]) == 2
    assert not any(isinstance(v, wandb.Histogram) for _, m in logger.records for v in m.values())
    lines = (tmp_path / "traj.csv").read_text().splitlines()
    assert lines[0] == "step,layer,sample,element,code_index,value" and len(lines) == 3

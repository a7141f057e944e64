"""Quantizer statistics on demand (FakeQuantCallback, quant.stats=demand): computed only on the steps where a
callback reads them, with every diagnostic unchanged against statistics on every call (quant.stats=always)."""

from __future__ import annotations

import copy
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from altgrad.callbacks import divergence as divergence_module
from altgrad.callbacks import fake_quant as fake_quant_module
from altgrad.callbacks.divergence import DivergenceCallback, replay_with_stats
from altgrad.callbacks.fake_quant import FakeQuantCallback
from altgrad.callbacks.fallback import FallbackCallback
from altgrad.callbacks.flips import FlipCallback
from altgrad.callbacks.probe import capture_rng, quantizers
from altgrad.callbacks.range_clip import RangeClipCallback
from altgrad.callbacks.stability import StabilityCallback
from altgrad.quant import STAT_NAMES, QuantSpec, ScalingSpec, get_format
from altgrad.quant.fake_quant import StatsRecord
from altgrad.quant.layers import QuantLinear

from diag_helpers import E4M3, RecordingLogger, TinyLM, fake_trainer, fit, tiny_gpt, token_loader

UNSCALED = dict(E4M3, scaling={"kind": "none", "pow2": True})  # large values saturate instead of being scaled
DELAYED = dict(E4M3, rounding="stochastic", scaling={"kind": "delayed", "pow2": True, "history": 4})


def switch(tmp_path, fmt: dict = E4M3, stats: str = "demand") -> FakeQuantCallback:
    """The callback that quantizes the (plain) model in setup and switches its statistics."""
    return FakeQuantCallback(fmt, {"base_rules": []}, run_dir=tmp_path, stats=stats)


def flags(model: torch.nn.Module) -> bool | None:
    """The common track_stats of every quantizer (None when they differ)."""
    values = {q.track_stats for q in quantizers(model)}
    return values.pop() if len(values) == 1 else None


class FlagProbe(L.Callback):
    """Records the quantizers' track_stats at each training batch (after the switch) and validation batch."""

    def __init__(self) -> None:
        self.train: list[tuple[int, bool | None]] = []
        self.val: list[bool | None] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        on = flags(pl_module.model)
        record = quantizers(pl_module.model)[0].stats_record
        assert record is None or record.on == on  # the switch's record says what the flags are
        self.train.append((trainer.global_step, on))

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.val.append(flags(pl_module.model))


def scale_input(layer_name: str, factor: float, from_step: int = 0, growth: float = 1.0):
    """Forward pre-hook factory: one layer's input times ``factor`` from a step on, times ``growth`` more at every
    step after that (a layer that saturates)."""

    def attach(module: TinyLM) -> None:
        def hook(_m, args):
            step = module.trainer.global_step
            if step >= from_step:
                return (args[0] * factor * growth ** (step - from_step),)
            return None

        module.model.get_submodule(layer_name).register_forward_pre_hook(hook)

    return attach


def nan_into(layer_name: str, at_step: int):
    """Forward pre-hook factory: NaN into one layer's input at one step."""

    def attach(module: TinyLM) -> None:
        def hook(_m, args):
            if module.trainer.global_step == at_step:
                return (args[0] * float("nan"),)
            return None

        module.model.get_submodule(layer_name).register_forward_pre_hook(hook)

    return attach


def run(tmp_path, callbacks: list, steps: int, fmt: dict = E4M3, stats: str = "demand", seed: int = 0,
        attach=None, dropout: float = 0.0, **trainer_kw: Any) -> tuple[TinyLM, RecordingLogger, L.Trainer]:
    """A tiny run whose model FakeQuantCallback quantizes (the first callback, as train() places it)."""
    torch.manual_seed(seed)
    module = TinyLM(tiny_gpt(fmt=None, dropout=dropout))
    fq = switch(tmp_path, fmt, stats)
    fq.apply(module.model)  # surgery now, so hooks can be attached to the quantized layers
    if attach is not None:
        attach(module)
    logger = RecordingLogger()
    torch.manual_seed(seed + 1)
    trainer = fit(module, [fq, *callbacks], steps, tmp_path, logger=logger, **trainer_kw)
    return module, logger, trainer


def metrics(logger: RecordingLogger, prefix: str) -> list[tuple[int | None, dict[str, Any]]]:
    return [(s, {k: v for k, v in m.items() if k.startswith(prefix)}) for s, m in logger.records
            if any(k.startswith(prefix) for k in m)]


# -- the switch ----------------------------------------------------------------------------------------------------
def test_flags_follow_the_consumers_cadence_and_are_written_only_on_changes(tmp_path, monkeypatch):
    writes: list[bool] = []
    real = fake_quant_module.set_track_stats

    def counting(qs, on, record=None):
        writes.append(on)
        real(qs, on, record)

    monkeypatch.setattr(fake_quant_module, "set_track_stats", counting)
    probe = FlagProbe()
    module, _, trainer = run(tmp_path, [StabilityCallback(every_n_steps=3),
                                        FallbackCallback(enabled=True, check_every_n_steps=4, patience=100),
                                        FlipCallback(every_n_steps=1), DivergenceCallback(), probe], 12)
    on_steps = [g for g, on in probe.train if on]
    assert [on for _, on in probe.train] == [(g + 1) % 3 == 0 or (g + 1) % 4 == 0 for g in range(12)]
    assert on_steps == [2, 3, 5, 7, 8, 11]
    # the flags are written at the first batch and then only when the answer changes (F F T T F T F T T F F T);
    # at train end they are on already, so nothing is written then
    assert writes == [False, True, False, True, False, True, False, True]
    assert flags(module.model) is True  # after training: the quantizers' default again
    assert {q.stats_step for q in quantizers(module.model)} == {11}


def test_without_consumers_statistics_are_never_computed(tmp_path):
    probe = FlagProbe()
    module, _, _ = run(tmp_path, [FlipCallback(every_n_steps=2), DivergenceCallback(),
                                  FallbackCallback(enabled=False), RangeClipCallback(enabled=False), probe], 5)
    assert [on for _, on in probe.train] == [False] * 5
    qs = quantizers(module.model)
    assert all(torch.equal(q.stats, torch.zeros(len(STAT_NAMES))) for q in qs)  # never written
    assert {q.stats_step for q in qs} == {None}


def test_always_leaves_every_call_recording(tmp_path):
    probe = FlagProbe()
    run(tmp_path, [StabilityCallback(every_n_steps=3), probe], 4, stats="always")
    assert [on for _, on in probe.train] == [True] * 4


class ValLM(TinyLM):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self.model(x)
        self.log("val/loss", F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)))


def test_validation_and_the_sanity_check_run_without_statistics(tmp_path):
    torch.manual_seed(0)
    module = ValLM(tiny_gpt(fmt=None))
    probe = FlagProbe()
    stability = StabilityCallback(every_n_steps=3)
    trainer = L.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=RecordingLogger(),
                        callbacks=[switch(tmp_path), stability, probe], enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, val_check_interval=3,
                        limit_val_batches=2, num_sanity_val_steps=1, log_every_n_steps=1,
                        default_root_dir=str(tmp_path))
    trainer.fit(module, train_dataloaders=token_loader(), val_dataloaders=token_loader(n=8))
    assert probe.val == [False] * (1 + 2 + 2)  # sanity check, then validation after steps 3 and 6
    assert [on for _, on in probe.train] == [False, False, True, False, False, True]
    qs = quantizers(module.model)
    # the last recorded statistics are the training step's (validation did not overwrite them)
    assert {q.stats_step for q in qs} == {5}


def test_the_needs_of_each_consumer():
    logger = RecordingLogger()
    trainer = fake_trainer(logger, step=5)
    assert StabilityCallback(every_n_steps=3).needs_quant_stats(trainer)  # this batch completes step 6
    assert not StabilityCallback(every_n_steps=4).needs_quant_stats(trainer)
    assert FallbackCallback(enabled=True, check_every_n_steps=2).needs_quant_stats(trainer)
    assert not FallbackCallback(enabled=False, check_every_n_steps=2).needs_quant_stats(trainer)
    assert not FallbackCallback(enabled=True, check_every_n_steps=5).needs_quant_stats(trainer)
    trainer.accumulate_grad_batches = 2  # micro-batches that do not step end with global_step still 5
    assert FallbackCallback(enabled=True, check_every_n_steps=5).needs_quant_stats(trainer)
    trainer.sanity_checking = True
    assert not StabilityCallback(every_n_steps=3).needs_quant_stats(trainer)
    trainer.sanity_checking = False
    for kind, needed in (("tensor", False), ("delayed", False), ("none", False), ("channel", True),
                         ("block", True)):
        root = torch.nn.Module()
        root.fc = QuantLinear(torch.nn.Linear(4, 2), "fc", grad=QuantSpec(get_format("e5m2"),
                                                                          scaling=ScalingSpec(kind)))
        trainer.lightning_module = type("M", (), {"model": root})()
        assert RangeClipCallback(enabled=True).needs_quant_stats(trainer) is needed, kind
        assert not RangeClipCallback(enabled=False).needs_quant_stats(trainer)
    for cb in (FlipCallback(), DivergenceCallback()):
        assert not hasattr(cb, "needs_quant_stats")


def test_bad_stats_policy_fails_with_a_clear_message():
    with pytest.raises(ValueError, match="quant.stats='sometimes' is not valid; valid: demand, always"):
        FakeQuantCallback(E4M3, {"base_rules": []}, stats="sometimes")


# -- every diagnostic unchanged ------------------------------------------------------------------------------------
def test_stability_and_flips_log_the_same_values_as_with_statistics_always_on(tmp_path):
    runs = {}
    for stats in ("always", "demand"):
        callbacks = [StabilityCallback(every_n_steps=3), FlipCallback(every_n_steps=2), DivergenceCallback()]
        runs[stats] = run(tmp_path / stats, callbacks, 10, fmt=DELAYED, stats=stats, dropout=0.1)
    (m_always, log_always, _), (m_demand, log_demand, _) = runs["always"], runs["demand"]
    stability = metrics(log_always, "stability/")
    assert [s for s, _ in stability] == [3, 6, 9]
    assert stability == metrics(log_demand, "stability/")
    assert len(stability[0][1]) == 9 * 3 * 6 + 9  # 9 Linears x (weight, input, grad) x 6 stats + range use
    assert any(v > 0 for v in stability[-1][1].values() if v == v)
    flips = metrics(log_always, "flips/")
    assert len(flips) == 5 and flips == metrics(log_demand, "flips/")
    assert log_always.series("train/loss") == log_demand.series("train/loss")
    for (name, a), b in zip(m_always.state_dict().items(), m_demand.state_dict().values()):
        if not name.endswith(".stats"):
            assert torch.equal(a, b), name
    # the demand run did skip them: its buffers are from step 8 (due), the always run's from step 9
    qs_always, qs_demand = quantizers(m_always.model), quantizers(m_demand.model)
    assert {q.stats_step for q in qs_demand} == {8}
    assert any(not torch.equal(a.stats, b.stats) for a, b in zip(qs_always, qs_demand))


def test_fallback_still_switches_a_persistently_saturating_role(tmp_path):
    events = {}
    for stats in ("always", "demand"):
        fallback = FallbackCallback(enabled=True, check_every_n_steps=2, patience=2, overflow_format="e5m2")
        module, _, _ = run(tmp_path / stats, [fallback, FlipCallback(every_n_steps=5)], 6, fmt=UNSCALED,
                           stats=stats, attach=scale_input("transformer.h.0.mlp.c_fc", 1e4))
        events[stats] = fallback.events
        assert module.model.get_submodule("transformer.h.0.mlp.c_fc").input_q.spec.format.name == "e5m2"
    assert events["demand"] == events["always"]
    assert {"step": 4, "layer": "transformer.h.0.mlp.c_fc", "role": "input", "reason": "overflow",
            "from": "e4m3", "to": "e5m2"} in events["demand"]


def test_range_clip_clips_with_the_scale_of_the_steps_backward(tmp_path):
    states, logs = {}, {}
    for stats in ("always", "demand"):
        clip = RangeClipCallback(enabled=True, margin=20, every_n_steps=2)
        module, logger, _ = run(tmp_path / stats, [clip], 6, stats=stats)
        states[stats], logs[stats] = module.state_dict(), metrics(logger, "clip/")
        assert clip.total > 0
    assert logs["demand"] == logs["always"] and len(logs["demand"]) == 3
    for name, a in states["always"].items():
        if not name.endswith(".stats"):
            assert torch.equal(a, states["demand"][name]), name


# -- divergence: the cause from the diverged step's statistics -------------------------------------------------------
class WeightProbe(L.Callback):
    """Keeps the weights at every batch start, to check what a replay saw."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.weights = {k: v.detach().clone() for k, v in pl_module.model.named_parameters()}


def replays_before_the_step(monkeypatch, probe: WeightProbe) -> list[int]:
    """Patch replay_with_stats to check that the weights are those of the step's forward; returns the replayed steps."""
    steps: list[int] = []
    real = divergence_module.replay_with_stats

    def checked(trainer, pl_module, *args, **kwargs):
        for k, v in pl_module.model.named_parameters():
            assert torch.equal(v.detach(), probe.weights[k]), f"replay after the optimizer step ({k})"
        steps.append(trainer.global_step)
        return real(trainer, pl_module, *args, **kwargs)

    monkeypatch.setattr(divergence_module, "replay_with_stats", checked)
    return steps


def test_a_nan_step_without_statistics_is_replayed_to_name_its_cause(tmp_path, monkeypatch):
    probe = WeightProbe()
    replayed = replays_before_the_step(monkeypatch, probe)
    summaries = {}
    for stats in ("always", "demand"):
        div = DivergenceCallback(factor=3.0, patience=5)
        flag_probe = FlagProbe()
        module, _, trainer = run(tmp_path / stats, [div, probe, flag_probe, StabilityCallback(every_n_steps=4)], 20,
                                 stats=stats, attach=nan_into("transformer.h.1.mlp.c_fc", at_step=5))
        summaries[stats] = module.run_summary
        assert trainer.global_step == 6
        assert all(torch.isfinite(p).all() for p in module.parameters())
        assert div.replays == (1 if stats == "demand" else 0)
        if stats == "demand":
            assert flag_probe.train[5] == (5, False)  # the diverging step ran without statistics
    assert replayed == [5]
    assert summaries["demand"]["diverged_at_step"] == 5
    assert summaries["demand"]["divergence_cause"].startswith("transformer.h.1.mlp.c_fc/input: non-finite")
    assert summaries["demand"]["divergence_cause"] == summaries["always"]["divergence_cause"]


# Unscaled: the blown-up input saturates from step 4 on, the detector fires at step 5 (patience 2). Delayed scaling:
# the input grows 100x per step from step 4 on, so every step scales it from an amax history that has not seen its
# growth and saturates; the replay must start from the scalers' state before the step's forward to see that.
@pytest.mark.parametrize("fmt,growth", [(UNSCALED, 1.0), (DELAYED, 100.0)], ids=["unscaled", "delayed"])
def test_a_loss_blow_up_without_statistics_names_the_saturating_layer_from_the_pre_step_weights(
        tmp_path, monkeypatch, fmt, growth):
    probe = WeightProbe()
    replayed = replays_before_the_step(monkeypatch, probe)
    summaries = {}
    for stats in ("always", "demand"):
        div = DivergenceCallback(factor=3.0, patience=2)
        module, _, trainer = run(tmp_path / stats, [div, probe], 20, fmt=fmt, stats=stats,
                                 attach=scale_input("lm_head", 1e3, from_step=4, growth=growth))
        summaries[stats] = module.run_summary
        step = module.run_summary["diverged_at_step"]
        assert step == (5 if growth == 1.0 else 6) and trainer.global_step == step + 1
    assert replayed == [step]
    cause = summaries["demand"]["divergence_cause"]
    assert cause.startswith("lm_head/input: saturated (") and "(trigger: loss " in cause
    assert cause == summaries["always"]["divergence_cause"]


def test_a_replay_records_the_steps_statistics_and_leaves_everything_else_as_it_was(tmp_path):
    torch.manual_seed(3)
    model = tiny_gpt(fmt=DELAYED, dropout=0.1)
    x = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(2))
    for _ in range(3):  # some amax history
        F.cross_entropy(model(x).reshape(-1, 32), y.reshape(-1)).backward()
    with torch.no_grad():  # then a jump of every amax: the step scales from a history that has not seen it
        for p in model.parameters():
            p.mul_(8.0)
    reference = copy.deepcopy(model)  # the same step with statistics on
    qs = quantizers(model)
    record = StatsRecord()
    for q in qs:
        q.track_stats, q.stats_record = False, record
    scaler_state = [(b, b.clone()) for q in qs if q.spec.scaling.kind == "delayed" for b in q.scaler.state()]
    torch.manual_seed(11)
    rng = capture_rng(torch.device("cpu"))
    F.cross_entropy(model(x).reshape(-1, 32), y.reshape(-1)).backward()  # the step, without statistics
    torch.manual_seed(11)
    F.cross_entropy(reference(x).reshape(-1, 32), y.reshape(-1)).backward()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    next_draw = torch.get_rng_state()
    module = TinyLM(model)
    replay_with_stats(None, module, (x, y), rng, scaler_state, step=4)
    for k, v in model.state_dict().items():
        if k.endswith(".stats"):
            assert torch.equal(v, reference.state_dict()[k]), k  # exactly the statistics of the step
        else:
            assert torch.equal(v, before[k]), k  # scaler state (amax histories) as before the replay
    assert all(torch.equal(p.grad, grads[k]) for k, p in model.named_parameters())
    assert torch.equal(torch.get_rng_state(), next_draw)
    assert all(not q.track_stats for q in qs) and record.step == 4
    assert any(float(q.stats[STAT_NAMES.index("amax")]) > 0 for q in qs)


# -- torch.compile ---------------------------------------------------------------------------------------------------
@pytest.mark.slow  # dynamo + AOTAutograd trace the quantized model twice: ~1-2 min on a shared 2-core CPU
def test_a_compiled_model_has_two_graphs_without_breaks_and_logs_the_same_statistics(tmp_path):
    import torch._dynamo

    def make(compiled: bool) -> TinyLM:
        torch.manual_seed(0)
        model = tiny_gpt(fmt=E4M3, n_layer=1)
        model.forward(torch.zeros(1, 8, dtype=torch.long))  # quantizer kernels built once, outside tracing
        if compiled:
            model.compile(backend="aot_eager", fullgraph=True)  # fullgraph: any graph break is an error
        return TinyLM(model)

    def callbacks(stats: str) -> list:
        return [FakeQuantCallback(E4M3, {"base_rules": []}, run_dir=tmp_path, stats=stats),
                StabilityCallback(every_n_steps=2), FlipCallback(every_n_steps=2), DivergenceCallback()]

    eager_log = RecordingLogger()
    torch.manual_seed(1)
    fit(make(False), callbacks("always"), 4, tmp_path / "eager", logger=eager_log)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps them; graphs of earlier tests must not count
    compiled = make(True)
    log = RecordingLogger()
    torch.manual_seed(1)
    fit(compiled, callbacks("demand"), 4, tmp_path / "compiled", logger=log)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2  # statistics off and on
    assert metrics(log, "stability/") == metrics(eager_log, "stability/") and len(metrics(log, "stability/")) == 2
    assert metrics(log, "flips/") == metrics(eager_log, "flips/")
    # a divergence replay runs the compiled graph with statistics: no further compilation
    qs = quantizers(compiled.model)
    for q in qs:
        q.track_stats = False
        q.stats.zero_()
    x = torch.randint(0, 32, (4, 8))
    replay_with_stats(None, compiled, (x, x), None, None)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2
    assert all(float(q.stats[STAT_NAMES.index("scale")]) > 0 for q in qs)

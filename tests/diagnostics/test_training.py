"""Instruments inside real Lightning training: shadow-gradient fidelity, no side effects, divergence handling."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint

from altgrad.callbacks.activations import ActivationCallback
from altgrad.callbacks.attention import AttentionCallback
from altgrad.callbacks.bits import BitsCallback
from altgrad.callbacks.divergence import DivergenceCallback
from altgrad.callbacks.flips import FlipCallback
from altgrad.callbacks.gradients import GradientCallback
from altgrad.callbacks.rank import RankCallback
from altgrad.callbacks.stability import StabilityCallback
from altgrad.diagnostics import cosine, snr_db

from diag_helpers import E4M3, RecordingLogger, TinyLM, fake_trainer, fit, tiny_gpt


class Holder(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.run_summary: dict = {}


def lm_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
    linears = [m for m in model.modules() if hasattr(m, "weight") and isinstance(m.weight, torch.nn.Parameter)
               and m.weight.dim() == 2 and not isinstance(m, torch.nn.Embedding)]
    return list(torch.autograd.grad(loss, [m.weight for m in linears]))


def test_shadow_gradients_without_quantization_are_exact(tmp_path):
    logger = RecordingLogger()
    fit(TinyLM(tiny_gpt(fmt=None)), [GradientCallback(every_n_steps=1, fidelity_every_n_steps=2)], 4, tmp_path,
        logger=logger)
    got = logger.last()
    cos = {k: v for k, v in got.items() if k.startswith("gradfid/") and k.endswith("/cosine")}
    snr = {k: v for k, v in got.items() if k.startswith("gradfid/") and k.endswith("/snr_db")}
    assert len(cos) == len(snr) == 2 * 4 + 1  # four Linears per block, plus lm_head
    assert all(v == 1.0 for v in cos.values()), cos
    assert all(v == math.inf for v in snr.values()), snr
    assert [s for s, _ in logger.series("gradfid/lm_head/grad/cosine")] == [2, 4]


def test_shadow_gradients_match_an_independent_unquantized_backward():
    model = tiny_gpt(fmt=E4M3)
    x = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(2))
    reference = copy.deepcopy(model)
    for m in reference.modules():
        if hasattr(m, "enabled"):
            m.enabled = False
    ref_grads = lm_grads(reference, x, y)
    q_grads = lm_grads(copy.deepcopy(model), x, y)
    names = ["transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj", "transformer.h.0.mlp.c_fc",
             "transformer.h.0.mlp.c_proj", "transformer.h.1.attn.c_attn", "transformer.h.1.attn.c_proj",
             "transformer.h.1.mlp.c_fc", "transformer.h.1.mlp.c_proj", "lm_head"]
    # the training step's gradients (quantized forward and backward) are in .grad when the hook runs
    logits = model(x)
    F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)).backward()
    grads_before = {n: model.get_submodule(n).weight.grad.clone() for n in names}
    buffers_before = {k: v.clone() for k, v in model.state_dict().items()}
    module = Holder(model)
    logger = RecordingLogger()
    trainer = fake_trainer(logger)
    cb = GradientCallback(every_n_steps=1, fidelity_every_n_steps=1)
    cb.on_train_batch_start(trainer, module, (x, y), 0)
    cb.on_before_optimizer_step(trainer, module, None)
    trainer.global_step = 1
    cb.on_train_batch_end(trainer, module, None, (x, y), 0)
    got = logger.last()
    for name, g_ref, g_q in zip(names, ref_grads, q_grads):
        assert torch.equal(model.get_submodule(name).weight.grad, grads_before[name])  # .grad untouched
        assert torch.equal(g_q, grads_before[name])
        expected_snr = 10 * math.log10(float((g_ref**2).sum() / ((g_q - g_ref) ** 2).sum()))
        expected_cos = float((g_ref * g_q).sum() / (g_ref.norm() * g_q.norm()))
        assert got[f"gradfid/{name}/grad/snr_db"] == pytest.approx(expected_snr, rel=1e-4)
        assert got[f"gradfid/{name}/grad/cosine"] == pytest.approx(expected_cos, rel=1e-5)
        assert got[f"gradfid/{name}/grad/cosine"] < 1.0
        assert got[f"grads/{name}/weight/norm"] == pytest.approx(float(g_q.norm()), rel=1e-5)
    for k, v in model.state_dict().items():
        assert torch.equal(v, buffers_before[k]), k
    assert module.run_summary["diagnostics"]["min_grad_cosine"] == pytest.approx(
        min(v for k, v in got.items() if k.endswith("/cosine")))
    assert cosine(ref_grads[0], q_grads[0]).item() == pytest.approx(got[f"gradfid/{names[0]}/grad/cosine"])
    assert snr_db(ref_grads[0], q_grads[0]).item() == pytest.approx(got[f"gradfid/{names[0]}/grad/snr_db"])


def every_instrument() -> list:
    return [StabilityCallback(every_n_steps=1), FlipCallback(every_n_steps=2), BitsCallback(every_n_steps=2),
            RankCallback(every_n_steps=3), ActivationCallback(every_n_steps=2), AttentionCallback(every_n_steps=2),
            GradientCallback(every_n_steps=1, fidelity_every_n_steps=2), DivergenceCallback()]


def test_instruments_do_not_change_training(tmp_path):
    fmt = dict(E4M3, rounding="stochastic", scaling={"kind": "delayed", "pow2": True})
    plain = TinyLM(tiny_gpt(fmt=fmt, dropout=0.1))
    observed = TinyLM(tiny_gpt(fmt=fmt, dropout=0.1))
    log_plain, log_observed = RecordingLogger(), RecordingLogger()
    torch.manual_seed(7)
    fit(plain, [], 6, tmp_path / "a", logger=log_plain)
    torch.manual_seed(7)
    fit(observed, every_instrument(), 6, tmp_path / "b", logger=log_observed)
    for (name, a), b in zip(plain.state_dict().items(), observed.state_dict().values()):
        assert torch.equal(a, b), name
    assert [v for _, v in log_plain.series("train/loss")] == [v for _, v in log_observed.series("train/loss")]
    diag = observed.run_summary["diagnostics"]
    for key in ("mean_stall_ratio", "final_flip_rate", "mean_oscillation_rate", "min_grad_cosine",
                "mean_effective_bits", "max_kurtosis", "min_stable_rank_rel", "min_attn_entropy"):
        assert key in diag, key
    assert 0.0 <= diag["final_flip_rate"] <= 1.0
    assert 0.0 < diag["mean_effective_bits"] <= 8.0


def nan_into(layer_name: str, at_step: int):
    """Forward pre-hook factory: NaN into one layer's input at one step (a layer that blows up)."""

    def attach(module: TinyLM) -> None:
        layer = module.model.get_submodule(layer_name)

        def hook(_m, args):
            if module.trainer.global_step == at_step:
                return (args[0] * float("nan"),)
            return None

        layer.register_forward_pre_hook(hook)

    return attach


def test_nan_divergence_stops_cleanly_and_keeps_the_last_good_checkpoint(tmp_path):
    module = TinyLM(tiny_gpt(fmt=E4M3))
    nan_into("transformer.h.1.mlp.c_fc", at_step=5)(module)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True, every_n_train_steps=2)
    div = DivergenceCallback(factor=3.0, patience=5)
    trainer = fit(module, [div, ckpt], 20, tmp_path, enable_checkpointing=True)
    summary = module.run_summary
    assert summary["status"] == "diverged"
    assert summary["diverged_at_step"] == 5
    assert summary["divergence_cause"].startswith("transformer.h.1.mlp.c_fc/input: non-finite")
    assert trainer.global_step == 6  # stopped right after the bad step
    assert all(torch.isfinite(p).all() for p in module.parameters())  # the NaN step was not applied
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 4
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values() if v.is_floating_point())


def test_loss_blow_up_divergence_names_the_loss_without_quantizers(tmp_path):
    def blow_up(module, loss):
        return loss * 1000 if module.trainer.global_step >= 6 else loss

    module = TinyLM(tiny_gpt(fmt=None), hook=blow_up)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True, every_n_train_steps=2)
    trainer = fit(module, [DivergenceCallback(factor=3.0, patience=4), ckpt], 30, tmp_path,
                  enable_checkpointing=True)
    summary = module.run_summary
    assert summary["status"] == "diverged" and summary["diverged_at_step"] == 9
    assert summary["divergence_cause"].startswith("loss ") and "for 4 steps" in summary["divergence_cause"]
    assert trainer.global_step == 10
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 8


def test_an_overflowing_gradient_names_the_layer_nearest_the_loss(tmp_path):
    class InfiniteGradient(torch.autograd.Function):
        """Identity forward (a finite loss); infinite gradient backward."""

        @staticmethod
        def forward(ctx, x):  # noqa: ANN001, ANN205
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):  # noqa: ANN001, ANN205
            return g * float("inf")

    def overflow(module, loss):
        return InfiniteGradient.apply(loss) if module.trainer.global_step == 3 else loss

    module = TinyLM(tiny_gpt(fmt=None), hook=overflow)
    trainer = fit(module, [DivergenceCallback()], 10, tmp_path)
    summary = module.run_summary
    assert summary["status"] == "diverged" and summary["diverged_at_step"] == 3
    assert summary["divergence_cause"].startswith("lm_head/grad: non-finite weight gradient "
                                                  "(trigger: non-finite gradient norm")
    assert trainer.global_step == 4
    assert all(torch.isfinite(p).all() for p in module.parameters())


def test_a_healthy_run_is_not_flagged(tmp_path):
    module = TinyLM(tiny_gpt(fmt=E4M3))
    trainer = fit(module, [DivergenceCallback(factor=3.0, patience=2)], 8, tmp_path)
    assert trainer.global_step == 8
    assert "status" not in module.run_summary


@pytest.mark.slow  # dynamo traces the quantized model: ~40-100 s on a shared 2-core CPU
def test_instruments_add_no_graph_breaks_or_recompiles_to_a_compiled_model(tmp_path):
    import torch._dynamo

    model = tiny_gpt(fmt=E4M3, n_layer=1)
    model.forward(torch.zeros(1, 8, dtype=torch.long))  # quantizer kernels built once, outside tracing
    model.compile(backend="eager", fullgraph=True)  # fullgraph: any graph break is an error
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps them; graphs of earlier tests must not count
    with torch._dynamo.config.patch(error_on_recompile=True):
        trainer = fit(TinyLM(model), every_instrument(), 3, tmp_path)
    assert trainer.global_step == 3
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1

"""The step's gradient norm computed once: the divergence check's norm reused by clipping, with the same bits."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from altgrad.callbacks.divergence import DivergenceCallback
from altgrad.grad_norm import StepGradNorm
from altgrad.model import GPTConfig
from altgrad.module import AltGradModule, WarmupCosine


def grads(n: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(5, 4, generator=g) for _ in range(n)]


def test_the_kept_norm_is_torchs_and_is_used_once():
    gs = grads()
    cache = StepGradNorm()
    norm = cache.compute(gs, step=7)
    assert torch.equal(norm, torch.nn.utils.get_total_norm(gs))
    assert cache.take(gs, step=7) is norm
    assert cache.take(gs, step=7) is None  # one use


@pytest.mark.parametrize("change", ["in place", "replaced", "dropped", "next step"])
def test_the_kept_norm_is_not_used_once_the_gradients_changed(change):
    gs = grads()
    cache = StepGradNorm()
    cache.compute(gs, step=3)
    step = 3
    if change == "in place":
        gs[1].mul_(0.5)  # e.g. a callback that clips each gradient
    elif change == "replaced":
        gs[1] = gs[1] * 0.5
    elif change == "dropped":
        gs = gs[:2]
    else:
        step = 4
    assert cache.take(gs, step=step) is None


def fit(tmp_path, callbacks, clip: float, steps: int = 4) -> tuple[AltGradModule, int]:
    """A tiny GPT trained ``steps`` steps with Lightning's norm clipping; (module, norms reused by clipping)."""
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=8, vocab_size=32, n_layer=1, n_head=2, n_embd=16)
    module = AltGradModule(cfg, {"_target_": "torch.optim.SGD", "name": "sgd", "lr": 0.5}, WarmupCosine(0, steps, 0.1))
    reused = 0
    take = module.grad_norm.take

    def counting_take(gs, step):
        nonlocal reused
        norm = take(gs, step)
        reused += norm is not None
        return norm

    module.grad_norm.take = counting_take
    x = torch.randint(0, 32, (16, 8), generator=torch.Generator().manual_seed(1))
    data = DataLoader(TensorDataset(x, torch.roll(x, -1, 1)), batch_size=4)
    trainer = L.Trainer(max_steps=steps, gradient_clip_val=clip, callbacks=callbacks, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, default_root_dir=tmp_path, accelerator="cpu")
    trainer.fit(module, data)
    return module, reused


def test_clipping_with_the_divergence_checks_norm_gives_the_same_weights(tmp_path):
    # a clip far below the gradients' norm: every step is scaled (SGD: the weights move by the clipped gradients),
    # so a norm off by one bit changes the weights
    plain, reused_plain = fit(tmp_path / "a", [], clip=1e-3)
    shared, reused = fit(tmp_path / "b", [DivergenceCallback()], clip=1e-3)
    assert reused_plain == 0 and reused == 4
    for (name, a), (_, b) in zip(plain.state_dict().items(), shared.state_dict().items(), strict=True):
        assert torch.equal(a, b), name

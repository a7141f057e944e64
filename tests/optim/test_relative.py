"""RelativeAdamW (the relative-step control) and the plain groups every arm shares with its AdamW baseline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from optim_helpers import PLAIN, TinyNet, quantizer

from altgrad.callbacks.fake_quant import FakeQuantCallback
from altgrad.model import GPT, GPTConfig
from altgrad.optim import ManifoldAdamW, QuantAwareOptimizer, RelativeAdamW, build_optimizer
from altgrad.optim.relative import _relative_step

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_one_step_is_adamw_with_per_coordinate_lr_proportional_to_abs_w():
    w0 = torch.tensor([0.5, -0.25, 3.0, -1e-3, 0.0])
    g = torch.tensor([1.0, 2.0, -0.5, 4.0, 1.0])
    p = torch.nn.Parameter(w0.clone())
    lr, wd = 0.1, 0.2
    opt = RelativeAdamW([p], lr=lr, eps=0.0, weight_decay=wd)  # no grids: every parameter takes the rule
    p.grad = g
    opt.step()
    # first step: m̂ = g, √v̂ = |g|, so Δw = −lr·|w|·sign(g) − lr·|w|·wd·w
    expected = w0 - lr * w0.abs() * wd * w0 - lr * w0.abs() * torch.sign(g)
    assert torch.allclose(p.detach(), expected, rtol=1e-6, atol=0)
    assert p.detach()[-1].item() == 0.0  # |w| = 0: the step is 0 (and no NaN)


@settings(max_examples=40, deadline=None)
@given(k=st.integers(-20, 20), seed=st.integers(0, 2**16), steps=st.integers(1, 4))
def test_the_step_is_exactly_proportional_to_w(k, seed, steps):
    """Scaling w by 2^k scales every step by 2^k, bit for bit (eps = 0 and no decay: the decay, at the rate
    lr·|w|, is ∝ |w|·w, as manifold's lr·S(w)·w is)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(64, generator=gen)
    grads = [torch.randn(64, generator=gen) for _ in range(steps)]

    def run(w0: torch.Tensor) -> torch.Tensor:
        p = torch.nn.Parameter(w0.clone())
        opt = RelativeAdamW([p], lr=0.03, eps=0.0, weight_decay=0.0)
        for g in grads:
            p.grad = g.clone()
            opt.step()
        return p.detach()

    assert torch.equal(run(w * 2.0**k), run(w) * 2.0**k)


def test_the_step_does_not_depend_on_the_format():
    """The control has no grid in it: e4m3, e5m2 and e7m0 grids give the same weights, bit for bit."""
    results = []
    for fmt in ("e4m3", "e5m2", "e7m0"):
        torch.manual_seed(0)
        net = TinyNet(fmt)
        from altgrad.quant.layers import weight_grids

        opt = RelativeAdamW(net.parameters(), lr=0.05, weight_decay=0.1, grids=weight_grids(net), **PLAIN)
        gen = torch.Generator().manual_seed(1)
        for _ in range(3):
            for q in net.parameters():
                q.grad = torch.randn(q.shape, generator=gen)
            opt.step()
        results.append([q.detach().clone() for q in net.parameters()])
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def test_relative_differs_from_manifold_only_by_the_stiffness():
    """manifold[update] with a grid whose ULP at every weight is |w|·2^-M·c would be the control at lr·2^-M·c;
    on weights at binade bottoms (|w| = 2^e) the e4m3 ULP is exactly |w|·2^-3, so the two agree there."""
    w0 = torch.tensor([1.0, -0.5, 0.25, 2.0, -4.0])
    g = torch.tensor([1.0, -2.0, 0.5, 3.0, -1.0])
    p, q = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    manifold = ManifoldAdamW([p], lr=1.0, eps=0.0, grids={p: quantizer("e4m3")})
    relative = RelativeAdamW([q], lr=2.0**-3, eps=0.0)
    p.grad, q.grad = g.clone(), g.clone()
    manifold.step()
    relative.step()
    assert torch.equal(p.detach(), q.detach())


def test_compiled_step_matches_the_eager_one(monkeypatch):
    def run(compiled: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        net = TinyNet("e4m3", dim=16)
        from altgrad.quant.layers import weight_grids

        opt = RelativeAdamW(net.parameters(), lr=0.05, weight_decay=0.1, grids=weight_grids(net),
                            kernel="compiled" if compiled else "eager", **PLAIN)
        gen = torch.Generator().manual_seed(1)
        for step in range(4):
            for group in opt.param_groups:
                group["lr"] = 0.05 * (step + 1) / 4 if not group["plain"] else 1e-3
            for q in net.parameters():
                q.grad = torch.randn(q.shape, generator=gen)
            opt.step()
        return [q.detach().clone() for q in net.parameters()]

    eager = run(False)
    _relative_step._failed.clear()
    compiled = run(True)
    assert "cpu" in _relative_step._compiled and not _relative_step._failed
    for a, b in zip(eager, compiled):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)


def test_bad_hyper_parameters_are_refused_in_one_line():
    p = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match=r"lr=0 is not valid; valid: > 0"):
        RelativeAdamW([p], lr=0)
    with pytest.raises(ValueError, match=r"betas=\(0.9, 1.0\) are not valid"):
        RelativeAdamW([p], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match=r"plain_weight_decay=-1 is not valid"):
        RelativeAdamW([p], plain_weight_decay=-1)


# -- the plain groups: one source, the AdamW baseline ---------------------------------------------------------------
def composed_optimizer(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides))
    return OmegaConf.to_container(cfg.optimizer, resolve=True)


def quantized_gpt() -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16, bias=True))
    FakeQuantCallback({"name": "e4m3", "grad": None, "rounding": "nearest", "overflow": "saturate",
                       "scaling": {"kind": "tensor", "pow2": True}}, {"base_rules": []}).apply(model)
    return model


ARMS = ["manifold", "manifold_grad", "relative", "grid", "grid_real", "madam"]


@pytest.mark.parametrize("arm", ARMS)
@pytest.mark.parametrize("baseline", [[], ["baseline.lr=2e-3", "baseline.betas=[0.8,0.95]", "baseline.eps=1e-6",
                                           "baseline.weight_decay=0.05"]])
def test_every_arm_steps_its_plain_parameters_exactly_as_the_adamw_baseline(arm, baseline):
    """Same gradients in → the grid-less tensors of every arm end bit for bit where the AdamW baseline puts them,
    whatever the baseline's hyper-parameters (one source: the top-level `baseline`)."""
    base_model, arm_model = quantized_gpt(), quantized_gpt()
    adamw, _ = build_optimizer(composed_optimizer("optimizer=adamw", *baseline), base_model)
    opt, info = build_optimizer(composed_optimizer(f"optimizer={arm}", *baseline), arm_model)
    assert isinstance(opt, QuantAwareOptimizer) and info["plain_params"]
    for group in adamw.param_groups:
        group["foreach"] = True  # the multi-tensor arithmetic the plain groups copy bit for bit
    gen = torch.Generator().manual_seed(0)
    base_params, arm_params = dict(base_model.named_parameters()), dict(arm_model.named_parameters())
    for _ in range(3):
        for name, p in base_params.items():
            g = torch.randn(p.shape, generator=gen)
            p.grad, arm_params[name].grad = g.clone(), g.clone()
        adamw.step()
        opt.step()
    for name in info["plain_params"]:
        assert torch.equal(arm_params[name], base_params[name]), name


def test_a_command_line_lr_changes_the_adamw_arm_only():
    assert composed_optimizer("optimizer=adamw", "optimizer.lr=1e-4")["lr"] == 1e-4
    manifold = composed_optimizer("optimizer=manifold", "baseline.lr=1e-4")
    assert manifold["plain_lr"] == 1e-4 and manifold["lr"] == 1.0


# -- through the real entry point -----------------------------------------------------------------------------------
TINY = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=32", "data.batch_size=4",
        "data.corpus_chars=200000", "data.val_batches=2", "schedule.warmup_steps=1", "trainer.max_steps=3",
        "trainer.val_check_interval=3", "trainer.checkpoint_every_n_steps=3", "trainer.sample_tokens=0",
        "logger=csv", "callbacks=none"]


@pytest.mark.slow
def test_the_control_trains_through_the_entry_point_on_the_wide_reference(tmp_path):
    """optimizer=relative on format=bf16_ref: a completed run whose grid-less tensors took the baseline's lr."""
    env = {**os.environ, "ALTGRAD_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "offline",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HYDRA_FULL_ERROR": "0"}
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "altgrad.train", *TINY, "optimizer=relative", "format=bf16_ref",
                           "baseline.lr=2e-3", f"hydra.run.dir={run_dir}"], cwd=CONF.parent, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["optimizer_label"] == "relative"
    groups = summary["optimizer_groups"]  # rule: the block's 4 matmul weights and wte (tied to the quantized head)
    assert groups["plain_lr"] == 2e-3 and groups["rule_tensors"] == 5
    assert summary["config"]["format"]["name"] == "bf16" and summary["config"]["format"]["grad"] is None
    assert summary["format"] == "bf16_ref" and summary["run_name"].split("-")[1] == "bf16_ref"  # not format=bf16's

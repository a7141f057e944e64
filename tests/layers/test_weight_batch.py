"""WeightBatch: the model's weights quantized up front in one fused call per configuration, same results."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from altgrad.callbacks.fake_quant import FakeQuantCallback
from altgrad.model import GPT, GPTConfig
from altgrad.quant.layers import WeightBatch, iter_quant_linears


@pytest.fixture(autouse=True, params=["eager", pytest.param("compiled", marks=pytest.mark.slow)])
def _compile(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    # eager: the same Python functions; compiled (slow, ≈ 1 min per configuration set): the fused calls with
    # their in-place buffer writes as inductor builds them
    monkeypatch.setenv("ALTGRAD_COMPILE", "1" if request.param == "compiled" else "0")


def model_pair(fmt: dict, rules: list | None = None) -> tuple[GPT, GPT]:
    torch.manual_seed(0)
    base = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32))
    batched, plain = copy.deepcopy(base), copy.deepcopy(base)
    FakeQuantCallback(fmt, {"base_rules": rules or []}).apply(batched)
    FakeQuantCallback(fmt, {"base_rules": rules or []}).apply(plain)
    hooks = [h for h in plain._forward_pre_hooks.values() if isinstance(h, WeightBatch)]
    assert len(hooks) == 1 and len(hooks[0].layers) == 9  # 2 blocks × 4 Linears + lm_head
    plain._forward_pre_hooks.clear()  # the reference: every layer quantizes its own weight
    return batched, plain


@pytest.mark.parametrize("scaling", [{"kind": "delayed", "history": 4}, {"kind": "channel", "pow2": False}])
def test_batched_weights_equal_per_layer_calls(scaling: dict) -> None:
    fmt = {"name": "e4m3", "grad": "e5m2", "scaling": scaling}
    rules = [{"match": "*.mlp.*", "weight": "e3m4"}]  # two weight configurations → two batched groups
    batched, plain = model_pair(fmt, rules)
    idx = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))
    for step in range(3):
        for m in (batched, plain):
            m.zero_grad()
            logits = m(idx)
            F.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()
            assert all("_wq" not in q.__dict__ for _, q in iter_quant_linears(m))  # every stash consumed
        for (name, a), (_, b) in zip(batched.named_parameters(), plain.named_parameters()):
            assert torch.equal(a.grad, b.grad), f"grad of {name} differs at step {step}"
        for (name, a), (_, b) in zip(batched.named_buffers(), plain.named_buffers()):
            assert torch.equal(a, b), f"buffer {name} differs at step {step}"
        with torch.no_grad():
            for p in list(batched.parameters()) + list(plain.parameters()):
                p.sub_(0.01 * p.grad.sign())


def test_disabled_quantizers_and_eval_mode_are_respected() -> None:
    batched, plain = model_pair({"name": "e5m2", "grad": "e5m2"})
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(2))
    for m in (batched, plain):
        m.eval()
        for _, q in iter_quant_linears(m):
            if q.name.endswith("c_fc"):
                q.weight_q.enabled = False
    with torch.no_grad():
        assert torch.equal(batched(idx), plain(idx))
    for (name, a), (_, b) in zip(batched.named_buffers(), plain.named_buffers()):
        assert torch.equal(a, b), name


def test_eval_passes_reuse_the_training_call() -> None:
    """Validation and sampling call the batched weights' fused function with the same constant arguments as
    training (one compiled graph for both), and still leave the scaler states alone."""
    import altgrad.quant.quant_call as qc

    calls: list[tuple] = []
    built = qc._build_many

    def spying_build(*key):  # noqa: ANN002, ANN202
        fn = built(*key)
        inner = fn.fn

        def spy(*args):  # noqa: ANN002, ANN202
            calls.append(tuple(a for a in args if not isinstance(a, torch.Tensor) and a is not None))
            return inner(*args)

        fn.fn = spy
        return fn

    qc._MANY.clear()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(qc, "_build_many", spying_build)
            batched, _ = model_pair({"name": "e4m3", "grad": "e5m2", "scaling": {"kind": "delayed", "history": 4}})
            idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(3))
            batched(idx)  # training mode: the scaler states move
            before = {n: b.clone() for n, b in batched.named_buffers()}
            batched.eval()
            with torch.no_grad():
                batched(idx)
    finally:
        qc._MANY.clear()
    assert len(calls) == 2 and calls[0] == calls[1] == (True,)
    for name, b in batched.named_buffers():
        if "stats" not in name:
            assert torch.equal(b, before[name]), f"eval changed {name}"

"""Shared helpers: real weight quantizers (the grids optimizers read) and a tiny quantized model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from altgrad.quant.compiled import compiling
from altgrad.quant import QuantSpec, ScalingSpec, TensorQuantizer, get_format, quantize
from altgrad.quant.layers import QuantLinear

_BASELINE = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "train.yaml").baseline
PLAIN = {"plain_lr": _BASELINE.lr, "plain_betas": tuple(_BASELINE.betas), "plain_eps": _BASELINE.eps}
"""What the optimizer configs pass for parameters without a grid: the AdamW baseline's lr, betas and eps."""


def quantizer(fmt: str, scaling: str = "none") -> TensorQuantizer:
    """A weight TensorQuantizer for preset ``fmt`` (power-of-two scales)."""
    return TensorQuantizer(QuantSpec(get_format(fmt), scaling=ScalingSpec(kind=scaling, pow2=True)), "weight")


def on_grid(w: torch.Tensor, q: TensorQuantizer) -> bool:
    """w equals its own nearest grid value under the scale the forward pass would use now."""
    s = q.scale_for(w)
    return torch.equal(quantize(w * s, q.spec.format, "nearest") / s, w)


class TinyNet(nn.Module):
    """Embedding → LayerNorm → two quantized Linears (one with bias) → head: quantized and plain tensors."""

    def __init__(self, fmt: str = "e4m3", scaling: str = "tensor", vocab: int = 11, dim: int = 8) -> None:
        super().__init__()
        spec = QuantSpec(get_format(fmt), scaling=ScalingSpec(kind=scaling, pow2=True))
        self.wte = nn.Embedding(vocab, dim)
        self.ln = nn.LayerNorm(dim)
        self.fc = QuantLinear(nn.Linear(dim, 2 * dim), "fc", weight=spec)
        self.proj = QuantLinear(nn.Linear(2 * dim, dim, bias=False), "proj", weight=spec)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.ln(self.wte(idx))
        return self.head(h + self.proj(torch.relu(self.fc(h))))

    def loss(self, idx: torch.Tensor) -> torch.Tensor:
        logits = self(idx[:, :-1])
        return nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())


@pytest.fixture(autouse=True)
def _eager_kernels() -> Iterator[None]:
    """Calls that leave the choice open run eagerly (no torch.compile start-up in unit tests)."""
    with compiling(False):
        yield

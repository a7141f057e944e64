"""Every rule optimizer refuses the same bad step hyper-parameters in one line (one wording: ``base.check_hyper``)."""

from __future__ import annotations

import math

import pytest
import torch

from altgrad.optim import GridOptim, Madam, ManifoldAdamW, RelativeAdamW
from tests.optim.optim_helpers import quantizer

ADAM_RULES = (ManifoldAdamW, RelativeAdamW, GridOptim)
"""The rules with Adam moments (betas, ε)."""


def build(cls: type, plain: torch.nn.Parameter | None = None, **kwargs):
    p = torch.nn.Parameter(torch.ones(4))
    params = [p] if plain is None else [p, plain]
    return cls(params, grids={p: quantizer("e4m3")}, **kwargs)


@pytest.mark.parametrize("cls", ADAM_RULES + (Madam,))
@pytest.mark.parametrize(("key", "value", "valid"), [
    ("lr", 0.0, "> 0"), ("lr", -1e-3, "> 0"), ("lr", math.nan, "> 0"),
    ("weight_decay", -0.1, ">= 0"), ("weight_decay", math.nan, ">= 0"),
])
def test_lr_and_weight_decay_are_checked_by_every_rule(cls: type, key: str, value: float, valid: str) -> None:
    with pytest.raises(ValueError, match=rf"^{cls.__name__}: {key}={value} is not valid; valid: {valid}"):
        build(cls, **{key: value})


@pytest.mark.parametrize("cls", ADAM_RULES)
@pytest.mark.parametrize(("key", "value", "message"), [
    ("betas", (0.9, 1.0), r"betas=\(0.9, 1.0\) are not valid; valid: two values, each in \[0, 1\)"),
    ("betas", (-0.1, 0.99), r"betas=\(-0.1, 0.99\) are not valid"),
    ("betas", (0.9,), r"betas=\(0.9,\) are not valid; valid: two values"),
    ("eps", -1e-8, r"eps=-1e-08 is not valid; valid: >= 0"),
    ("plain_betas", (1.0, 0.99), r"plain_betas=\(1.0, 0.99\) are not valid"),
    ("plain_eps", -1.0, r"plain_eps=-1.0 is not valid; valid: >= 0"),
])
def test_adam_hyper_parameters_are_checked_by_every_adam_rule(cls: type, key: str, value, message: str) -> None:
    with pytest.raises(ValueError, match=rf"^{cls.__name__}: {message}"):
        build(cls, **{key: value})


@pytest.mark.parametrize("cls", ADAM_RULES + (Madam,))
def test_the_edges_torch_allows_are_allowed(cls: type) -> None:
    """β = 0 and ε = 0 are valid, as in torch.optim.AdamW (the exactness tests step with ε = 0)."""
    kwargs = {"weight_decay": 0.0} if cls is Madam else {"betas": (0.0, 0.0), "eps": 0.0, "weight_decay": 0.0}
    build(cls, lr=1e-3, **kwargs)

"""Tail heaviness of activations: kurtosis (outliers make 8-bit ranges collapse onto a few values)."""

from __future__ import annotations

import torch

KURTOSIS_WARNING = 10.0  # a Gaussian has 3; transformer outlier features push it into the tens or hundreds


def kurtosis(x: torch.Tensor) -> torch.Tensor:
    """Pearson kurtosis E[(x−μ)⁴] / σ⁴ over all elements (3 for a Gaussian; 0-d float32; NaN for a constant)."""
    x = x.detach().reshape(-1).float()
    centred = x - x.mean()
    var = (centred**2).mean()
    return (centred**4).mean() / var**2

"""How close a measured tensor is to a reference: cosine similarity and signal-to-noise ratio in dB.

Used by gradient fidelity (quantized vs. unquantized gradient) and by descent quality (intended vs. applied update).
"""

from __future__ import annotations

import torch


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine of the angle between a and b, flattened (0-d float32 tensor; no host sync).

    Accumulated in float64, so identical tensors give exactly 1 after rounding to float32. Two all-zero tensors
    agree perfectly (1); one all-zero tensor against a nonzero one has no direction (0).
    """
    a = a.detach().reshape(-1).double()
    b = b.detach().reshape(-1).double()
    na, nb = torch.linalg.vector_norm(a), torch.linalg.vector_norm(b)
    dot = torch.dot(a, b)
    both_zero = (na == 0) & (nb == 0)
    denom = na * nb
    value = torch.where(denom > 0, dot / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.zeros_like(dot))
    return torch.where(both_zero, torch.ones_like(value), value.clamp(-1.0, 1.0)).float()


def snr_db(reference: torch.Tensor, measured: torch.Tensor) -> torch.Tensor:
    """10·log10(‖reference‖² / ‖measured − reference‖²) in dB (0-d float32 tensor).

    +inf when measured equals reference exactly (no noise); −inf when the reference is zero but measured is not.
    """
    ref = reference.detach().reshape(-1).float()
    noise = measured.detach().reshape(-1).float() - ref
    signal_power = torch.dot(ref, ref)
    noise_power = torch.dot(noise, noise)
    # log10(0) = -inf and x/0 = inf give the documented limits; 0/0 (both zero) is a perfect match → +inf
    ratio = torch.where(noise_power == 0, torch.full_like(signal_power, float("inf")), signal_power / noise_power)
    return 10.0 * torch.log10(ratio)

"""The ULP of a value on a scaled grid: the one definition the ULP-aware optimizers and the diagnostics share.

A quantizer with scale s puts x·s onto format F, so the grid x lives on is {v / s : v ∈ F} and its spacing at x is
ulp_F(x·s) / s. Power-of-two scales make this exact: 2^(max(⌊log2|x·s|⌋, emin) − M) / s.
"""

from __future__ import annotations

import torch
from torch import Tensor

from altgrad.quant.format import FloatFormat


def scaled_ulp(x: Tensor, fmt: FloatFormat, scale: Tensor | float) -> Tensor:
    """ulp_F(x·s) / s elementwise in float32 (x's shape, never 0; NaN where x·s is not finite).

    ``scale`` broadcasts against x: a tensor (kept on its device, as a float32 copy) or a Python number.
    """
    s = scale.float() if isinstance(scale, Tensor) else torch.tensor(float(scale), dtype=torch.float32,
                                                                     device=x.device)
    return fmt.ulp(x.detach().float() * s) / s

"""Quantization core: exact simulated float formats, scaling and straight-through fake quantization.

No Lightning or Hydra here: plain PyTorch, usable from any training loop.
"""

from altgrad.quant import native  # noqa: F401 - the CPU kernel (altgrad.quant.native), importable from here
from altgrad.quant.codes import encode
from altgrad.quant.fake_quant import GradQuantizer, TensorQuantizer, fake_quant, quant_grad
from altgrad.quant.format import POLICIES, FloatFormat, get_format, list_formats
from altgrad.quant.rounding import OVERFLOWS, ROUNDINGS, quantize, quantize_eager, quantize_scaled
from altgrad.quant.scaling import make_scaler
from altgrad.quant.spec import SCALING_KINDS, QuantSpec, ScalingSpec
from altgrad.quant.stats import STAT_NAMES, quant_stats

__all__ = [
    "OVERFLOWS",
    "POLICIES",
    "ROUNDINGS",
    "SCALING_KINDS",
    "STAT_NAMES",
    "FloatFormat",
    "GradQuantizer",
    "QuantSpec",
    "ScalingSpec",
    "TensorQuantizer",
    "encode",
    "fake_quant",
    "get_format",
    "list_formats",
    "make_scaler",
    "quant_grad",
    "quant_stats",
    "quantize",
    "quantize_eager",
    "quantize_scaled",
]

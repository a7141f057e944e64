"""Pure metric maths for the diagnostics callbacks: tensors in, tensors (or floats) out; no Lightning here."""

from altgrad.diagnostics.attention import attention_entropy, attention_probs
from altgrad.diagnostics.clipping import clip_to_range_, range_limit
from altgrad.diagnostics.divergence import DivergenceDetector
from altgrad.diagnostics.entropy import code_histogram, entropy_bits
from altgrad.diagnostics.flip_counts import (
    FlipStep,
    code_index,
    ema_debiased,
    ema_update,
    flip_counts,
    flip_step,
    grid_index,
    grid_midpoints,
    index_dtype,
    segment_flip_counts,
    stall_ratio,
)
from altgrad.diagnostics.moments import KURTOSIS_WARNING, kurtosis
from altgrad.diagnostics.range_use import format_octaves, range_use
from altgrad.diagnostics.similarity import cosine, snr_db
from altgrad.diagnostics.spectrum import effective_rank, stable_rank
from altgrad.diagnostics.stiffness import log2_stiffness, pearson

__all__ = [
    "DivergenceDetector", "FlipStep", "KURTOSIS_WARNING", "attention_entropy", "attention_probs",
    "clip_to_range_", "code_histogram", "code_index", "cosine", "effective_rank", "ema_debiased", "ema_update",
    "entropy_bits", "flip_counts", "flip_step", "format_octaves", "grid_index", "grid_midpoints", "index_dtype",
    "kurtosis", "log2_stiffness", "pearson", "range_limit", "range_use", "segment_flip_counts", "snr_db",
    "stable_rank", "stall_ratio",
]

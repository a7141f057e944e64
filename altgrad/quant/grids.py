"""Distinct grids: which formats quantize every tensor identically under a run's scaling.

A quantizer with scale s puts x on {v / s : v ∈ F}. Amax scaling picks s = max_F / amax (rounded down to a power of
two with ``pow2``), so it removes the format's absolute range: with power-of-two scales what is left is F divided
by 2^⌊log2 max_F⌋ (the scale for amax is 2^⌊log2 max_F⌋ · 2^⌊log2(m_F / amax)⌋, m_F = max_F / 2^⌊log2 max_F⌋),
and with exact scales F / max_F, which for float formats is the same partition (the smallest positive value is a
power of two, so F_B = r·F_A forces r to be one). Two formats whose normalised value sets are equal therefore give
the same output for every input (nearest rounding breaks ties on the code, and equal sorted sets have equal codes), and
stochastic rounding draws from the same two neighbours with the same probabilities. Without scaling the grids
must be equal as they are. Under power-of-two scaling e0m7 and e1m6 are one grid (both uniform, 128 values) and
p3109_p4 is e4m3; ``none`` keeps them apart (their ranges differ).

Runs compare formats, so ``run_grid_key`` also keeps the gradient format: bf16 with e5m2 gradients and the wide
reference (bf16, gradients unquantized) share a weight grid but are different arms.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from altgrad.quant.format import FloatFormat
from altgrad.quant.layer_map import FORMAT_FIELDS, UNQUANTIZED, resolve_format
from altgrad.quant.rounding import OVERFLOWS
from altgrad.quant.spec import ScalingSpec

FormatLike = str | FloatFormat | Mapping[str, Any]
ScalingLike = ScalingSpec | Mapping[str, Any] | str | None


@dataclass(frozen=True)
class GridKey:
    """What a quantizer can output, up to the scale its scaling chooses: equal keys, identical quantization.

    ``values``: the non-negative finite grid values divided by the scaling's normaliser (float64: exact, dyadic);
    ``beyond_max``: what a value past ±max becomes (``max`` under saturation, else ``inf`` or ``nan``)."""

    values: tuple[float, ...]
    beyond_max: str


def as_scaling(scaling: ScalingLike) -> ScalingSpec:
    """A ScalingSpec from a spec, a ``format.scaling`` mapping, a kind name, or None (no scaling)."""
    if isinstance(scaling, ScalingSpec):
        return scaling
    if scaling is None:
        return ScalingSpec(kind="none")
    if isinstance(scaling, str):
        return ScalingSpec(kind=scaling)
    if isinstance(scaling, Mapping):
        return ScalingSpec(**dict(scaling))
    raise ValueError(f"scaling {scaling!r} is not valid; valid: a ScalingSpec, a mapping of its fields, a kind "
                     "name (none, tensor, delayed, channel, block) or None")


def as_format(fmt: FormatLike) -> FloatFormat:
    """A FloatFormat from a preset name, a FloatFormat, or a ``format`` mapping (name plus field overrides)."""
    if isinstance(fmt, Mapping):
        return resolve_format(fmt["name"], {k: fmt.get(k) for k in FORMAT_FIELDS})
    return resolve_format(fmt)


def grid_key(fmt: FormatLike, scaling: ScalingLike, overflow: str = "saturate") -> GridKey:
    """The key of ``fmt``'s grid under ``scaling`` (see the module docstring) with the run's ``overflow``."""
    if overflow not in OVERFLOWS:
        raise ValueError(f"overflow={overflow!r} is not valid; valid: {', '.join(OVERFLOWS)}")
    spec = as_scaling(scaling)
    return _grid_key(as_format(fmt), spec.kind != "none", overflow)


@lru_cache(maxsize=64)
def _grid_key(fmt: FloatFormat, scaled: bool, overflow: str) -> GridKey:
    values = fmt.values().double()
    if scaled:
        values = values / 2.0 ** math.floor(math.log2(fmt.max))  # exact: a power of two, in float64
    if overflow == "saturate" or fmt.policy == "finite":  # finite formats have no Inf/NaN: they always saturate
        beyond = "max"
    else:
        beyond = "inf" if fmt.has_inf else "nan"
    return GridKey(tuple(values[values >= 0].tolist()), beyond)


def same_grid(a: FormatLike, b: FormatLike, scaling: ScalingLike, overflow: str = "saturate") -> bool:
    """Whether formats a and b quantize every tensor identically under ``scaling`` (see the module docstring)."""
    return grid_key(a, scaling, overflow) == grid_key(b, scaling, overflow)


def grid_classes(formats: Iterable[str], scaling: ScalingLike, overflow: str = "saturate") -> list[tuple[str, ...]]:
    """The formats grouped by grid, in the order they first appear (each group in the given order)."""
    groups: dict[GridKey, list[str]] = {}
    for name in formats:
        groups.setdefault(grid_key(name, scaling, overflow), []).append(name)
    return [tuple(g) for g in groups.values()]


def run_grid_key(format_cfg: Mapping[str, Any]) -> tuple[GridKey, GridKey | None] | None:
    """A run's (weight/activation grid, gradient grid) from its ``format`` config (summary.json's
    ``config.format``); None for an unquantized run (fp32). The gradient grid is None when gradients are not
    quantized. Runs with equal keys quantize the same tensors identically (under the same layer map)."""
    name = format_cfg.get("name")
    if name is None or str(name).lower() in UNQUANTIZED:
        return None
    scaling = format_cfg.get("scaling") or {}
    scaling = asdict(as_scaling(scaling)) if not isinstance(scaling, Mapping) else dict(scaling)
    overflow = format_cfg.get("overflow") or "saturate"
    weight = grid_key(format_cfg, scaling, overflow)
    grad_name = format_cfg.get("grad")
    grad = None if grad_name is None or str(grad_name).lower() in UNQUANTIZED else grid_key(grad_name, scaling,
                                                                                           overflow)
    return weight, grad


def run_grid_classes(runs: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, ...]]:
    """Run labels (e.g. format arms of a study) grouped by ``run_grid_key`` of their ``format`` configs, in the
    order they first appear; unquantized runs form one group."""
    groups: dict[Any, list[str]] = {}
    for label, format_cfg in runs.items():
        groups.setdefault(run_grid_key(format_cfg), []).append(label)
    return [tuple(g) for g in groups.values()]

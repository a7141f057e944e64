"""One quantizer call as one pure function: scale from x (and scaler state) → quantize(x·s)/s → statistics.

The quantizers' torch road (a GPU, bf16, per-channel and per-block scales) runs this through ``fused`` so the amax
reduction, the scale arithmetic, the rounding kernel and the statistics compile into a single graph; the callers
write the returned state and stats into their buffers. Inside an outer torch.compile it is traced inline. The
operations are the same ones the separate scaler, kernel and stats functions run (and the native kernel mirrors),
so results are identical.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from altgrad.quant.compiled import fused, renamed, stored_once
from altgrad.quant.rounding import Variant, scaled_kernel
from altgrad.quant.scaling import C_MAX, C_MIN_NORMAL, State, block_scale
from altgrad.quant.stats import stats_of

_CALLS: dict[tuple, fused] = {}


def quant_call_body(x: torch.Tensor, p: torch.Tensor, consts: torch.Tensor, seed: torch.Tensor | None,
                    state: State, scale_fn: Callable, pow2: bool, reduce: str, block: int, variant: Variant,
                    with_stats: bool) -> tuple[torch.Tensor, torch.Tensor | None, State]:
    """The maths of one quantizer call (what every ``quant_call`` function runs); traceable as it is."""
    x = stored_once(x)  # read by the amax pass and the quantize pass: computed once (e.g. a GELU)
    s, new = scale_fn(x, consts, state, pow2, reduce, block)
    y = scaled_kernel(x, p, variant, s, seed, scale_pow2=pow2 or scale_fn is block_scale)
    stats = None
    if with_stats:
        s_used = torch.ones((), dtype=torch.float32, device=x.device) if s is None else s
        stats = stats_of(x, y, s_used, consts[C_MAX], consts[C_MIN_NORMAL])
    return y, stats, new


def _build(scale_fn: Callable, pow2: bool, reduce: str, block: int, variant: Variant, with_stats: bool) -> fused:
    def call(x: torch.Tensor, p: torch.Tensor, consts: torch.Tensor, seed: torch.Tensor | None,
             *state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, State]:
        return quant_call_body(x, p, consts, seed, state, scale_fn, pow2, reduce, block, variant, with_stats)

    # A distinct code object per configuration, so each gets its own dynamo cache (see ``renamed``).
    name = f"quant_call_{scale_fn.__name__}_{variant.label}_{'stats' if with_stats else 'nostats'}"
    return fused(renamed(call, name))


def quant_call(scale_fn: Callable, pow2: bool, reduce: str, block: int, variant: Variant, with_stats: bool) -> fused:
    """The fused function ``(x, kernel params, scale consts, seed, *state) -> (y, stats | None, new state)``."""
    key = (scale_fn, pow2, reduce, block, variant, with_stats)
    fn = _CALLS.get(key)
    if fn is None:
        fn = _CALLS[key] = _build(*key)
    return fn

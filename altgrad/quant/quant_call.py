"""One quantizer call as one pure function: scale from x (and scaler state) → quantize(x·s)/s → statistics.

TensorQuantizer and GradQuantizer run this through ``fused`` so the amax reduction, the scale arithmetic, the
rounding kernel and the statistics compile into a single graph (no per-op eager dispatch on every call); the
callers write the returned state and stats into their buffers. Inside an outer torch.compile it is traced inline.
The operations are the same ones the separate scaler, kernel and stats functions run, so results are identical.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from altgrad.quant.fused import fused, renamed, stored_once
from altgrad.quant.rounding import Variant, _kernel
from altgrad.quant.scaling import C_MAX, C_MIN_NORMAL, State, block_scale
from altgrad.quant.stats import stats_of

_CALLS: dict[tuple, fused] = {}


def quant_call_body(x: torch.Tensor, p: torch.Tensor, consts: torch.Tensor, seed: torch.Tensor | None,
                    state: State, scale_fn: Callable, pow2: bool, reduce: str, block: int, variant: Variant,
                    with_stats: bool) -> tuple[torch.Tensor, torch.Tensor | None, State]:
    """The maths of one quantizer call (what every ``quant_call`` function runs); traceable as it is."""
    x = stored_once(x)  # read by the amax pass and the quantize pass: computed once (e.g. a GELU)
    s, new = scale_fn(x, consts, state, pow2, reduce, block)
    y = _kernel(x, p, variant, s, seed, scale_pow2=pow2 or scale_fn is block_scale)
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
    return fused(renamed(call, name), static=True)


def quant_call(scale_fn: Callable, pow2: bool, reduce: str, block: int, variant: Variant, with_stats: bool) -> fused:
    """The fused function ``(x, kernel params, scale consts, seed, *state) -> (y, stats | None, new state)``."""
    key = (scale_fn, pow2, reduce, block, variant, with_stats)
    fn = _CALLS.get(key)
    if fn is None:
        fn = _CALLS[key] = _build(*key)
    return fn


_MANY: dict[tuple, fused] = {}


def _build_many(scale_fn: Callable, pow2: bool, reduce: str, block: int, variant: Variant, with_stats: bool,
                n: int) -> fused:
    def call(p: torch.Tensor, consts: torch.Tensor, update: bool,
             *flat: torch.Tensor | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        n_state = len(flat) // n - 2
        ys: list[torch.Tensor] = []
        written: list[torch.Tensor] = []
        for i in range(n):  # unrolled when traced: one graph, one dispatch, a kernel (or a few) per tensor
            x, seed, *state = flat[i * (n_state + 2):(i + 1) * (n_state + 2)]
            y, stats, new = quant_call_body(x, p, consts, seed, tuple(state), scale_fn, pow2, reduce, block,
                                            variant, with_stats)
            ys.append(y)
            written += [*new] if update else []
            written += [stats] if stats is not None else []
        return ys, written

    name = f"quant_many{n}_{scale_fn.__name__}_{variant.label}_{'stats' if with_stats else 'nostats'}"
    # not static: one dispatch per step already, and inductor takes 20-30 s on the unrolled static graph
    return fused(renamed(call, name))


def quant_call_many(scale_fn: Callable, pow2: bool, reduce: str, block: int, variant: Variant, with_stats: bool,
                    n: int) -> fused:
    """One fused call for n tensors of one configuration, each with its own scale and scaler state:
    ``(params, consts, update, x1, seed1, *state1, x2, ...) -> ([y1, ...], [new state1 (if update), stats1 (if
    with_stats), ...])``. The weights of one configuration are quantized this way, one dispatch per step."""
    key = (scale_fn, pow2, reduce, block, variant, with_stats, n)
    fn = _MANY.get(key)
    if fn is None:
        fn = _MANY[key] = _build_many(*key)
    return fn

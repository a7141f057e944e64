"""One quantizer call as one pure function: scale from x (and scaler state) → quantize(x·s)/s → statistics.

TensorQuantizer and GradQuantizer run this through ``fused`` so the amax reduction, the scale arithmetic, the
rounding kernel and the statistics compile into a single graph (no per-op eager dispatch on every call); the
callers write the returned state and stats into their buffers. Inside an outer torch.compile it is traced inline.
The operations are the same ones the separate scaler, kernel and stats functions run, so results are identical.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from altgrad.quant.fused import fused, renamed
from altgrad.quant.rounding import Variant, _kernel
from altgrad.quant.scaling import C_MAX, C_MIN_NORMAL, State, block_scale
from altgrad.quant.stats import stats_of

_CALLS: dict[tuple, fused] = {}


def quant_call_body(x: torch.Tensor, p: torch.Tensor, consts: torch.Tensor, seed: torch.Tensor | None,
                    state: State, scale_fn: Callable, pow2: bool, reduce: str, block: int, variant: Variant,
                    with_stats: bool) -> tuple[torch.Tensor, torch.Tensor | None, State]:
    """The maths of one quantizer call (what every ``quant_call`` function runs); traceable as it is."""
    s, new = scale_fn(x, consts, state, pow2, reduce, block)
    y = _kernel(x, p, variant, s, seed, scale_pow2=pow2 or scale_fn is block_scale)
    stats = None
    if with_stats:
        s_used = torch.ones((), dtype=torch.float32, device=x.device) if s is None else s
        stats = stats_of(x, y, s_used, consts[C_MAX], consts[C_MIN_NORMAL])
    return y, stats, new


WRITES = (None, "state", "keep")


def _build(scale_fn: Callable, pow2: bool, reduce: str, block: int, variant: Variant, with_stats: bool,
           writes: str | None) -> fused:
    if writes is None:
        def call(x: torch.Tensor, p: torch.Tensor, consts: torch.Tensor, seed: torch.Tensor | None,
                 *state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, State]:
            return quant_call_body(x, p, consts, seed, state, scale_fn, pow2, reduce, block, variant, with_stats)
    else:
        # The quantizer's buffers are written inside the compiled graph (inductor stores into them in the same
        # kernels), instead of returning new tensors for eager copies after the call: fewer ops per call.
        def call(x: torch.Tensor, p: torch.Tensor, consts: torch.Tensor, seed: torch.Tensor | None,
                 *buffers: torch.Tensor) -> torch.Tensor:
            state, stats_out = (buffers[:-1], buffers[-1]) if with_stats else (buffers, None)
            y, stats, new = quant_call_body(x, p, consts, seed, state, scale_fn, pow2, reduce, block, variant,
                                            with_stats)
            if writes == "state":
                for buf, value in zip(state, new):
                    buf.copy_(value)
            if stats_out is not None:
                stats_out.copy_(stats)
            return y

    # A distinct code object per configuration, so each gets its own dynamo cache (see ``renamed``).
    name = (f"quant_call_{scale_fn.__name__}_{variant.label}_{'stats' if with_stats else 'nostats'}"
            + (f"_writes_{writes}" if writes else ""))
    return fused(renamed(call, name))


def quant_call(scale_fn: Callable, pow2: bool, reduce: str, block: int, variant: Variant, with_stats: bool,
               writes: str | None = None) -> fused:
    """The fused function of one quantizer configuration.

    ``writes=None``: ``(x, kernel params, scale consts, seed, *state) -> (y, stats | None, new state)``, pure.
    ``writes="state"`` / ``"keep"``: ``(x, params, consts, seed, *state, [stats buffer]) -> y``, writing the new
    scaler state (``"state"``; ``"keep"`` leaves it) and the statistics (when ``with_stats``) into those buffers.
    """
    key = (scale_fn, pow2, reduce, block, variant, with_stats, writes)
    fn = _CALLS.get(key)
    if fn is None:
        fn = _CALLS[key] = _build(*key)
    return fn


_MANY: dict[tuple, fused] = {}


def _build_many(scale_fn: Callable, pow2: bool, reduce: str, block: int, variant: Variant, with_stats: bool,
                writes: str, n_state: int, n: int) -> fused:
    per = 2 + n_state + int(with_stats)  # x, seed, scaler state..., [stats buffer]

    def call(p: torch.Tensor, consts: torch.Tensor, *flat: torch.Tensor | None) -> list[torch.Tensor]:
        ys = []
        for i in range(n):  # unrolled when traced: one graph, one dispatch, a kernel (or a few) per tensor
            x, seed, *bufs = flat[i * per:(i + 1) * per]
            state, stats_out = (bufs[:n_state], bufs[n_state] if with_stats else None)
            y, stats, new = quant_call_body(x, p, consts, seed, tuple(state), scale_fn, pow2, reduce, block,
                                            variant, with_stats)
            if writes == "state":
                for buf, value in zip(state, new):
                    buf.copy_(value)
            if stats_out is not None:
                stats_out.copy_(stats)
            ys.append(y)
        return ys

    name = (f"quant_many{n}_{scale_fn.__name__}_{variant.label}_{'stats' if with_stats else 'nostats'}"
            f"_writes_{writes}")
    return fused(renamed(call, name))


def quant_call_many(scale_fn: Callable, pow2: bool, reduce: str, block: int, variant: Variant, with_stats: bool,
                    writes: str, n_state: int, n: int) -> fused:
    """One fused call for n tensors of one configuration, each with its own scale, scaler state and statistics:
    ``(params, consts, x1, seed1, *state1, [stats1], x2, ...) -> [y1, y2, ...]``, buffers written as in
    ``quant_call(..., writes)``. Weights of the same format are quantized this way, one dispatch per step."""
    key = (scale_fn, pow2, reduce, block, variant, with_stats, writes, n_state, n)
    fn = _MANY.get(key)
    if fn is None:
        fn = _MANY[key] = _build_many(*key)
    return fn

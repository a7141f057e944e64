"""Benchmarks that print ratios measured in one process (`python -m altgrad.bench NAME`)."""

import altgrad.quant.fused as _fused


def steady_state_compiles() -> None:
    """Quantizer call signatures take their per-shape static compile on first sight, inside a bench's warm-up.

    A run reaches the same state after ``ALTGRAD_STATIC_AFTER`` calls per signature (default 100); benches time
    that steady state, so the compile must not land in a timed step. No-op when static compiles are off (0).
    """
    if _fused.STATIC_AFTER > 0:
        _fused.STATIC_AFTER = 1

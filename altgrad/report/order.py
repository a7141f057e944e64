"""The order the report lists formats, optimizers, storages and failure stages in (canonical first, then by name)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

FORMAT_ORDER = ("fp32", "bf16_ref", "bf16", "fp16", "e0m7", "e1m6", "e3m4", "e4m3", "e5m2", "e7m0",
                *(f"p3109_p{p}" for p in range(1, 8)))
REFERENCE_FORMATS = ("fp32", "bf16_ref", "bf16", "fp16")
"""Wide formats run as references; the question is about the 8-bit ones."""
OPTIMIZER_ORDER = ("adamw", "manifold[update]", "manifold", "manifold[grad]", "grid", "madam")
STORAGE_ORDER = ("fp32 master", "on-grid nearest", "on-grid stochastic")
STAGE_ORDER = ("fp32", "forward", "forward+grad", "forward+storage", "forward+grad+storage")


def rank(order: Sequence[str], value: Any) -> tuple[int, str]:
    """Sort key: position in ``order`` when listed there, else after all listed values, by name."""
    text = "" if value is None else str(value)
    return (order.index(text), "") if text in order else (len(order), text)


def mantissa_bits(fmt: str) -> int | None:
    """M of a format: the quantization library's when it knows the name, else parsed from ``eXmY``."""
    try:
        from altgrad.quant import get_format

        return int(get_format(fmt).mbits)
    except Exception:  # noqa: BLE001 - an unknown name simply has no known mantissa width
        head, _, tail = fmt.partition("m")
        return int(tail) if head.startswith("e") and head[1:].isdigit() and tail.isdigit() else None

"""A process-wide count of changes to quantizer modules, so a resolution cached from them can tell it is stale.

Quantizers and scalers count every attribute they are given (a spec, ``enabled``, ``track_stats``, ``training``, a
buffer replaced) and every ``_apply`` (``.to()``, ``.double()``: new buffers); QuantLinear's one-node road
(linear_node.py) resolves its plans again when the count moved. In-place writes (the kernel's state and statistics,
``load_state_dict``) keep every tensor and are not changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

COUNT = [0]
STRUCTURE = [0]
"""``COUNT`` without the switches that training flips on its own (``SWITCHES``): moved by a spec, a buffer, a module
replaced or ``_apply``, and by the layer surgery (layers.quantize_linears). What depends only on which quantizers
there are, with which formats and buffers (the instruments' layer lists), keys on it and stays valid across the
statistics switched on for a logging step and off after it, and across validation's eval mode."""

SWITCHES = frozenset({"track_stats", "stats_record", "training"})
"""Attributes whose writes move ``COUNT`` (the one-node call's plan reads them) but not ``STRUCTURE``."""


def moved() -> None:
    """Count a change of the model's structure (both counts)."""
    COUNT[0] += 1
    STRUCTURE[0] += 1


class Watched(nn.Module):
    """An nn.Module whose attribute writes and ``_apply`` calls move ``COUNT`` (and, but for ``SWITCHES``,
    ``STRUCTURE``)."""

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        COUNT[0] += 1
        if name not in SWITCHES:
            STRUCTURE[0] += 1

    def _apply(self, fn: Callable, recurse: bool = True) -> nn.Module:
        out = super()._apply(fn, recurse)
        moved()
        return out

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


class Watched(nn.Module):
    """An nn.Module whose attribute writes and ``_apply`` calls move ``COUNT``."""

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        COUNT[0] += 1

    def _apply(self, fn: Callable, recurse: bool = True) -> nn.Module:
        out = super()._apply(fn, recurse)
        COUNT[0] += 1
        return out

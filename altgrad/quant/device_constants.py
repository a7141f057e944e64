"""Small constant tensors (a format's kernel parameters, scale constants, statistics thresholds), made once per
device, so a call never copies them host → device."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch

_CACHE: dict[tuple[Hashable, torch.dtype, torch.device], torch.Tensor] = {}


def device_constant(key: Hashable, values: Callable[[], Sequence[float]], dtype: torch.dtype,
                    device: torch.device | str) -> torch.Tensor:
    """The tensor of ``values()`` (called on a miss only) for ``key`` on ``device``; inside a traced region a fresh
    graph constant instead (no cache mutation there)."""
    if torch.compiler.is_compiling():
        return torch.tensor(values(), dtype=dtype, device=device)
    full = (key, dtype, torch.device(device))
    t = _CACHE.get(full)
    if t is None:
        t = _CACHE[full] = torch.tensor(values(), dtype=dtype, device=device)
    return t

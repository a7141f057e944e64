"""An independent decoder of format codes, straight from docs/formats.md (Python ints and floats, no altgrad code):
the oracle the format and rounding tests compare against, e.g. which of two neighbours has the even code."""

from __future__ import annotations

import functools
import math

import torch


def code_value(fmt, code: int) -> float:
    """The value of one code of ``fmt`` (ebits, mbits, bias, policy), decoded from the definition."""
    E, M = fmt.ebits, fmt.mbits
    s, e, m = code >> (E + M), (code >> M) & ((1 << E) - 1), code & ((1 << M) - 1)
    if fmt.policy == "p3109":
        if code == 1 << (E + M):
            return math.nan
        if code & ((1 << (E + M)) - 1) == (1 << (E + M)) - 1:
            return -math.inf if s else math.inf
    if fmt.policy == "fn" and code & ((1 << (E + M)) - 1) == (1 << (E + M)) - 1:
        return math.nan
    if fmt.policy == "ieee" and e == (1 << E) - 1:
        return math.nan if m else (-math.inf if s else math.inf)
    if e == 0:
        v = math.ldexp(m, 1 - fmt.bias - M)
    else:
        v = math.ldexp((1 << M) + m, e - fmt.bias - M)
    return -v if s else v


def all_values(fmt) -> list[float]:
    """The value of every code, code order (2^bits entries)."""
    return [code_value(fmt, c) for c in range(1 << fmt.bits)]


@functools.lru_cache(maxsize=None)
def magnitude_codes(fmt) -> dict[float, int]:
    """Each finite non-negative value → its code, by enumerating the codes of the positive sign (0 → code 0)."""
    table: dict[float, int] = {}
    for code in range(1 << (fmt.ebits + fmt.mbits)):
        v = code_value(fmt, code)
        if math.isfinite(v):
            table.setdefault(v, code)
    return table


def code_is_even(fmt, values: torch.Tensor) -> torch.Tensor:
    """Whether each grid value's code is even. The sign is the top bit, so ±v share the parity of |v|'s code."""
    table = magnitude_codes(fmt)
    return torch.tensor([table[abs(float(v))] % 2 == 0 for v in values.reshape(-1).tolist()]).reshape(values.shape)

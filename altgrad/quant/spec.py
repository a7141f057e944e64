"""QuantSpec and ScalingSpec: how one tensor role (weight, input, grad) is quantized, as plain validated data."""

from __future__ import annotations

import dataclasses
from typing import Any

from altgrad.quant.format import FloatFormat, get_format
from altgrad.quant.rounding import OVERFLOWS, ROUNDINGS, check_modes

SCALING_KINDS = ("none", "tensor", "delayed", "channel", "block")
REDUCTIONS = ("max", "most_recent")


@dataclasses.dataclass(frozen=True)
class ScalingSpec:
    """How the scale s is chosen (the value quantized is x·s, the result divided by s).

    kind: ``none`` (s = 1), ``tensor`` (s = max / amax of the current tensor), ``delayed`` (amax over a history of
    ``history`` previous calls, reduced by ``max`` or ``most_recent``), ``channel`` (one scale per row: every index
    of the leading dims, reduced over the last dim), ``block`` (one power-of-two scale per ``block`` contiguous
    values of the last dim, OCP MX rule). ``margin`` divides s by 2^margin (headroom). ``pow2`` rounds s down to a
    power of two so that the scaling itself is exact.
    """

    kind: str = "tensor"
    pow2: bool = True
    history: int = 16
    reduce: str = "max"
    margin: int = 0
    block: int = 32

    def __post_init__(self) -> None:
        if self.kind not in SCALING_KINDS:
            raise ValueError(f"scaling.kind={self.kind!r} is not valid; valid: {', '.join(SCALING_KINDS)}")
        if self.reduce not in REDUCTIONS:
            raise ValueError(f"scaling.reduce={self.reduce!r} is not valid; valid: {', '.join(REDUCTIONS)}")
        for name in ("history", "block"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"scaling.{name}={value!r} is not valid; valid: an integer >= 1")
        if not isinstance(self.margin, int) or isinstance(self.margin, bool):
            raise ValueError(f"scaling.margin={self.margin!r} is not valid; valid: an integer (power-of-two steps)")
        if not isinstance(self.pow2, bool):
            raise ValueError(f"scaling.pow2={self.pow2!r} is not valid; valid: true or false")

    @property
    def powers_of_two(self) -> bool:
        """Whether every scale this spec produces is a power of two (``pow2``, and always for ``block``)."""
        return self.pow2 or self.kind == "block"


@dataclasses.dataclass(frozen=True)
class QuantSpec:
    """Everything needed to quantize one tensor role: format, rounding, overflow and scaling."""

    format: FloatFormat
    rounding: str = "nearest"
    overflow: str = "saturate"
    scaling: ScalingSpec = dataclasses.field(default_factory=ScalingSpec)

    def __post_init__(self) -> None:
        if not isinstance(self.format, FloatFormat):
            raise ValueError(f"QuantSpec.format must be a FloatFormat, got {type(self.format).__name__}; "
                             "use altgrad.quant.get_format(name)")
        if not isinstance(self.scaling, ScalingSpec):
            raise ValueError(f"QuantSpec.scaling must be a ScalingSpec, got {type(self.scaling).__name__}")
        check_modes(self.rounding, self.overflow)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict; ``QuantSpec.from_dict`` inverts it."""
        f = self.format
        return {
            "format": {"name": f.name, "ebits": f.ebits, "mbits": f.mbits, "bias": f.bias, "policy": f.policy},
            "rounding": self.rounding,
            "overflow": self.overflow,
            "scaling": dataclasses.asdict(self.scaling),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuantSpec:
        """Inverse of ``to_dict``; ``format`` may also be a preset name."""
        fmt = d["format"]
        if isinstance(fmt, str):
            fmt = get_format(fmt)
        elif isinstance(fmt, dict):
            fields = {k: fmt[k] for k in ("ebits", "mbits", "bias", "policy")}
            fmt = FloatFormat(**fields, name=fmt.get("name"))
        return cls(fmt, d.get("rounding", "nearest"), d.get("overflow", "saturate"),
                   ScalingSpec(**d.get("scaling", {})))


__all__ = ["OVERFLOWS", "REDUCTIONS", "ROUNDINGS", "SCALING_KINDS", "QuantSpec", "ScalingSpec"]

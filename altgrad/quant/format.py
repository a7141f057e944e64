"""FloatFormat: a sign + E exponent + M mantissa float format with a bias and a special-value policy.

The format is data (gfloat's layering): its fields, the constants derived from them and the decoding of a code,
with nothing imported from the rest of altgrad; operations that round onto it (``rounding``) or encode values
(``codes``) are functions over it, in modules above this one. Every constant (max, min normal, min subnormal, the
value grid) is derived from the definition in ``docs/formats.md``; nothing is tabulated. Formats are simulated in
float32, so a format is valid only if every one of its finite values is a float32 value with the same spacing rules
(checked at construction).
"""

from __future__ import annotations

import dataclasses
import math

import torch

POLICIES = ("finite", "fn", "ieee", "p3109")
_F32_EMIN = -126  # exponent of float32's smallest normal
_F32_EMAX = 127


@dataclasses.dataclass(frozen=True)
class FloatFormat:
    """Sign bit, ``ebits`` exponent bits, ``mbits`` mantissa bits, exponent ``bias`` and special-value ``policy``.

    Policies: ``finite`` (every code is a number, ±0 both zero), ``fn`` (only S.1…1 is NaN, no Inf),
    ``ieee`` (top exponent field is Inf/NaN), ``p3109`` (0x80 is the only NaN, 0x7F/0xFF are ±Inf, no −0).
    ``name`` is a label only: two formats with the same fields compare equal whatever their names.
    """

    ebits: int
    mbits: int
    bias: int
    policy: str
    name: str | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        for field in ("ebits", "mbits", "bias"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"FloatFormat.{field} must be an int, got {value!r}")
        if not 0 <= self.ebits <= 8:
            raise ValueError(f"FloatFormat.ebits={self.ebits} is not valid; valid: 0..8")
        if not 0 <= self.mbits <= 23:
            raise ValueError(f"FloatFormat.mbits={self.mbits} is not valid; valid: 0..23")
        if self.ebits + self.mbits < 1:
            raise ValueError("FloatFormat needs ebits + mbits >= 1 (got 0 + 0): a sign bit alone has no values")
        if self.policy not in POLICIES:
            raise ValueError(f"FloatFormat.policy={self.policy!r} is not valid; valid: {', '.join(POLICIES)}")
        if self.policy == "p3109" and (self.ebits + self.mbits != 7 or self.ebits < 1):
            raise ValueError(
                f"policy 'p3109' is the 8-bit family: ebits + mbits must be 7 with ebits >= 1 "
                f"(got ebits={self.ebits}, mbits={self.mbits})")
        if self.policy == "ieee" and self.ebits < 2:
            raise ValueError(f"policy 'ieee' needs ebits >= 2 (the top exponent field is Inf/NaN), got {self.ebits}")
        if self.max_code < 1:
            raise ValueError(f"FloatFormat(ebits={self.ebits}, mbits={self.mbits}, policy={self.policy!r}) "
                             "has no positive finite value")
        if self.emin < _F32_EMIN:
            raise ValueError(f"FloatFormat.bias={self.bias} is too large: the smallest normal 2^(1-bias) must be "
                             f">= 2^{_F32_EMIN} (float32 carries the simulation); valid: bias <= {1 - _F32_EMIN}")
        if self.emin - self.mbits > _F32_EMAX - 23:
            raise ValueError(f"FloatFormat.bias={self.bias} is too small: the grid spacing 2^(1-bias-mbits) must be "
                             f"<= 2^{_F32_EMAX - 23} (float32 carries the simulation); valid: bias >= "
                             f"{1 - self.mbits - (_F32_EMAX - 23)}")
        if self.emax > _F32_EMAX:
            low = self._top_exponent_field() - _F32_EMAX
            raise ValueError(f"FloatFormat.bias={self.bias} is too small: max finite 2^{self.emax}·(…) overflows "
                             f"float32 (the simulation carrier); valid: bias >= {low}")

    # ---- code layout -------------------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        """Storage width: sign + exponent + mantissa."""
        return 1 + self.ebits + self.mbits

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal (also of the subnormal quantum's binade): 1 − bias."""
        return 1 - self.bias

    @property
    def max_code(self) -> int:
        """Largest positive code that decodes to a finite value."""
        top = (1 << (self.ebits + self.mbits)) - 1
        if self.policy == "finite":
            return top
        if self.policy == "ieee":  # exponent field all ones is reserved
            return (((1 << self.ebits) - 1) << self.mbits) - 1
        return top - 1  # fn: S.1…1 is NaN; p3109: 0x7F is +Inf

    def _top_exponent_field(self) -> int:
        return max(self.max_code >> self.mbits, 1)

    @property
    def emax(self) -> int:
        """Exponent of the binade holding ``max``."""
        return self._top_exponent_field() - self.bias

    @property
    def has_inf(self) -> bool:
        return self.policy in ("ieee", "p3109")

    @property
    def has_nan(self) -> bool:
        return self.policy in ("fn", "p3109") or (self.policy == "ieee" and self.mbits > 0)

    @property
    def has_negative_zero(self) -> bool:
        return self.policy != "p3109"

    # ---- derived constants ---------------------------------------------------------------------------------
    def _code_value(self, code: int) -> float:
        """Exact magnitude of a positive finite code (Python float)."""
        e, m = code >> self.mbits, code & ((1 << self.mbits) - 1)
        if e == 0:
            return math.ldexp(m, self.emin - self.mbits)
        return math.ldexp((1 << self.mbits) + m, e - self.bias - self.mbits)

    @property
    def max(self) -> float:
        """Largest finite value."""
        return self._code_value(self.max_code)

    @property
    def min_normal(self) -> float | None:
        """Smallest positive normal 2^(1−bias); None when ebits == 0 (every value is subnormal)."""
        return None if self.ebits == 0 else math.ldexp(1.0, self.emin)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value (code 1): 2^(1−bias−M); equals min_normal when M == 0."""
        return self._code_value(1)

    @property
    def quantum(self) -> float:
        """Grid spacing below the smallest normal: 2^(emin − M)."""
        return math.ldexp(1.0, self.emin - self.mbits)

    def __str__(self) -> str:
        fields = f"E{self.ebits}M{self.mbits} bias={self.bias} {self.policy}"
        return f"{self.name} ({fields})" if self.name else fields

    # ---- codes ---------------------------------------------------------------------------------------------
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """float32 value of each integer code (sign bit at position ebits + mbits); specials per the policy."""
        c = codes.to(torch.int64)
        em_bits = self.ebits + self.mbits
        if bool(((c < 0) | (c >= (1 << self.bits))).any()):
            raise ValueError(f"codes must lie in 0..{(1 << self.bits) - 1} for a {self.bits}-bit format")
        neg = (c >> em_bits) & 1
        mag = c & ((1 << em_bits) - 1)
        e = mag >> self.mbits
        m = mag & ((1 << self.mbits) - 1)
        # float64 holds every (2^M + m)·2^k of a float32-representable format exactly.
        sub = torch.ldexp(m.to(torch.float64), torch.full_like(m, self.emin - self.mbits))
        nrm = torch.ldexp((m + (1 << self.mbits)).to(torch.float64), e - self.bias - self.mbits)
        val = torch.where(e == 0, sub, nrm)
        val = torch.where(mag > self.max_code, self._special_values(mag), val)
        val = torch.where(neg == 1, -val, val)
        if self.policy == "p3109":
            val = torch.where(c == (1 << em_bits), torch.nan, val)
        return val.to(torch.float32)

    def _special_values(self, mag: torch.Tensor) -> torch.Tensor:
        """Value of the magnitude codes above max_code (Inf or NaN as the policy says)."""
        if self.policy == "fn":
            return torch.full(mag.shape, torch.nan, dtype=torch.float64, device=mag.device)
        if self.policy == "p3109":
            return torch.full(mag.shape, torch.inf, dtype=torch.float64, device=mag.device)
        m = mag & ((1 << self.mbits) - 1)  # ieee: m == 0 → Inf, else NaN
        return torch.where(m == 0, torch.inf, torch.nan).to(torch.float64)

    def values(self) -> torch.Tensor:
        """Every distinct finite value, sorted ascending (float32; ±0 appear once as 0)."""
        if self.bits > 20:
            raise ValueError(f"values() enumerates 2^bits codes; format {self} has {self.bits} bits (valid: <= 20)")
        v = self.decode(torch.arange(1 << self.bits, dtype=torch.int64))
        v = v[torch.isfinite(v)]
        return torch.unique(v + 0.0)  # + 0.0 folds −0 into 0 before unique (sorted ascending)

    def ulp(self, x: torch.Tensor) -> torch.Tensor:
        """Grid spacing at |x|: 2^(max(floor(log2|x|), emin) − M) in float32; min_subnormal at 0; NaN if not finite.

        Computed on the float32 bit pattern (exact, cheap, no log2), so it can sit in an optimizer's hot loop.
        """
        xf = x.to(torch.float32)
        e32 = (xf.view(torch.int32) >> 23) & 0xFF  # biased float32 exponent field (0 for zero/subnormal)
        k = torch.clamp(e32 - 127, min=self.emin) - self.mbits  # >= emin − M >= −149 by construction
        normal_bits = (torch.clamp(k, min=-126) + 127) << 23
        sub_bits = torch.ones_like(k) << torch.clamp(k + 149, min=0, max=22)
        out = torch.where(k >= -126, normal_bits, sub_bits).view(torch.float32)
        return torch.where(e32 == 0xFF, torch.nan, out)


def _p3109(p: int) -> FloatFormat:
    return FloatFormat(8 - p, p - 1, 2 ** (7 - p), "p3109", name=f"p3109_p{p}")


_PRESETS: dict[str, FloatFormat] = {
    f.name: f
    for f in (
        FloatFormat(0, 7, 1, "finite", name="e0m7"),
        FloatFormat(1, 6, 1, "finite", name="e1m6"),
        FloatFormat(3, 4, 1, "finite", name="e3m4"),
        FloatFormat(4, 3, 7, "fn", name="e4m3"),
        FloatFormat(5, 2, 15, "ieee", name="e5m2"),
        FloatFormat(7, 0, 63, "finite", name="e7m0"),
        *(_p3109(p) for p in range(1, 8)),
        FloatFormat(8, 7, 127, "ieee", name="bf16"),
        FloatFormat(5, 10, 15, "ieee", name="fp16"),
    )
}


def list_formats() -> list[str]:
    """Names of the preset formats, in definition order."""
    return list(_PRESETS)


def get_format(name: str) -> FloatFormat:
    """The preset format called ``name`` (see :func:`list_formats`)."""
    try:
        return _PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown format {name!r}; valid: {', '.join(_PRESETS)}") from None

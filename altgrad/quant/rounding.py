"""quantize(x, fmt, rounding, overflow): put every element of x on a FloatFormat's grid, exactly and fast.

The kernel works on the float32 bit pattern as int32 (no log2/frexp):
- values at or above the format's smallest normal keep float32's exponent; rounding adds a bias to the low
  23 − M mantissa bits and masks them off, so a carry moves into the exponent exactly as it should;
- below it the grid is fixed-point with quantum q = 2^(emin−M): nearest uses |x| + C − C with C = 2^(emin−M+23)
  (float32's own round-to-nearest-even at spacing q); the other modes round k = |x| / q as an integer
  (exact shifts of the significand) and rebuild k·q as (C's bits + k) − C;
- saturation/overflow, NaN, ±Inf and −0 follow the policy (inductor compiles with -fno-signed-zeros, so signs
  are handled on the bits, never by float arithmetic).
Round-to-nearest breaks ties towards the even *code*; for M = 0 the code's last bit is the exponent field's,
whose parity differs from float32's when 127 − bias is odd, hence ``tie_flip``.
Stochastic rounding adds uniform random bits below the cut, drawn inside the kernel from a counter-based
hash of (seed, element index), so no random tensor is materialised.

Formats are derived into a small int32 parameter tensor, so one compiled kernel per rounding mode serves every
format without recompiling. ``quantize`` compiles it lazily with ``torch.compile(dynamic=True)`` (set
``ALTGRAD_COMPILE=0`` to stay eager) and falls back to eager, with one warning, where compilation fails.
Inputs of other float dtypes are computed in float32 and cast back: exact when the format is narrower than the
dtype; a format wider than the dtype (e.g. fp16 on a bf16 tensor) is rounded twice (format, then dtype).
"""

from __future__ import annotations

import math
import struct

import torch

from altgrad.quant.format import FloatFormat
from altgrad.quant.fused import fused

ROUNDINGS = ("nearest", "stochastic", "toward_zero")
OVERFLOWS = ("saturate", "overflow")

_INT_MIN = -(2**31)
_ABS = 0x7FFFFFFF
_INF = 0x7F800000
_NAN = 0x7FC00000
_MANT = 0x007FFFFF
_HIDDEN = 0x00800000

# Parameter-tensor slots (int32), derived once per (format, rounding, overflow, device).
_P_SHIFT, _P_LOW, _P_HALF, _P_LSB, _P_FLIP, _P_EMIN32, _P_MCUT, _P_MAX, _P_OVF, _P_OVF_INF, _P_NZ, _P_MAGIC, \
    _P_EMIN_BITS = range(13)


def _f32_bits(v: float) -> int:
    """The float32 bit pattern of v as a signed int32 value (v must be exactly representable)."""
    return struct.unpack("<i", struct.pack("<f", v))[0]


def _params(fmt: FloatFormat, rounding: str, overflow: str) -> list[int]:
    """The constants of the kernel for one format, as int32 values."""
    shift = 23 - fmt.mbits
    qexp = fmt.emin - fmt.mbits  # the quantum below the smallest normal is 2^qexp, qexp >= -149
    max_bits = _f32_bits(fmt.max)
    if overflow == "saturate" or fmt.policy == "finite":
        ovf = ovf_inf = max_bits
    else:
        special = _INF if fmt.has_inf else _NAN  # fn: NaN is the only special value
        ovf_inf = special
        ovf = max_bits if rounding == "toward_zero" else special  # rounding toward zero never overflows a finite x
    return [
        shift,
        (1 << shift) - 1,  # bits below the cut
        (1 << (shift - 1)) - 1 if shift > 0 else 0,  # half an ulp minus one: RNE bias before the tie bit
        1 if shift > 0 else 0,  # whether a tie bit exists at all (M = 23 rounds nothing)
        ((fmt.bias - 127) << fmt.mbits) & 1 if shift > 0 else 0,  # code parity = float32 parity xor this
        fmt.emin + 127,  # float32 exponent field of the format's smallest normal (>= 1 by FloatFormat's checks)
        shift,
        max_bits,
        ovf,
        ovf_inf,
        _INT_MIN if fmt.has_negative_zero else 0,  # sign kept on a zero result?
        (qexp + 23 + 127) << 23,  # C = 2^(qexp+23): in [C, 2C) float32's ulp is the quantum q
        (fmt.emin + 127) << 23,  # bit pattern of the smallest normal
    ]


def _mix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's fmix32 finaliser on int32 with wrapping multiplies (logical shifts via masks)."""
    h = h ^ ((h >> 16) & 0xFFFF)
    h = h * -2048144789  # 0x85EBCA6B
    h = h ^ ((h >> 13) & 0x7FFFF)
    h = h * -1028477387  # 0xC2B2AE35
    return h ^ ((h >> 16) & 0xFFFF)


def random_bits(shape: torch.Size, seed: torch.Tensor) -> torch.Tensor:
    """Counter-based uniform int32 bits for every element index, from a 0-dim int32 ``seed`` (no state)."""
    n = math.prod(shape)
    idx = torch.arange(n, dtype=torch.int32, device=seed.device).view(shape)
    key2 = _mix32(seed ^ 0x5BD1E995)
    return _mix32((idx ^ seed) * -1640531535 + key2)  # 0x9E3779B1: golden-ratio multiplier


def _round_bits(xf: torch.Tensor, p: torch.Tensor, rounding: str, r: torch.Tensor | None) -> torch.Tensor:
    """Quantize a float32 tensor; returns the float32 result. ``p`` is the int32 parameter tensor."""
    bits = xf.view(torch.int32)
    sign = bits & _INT_MIN
    a0 = bits & _ABS
    a = torch.clamp(a0, max=_INF)  # NaN payloads would overflow the rounding add; NaN is restored at the end

    # Normal region: round the float32 pattern at the cut (23 − M bits), carrying into the exponent.
    shift, low = p[_P_SHIFT], p[_P_LOW]
    if rounding == "nearest":
        add = p[_P_HALF] + (((a >> shift) ^ p[_P_FLIP]) & p[_P_LSB])
    elif rounding == "stochastic":
        add = r & low
    else:
        add = torch.zeros_like(a)
    normal = (a + add) & ~low

    # Below the smallest normal the grid is fixed-point with quantum q = 2^(emin−M).
    c = p[_P_MAGIC].view(torch.float32)
    if rounding == "nearest":
        # |x| + C with C = 2^(emin−M+23) lands in [C, 2C), where float32's own spacing is q: the hardware's
        # round-to-nearest-even does the work, and even there means an even k = the even code.
        sub = ((a.view(torch.float32) + c) - c).view(torch.int32)
    else:
        # k = significand >> (extra exponent distance + 23 − M), rounded as an integer (exact control of the bits
        # that are dropped, which stochastic rounding needs).
        e32 = a >> 23
        sig = torch.where(e32 > 0, (a & _MANT) | _HIDDEN, a)
        dist = torch.clamp(p[_P_EMIN32] - torch.clamp(e32, min=1), min=0) + p[_P_MCUT]
        # Keep shifts within int32: drop at most `pre` low bits first (≤ 2^-30 of an ulp, seen only by stochastic
        # rounding); a distance beyond 61 leaves sg = 0, which every mode rounds to 0.
        pre = torch.clamp(dist - 30, min=0, max=31)
        sg = sig >> pre
        sh = torch.clamp(dist - pre, max=30)
        if rounding == "stochastic":
            sadd = r & ((torch.ones_like(sh) << sh) - 1)
        else:
            sadd = torch.zeros_like(sg)
        k = (sg + sadd) >> sh  # <= 2^M... 2^23: the bits of C + k·q are C's bits + k; subtracting C is exact
        sub = ((p[_P_MAGIC] + k).view(torch.float32) - c).view(torch.int32)
    m = torch.where(a < p[_P_EMIN_BITS], sub, normal)

    # Range, specials, sign.
    m = torch.where(m > p[_P_MAX], torch.where(a >= _INF, p[_P_OVF_INF], p[_P_OVF]), m)
    sgn = torch.where(m != 0, sign, sign & p[_P_NZ])
    out = torch.where(a0 > _INF, _NAN, m | sgn)
    return out.view(torch.float32)


def _kernel(x: torch.Tensor, p: torch.Tensor, rounding: str, scale: torch.Tensor | None,
            seed: torch.Tensor | None) -> torch.Tensor:
    xf = x.to(torch.float32)
    if scale is not None:
        xf = xf * scale
    r = random_bits(xf.shape, seed) if rounding == "stochastic" else None
    q = _round_bits(xf, p, rounding, r)
    if scale is not None:
        q = q / scale
    return q.to(x.dtype)


# One entry point per rounding mode and scaling: distinct code objects, so dynamo keeps separate caches.
def _nearest(x: torch.Tensor, p: torch.Tensor, seed: torch.Tensor | None) -> torch.Tensor:
    return _kernel(x, p, "nearest", None, None)


def _stochastic(x: torch.Tensor, p: torch.Tensor, seed: torch.Tensor | None) -> torch.Tensor:
    return _kernel(x, p, "stochastic", None, seed)


def _toward_zero(x: torch.Tensor, p: torch.Tensor, seed: torch.Tensor | None) -> torch.Tensor:
    return _kernel(x, p, "toward_zero", None, None)


def _nearest_scaled(x: torch.Tensor, p: torch.Tensor, scale: torch.Tensor, seed: torch.Tensor | None) -> torch.Tensor:
    return _kernel(x, p, "nearest", scale, None)


def _stochastic_scaled(x: torch.Tensor, p: torch.Tensor, scale: torch.Tensor,
                       seed: torch.Tensor | None) -> torch.Tensor:
    return _kernel(x, p, "stochastic", scale, seed)


def _toward_zero_scaled(x: torch.Tensor, p: torch.Tensor, scale: torch.Tensor,
                        seed: torch.Tensor | None) -> torch.Tensor:
    return _kernel(x, p, "toward_zero", scale, None)


_KERNELS = {
    "nearest": fused(_nearest), "stochastic": fused(_stochastic), "toward_zero": fused(_toward_zero)}
_KERNELS_SCALED = {
    "nearest": fused(_nearest_scaled), "stochastic": fused(_stochastic_scaled),
    "toward_zero": fused(_toward_zero_scaled)}
_PARAMS: dict[tuple[FloatFormat, str, str, torch.device], torch.Tensor] = {}


def check_modes(rounding: str, overflow: str) -> None:
    """ValueError naming the bad argument and the valid choices."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding={rounding!r} is not valid; valid: {', '.join(ROUNDINGS)}")
    if overflow not in OVERFLOWS:
        raise ValueError(f"overflow={overflow!r} is not valid; valid: {', '.join(OVERFLOWS)}")


def kernel_params(fmt: FloatFormat, rounding: str, overflow: str, device: torch.device) -> torch.Tensor:
    """The int32 parameter tensor of (format, modes), cached per device so calls never copy host → device."""
    if torch.compiler.is_compiling():  # traced into the caller's graph as a constant; no cache mutation there
        return torch.tensor(_params(fmt, rounding, overflow), dtype=torch.int32, device=device)
    key = (fmt, rounding, overflow, torch.device(device))
    p = _PARAMS.get(key)
    if p is None:
        p = torch.tensor(_params(fmt, rounding, overflow), dtype=torch.int32, device=device)
        _PARAMS[key] = p
    return p


def draw_seed(device: torch.device, generator: torch.Generator | None = None,
              seed: int | None = None) -> torch.Tensor:
    """0-dim int32 seed tensor: from ``seed``, else one draw from ``generator`` (or the default generator)."""
    if seed is not None:
        return torch.tensor(int(seed) & 0x7FFFFFFF, dtype=torch.int32, device=device)
    gen_device = generator.device if generator is not None else device
    s = torch.randint(0, 2**31 - 1, (), generator=generator, device=gen_device, dtype=torch.int64)
    return s.to(device=device, dtype=torch.int32)


def _as_rows(x: torch.Tensor, scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Few distinct kernel shapes: 1-D without a scale; (rows, last dim) with one."""
    if scale is None:
        return x.reshape(-1), None
    cols = x.shape[-1] if x.dim() >= 1 else 1
    x2 = x.reshape(-1, cols)
    if scale.dim() == 0:
        return x2, scale
    if scale.shape[-1] == 1 and scale.numel() * cols == x.numel():  # one scale per row
        return x2, scale.reshape(-1, 1)
    return x2, scale.expand(x.shape).reshape(-1, cols)


def _run(x: torch.Tensor, fmt: FloatFormat, rounding: str, overflow: str, scale: torch.Tensor | None,
         generator: torch.Generator | None, seed: int | torch.Tensor | None, compiled: bool) -> torch.Tensor:
    if not isinstance(fmt, FloatFormat):
        raise ValueError(f"fmt must be a FloatFormat (see altgrad.quant.get_format), got {type(fmt).__name__}")
    check_modes(rounding, overflow)
    if not x.is_floating_point():
        raise ValueError(f"quantize needs a floating-point tensor, got dtype {x.dtype}")
    p = kernel_params(fmt, rounding, overflow, x.device)
    s = None
    if rounding == "stochastic":
        s = seed if isinstance(seed, torch.Tensor) else draw_seed(x.device, generator, seed)
    xr, sc = _as_rows(x, scale)
    with torch.no_grad():
        if sc is None:
            out = _KERNELS[rounding](xr, p, s, compiled=compiled)
        else:
            out = _KERNELS_SCALED[rounding](xr, p, sc.to(torch.float32), s, compiled=compiled)
    return out.view(x.shape)


def quantize(x: torch.Tensor, fmt: FloatFormat, rounding: str = "nearest", overflow: str = "saturate",
             generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
    """x rounded onto ``fmt``'s grid (same dtype and shape; not differentiable, see fake_quant).

    rounding: ``nearest`` (ties to the even code), ``stochastic`` (unbiased; reproducible from ``seed`` or one
    draw from ``generator``), ``toward_zero``. overflow: ``saturate`` (clamp to ±max, Inf too) or ``overflow``
    (±Inf where the policy has Inf, NaN where it has only NaN; ``finite`` formats always saturate).
    NaN in → NaN out; −0 is kept only where the policy has −0.
    """
    return _run(x, fmt, rounding, overflow, None, generator, seed, compiled=True)


def quantize_eager(x: torch.Tensor, fmt: FloatFormat, rounding: str = "nearest", overflow: str = "saturate",
                   generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
    """The same as :func:`quantize`, always with the uncompiled kernel (a reference for tests and debugging)."""
    return _run(x, fmt, rounding, overflow, None, generator, seed, compiled=False)


def quantize_scaled(x: torch.Tensor, fmt: FloatFormat, scale: torch.Tensor | None, rounding: str = "nearest",
                    overflow: str = "saturate", generator: torch.Generator | None = None,
                    seed: int | torch.Tensor | None = None, compiled: bool = True) -> torch.Tensor:
    """quantize(x·scale)/scale in one fused pass (``scale`` float32, broadcastable to x; None = 1)."""
    return _run(x, fmt, rounding, overflow, scale, generator, seed, compiled=compiled)

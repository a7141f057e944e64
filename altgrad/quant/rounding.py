"""quantize(x, fmt, rounding, overflow): put every element of x on a FloatFormat's grid, exactly and fast.

The kernel works on the float32 bit pattern as int32 (no log2/frexp):
- values at or above the format's smallest normal keep float32's exponent; rounding adds a bias to the low
  23 − M mantissa bits and masks them off, so a carry moves into the exponent exactly as it should;
- below it the grid is fixed-point with quantum q = 2^(emin−M): nearest uses |x| + C − C with C = 2^(emin−M+23)
  (float32's own round-to-nearest-even at spacing q); the other modes take y = |x|/q (an exact power-of-two
  scaling), k = floor(y) (+1 with probability frac(y) when stochastic), and rebuild k·q as (C's bits + k) − C;
- saturation/overflow, NaN, ±Inf and −0 follow the policy (inductor compiles with -fno-signed-zeros, so signs
  are handled on the bits, never by float arithmetic).
Round-to-nearest breaks ties towards the even *code*; for M = 0 the code's last bit is the exponent field's,
whose parity differs from float32's when 127 − bias is odd, hence ``tie_flip``.
Nearest rounding usually takes a shorter road that covers both regions at once: with e = |x|'s binade held in
[emin, emax], |x| + C − C with C = 2^(e+23−M) (float32's own round-to-nearest-even at the format's quantum there).
It needs C finite, 0 < M < 23 (for M = 0 the two neighbours 2^e and 2^(e+1) are codes of different exponents,
so float32's even significand is not the even code); otherwise (``bit_round``: M = 0, bf16's range) the
bit-pattern rounding above runs.
Stochastic rounding adds uniform random bits below the cut, drawn inside the kernel from a counter-based
hash of (seed, element index), so no random tensor is materialised.

Formats are derived into a small int32 parameter tensor; the compiled kernel is specialised only on which
optional steps a format needs (``Variant``: a handful in all), so formats share kernels without recompiling.
``quantize`` runs a contiguous-or-not float32 CPU tensor through the native kernel (``native``: the same operations
in C++, built once per machine) and everything else through ``torch.compile(dynamic=True)``, falling back to eager,
with one warning, where compilation fails; ``kernel`` (compiled.KERNELS) picks one road instead (without it the
compiled road compiles unless
compiled.compiling). ``quantize_eager`` is always the eager torch kernel: the reference.
Inputs of other float dtypes are computed in float32 and cast back: exact when the format is narrower than the
dtype; a format wider than the dtype (e.g. fp16 on a bf16 tensor) is rounded twice (format, then dtype).
"""

from __future__ import annotations

import contextlib
import functools
import math
import struct
from typing import NamedTuple

import torch

from altgrad.quant.format import FloatFormat
from altgrad.quant import kernel_abi, native
from altgrad.quant.device_constants import device_constant
from altgrad.quant.compiled import check_kernel, fused, renamed

ROUNDINGS = kernel_abi.ROUNDINGS
OVERFLOWS = ("saturate", "overflow")

_INT_MIN = -(2**31)
ABS_MASK = 0x7FFFFFFF  # float32 |x| on the bit pattern
INF_BITS = 0x7F800000  # +Inf's bit pattern: finite |x| patterns are below it
_NAN = 0x7FC00000
_INV_POW2_BITS = 254 << 23  # 1/2^k has biased exponent 254 − e(2^k): subtracting the bit patterns inverts 2^k

# Parameter-tensor slots (int32), derived once per (format, rounding, overflow, device): kernel_abi.PARAMS' order.
(_P_SHIFT, _P_LOW, _P_HALF, _P_LSB, _P_FLIP, _P_MAX, _P_OVF, _P_OVF_INF, _P_MAGIC, _P_EMIN_BITS, _P_Y1, _P_Y2,
 _P_EMAX_BITS, _P_CSHIFT) = (kernel_abi.code(kernel_abi.PARAMS, n) for n in (
    "shift", "low", "half", "lsb", "flip", "max", "ovf", "ovf_inf", "magic", "emin_bits", "y1", "y2", "emax_bits",
    "cshift"))
_EXP = 0x7F800000


class Variant(NamedTuple):
    """The optional steps one (format, rounding, overflow) needs: kernels are compiled per variant, not per format.

    Leaving out a step a format cannot need (the parity flip, the sign fix for a zero result, the overflow
    selects) saves vector operations on every element; the numbers themselves stay in the parameter tensor.
    """

    rounding: str
    tie_flip: bool  # nearest with M = 0 and odd 127 − bias: the code's parity is not float32's
    zero_sign: bool  # a zero result drops its sign (the policy has no −0)
    saturates: bool  # overflow and ±Inf both clamp to ±max (a min instead of two selects)
    wide_quantum: bool  # 2^−(emin − M) exceeds 2^127: the subnormal scaling takes two multiplies
    bit_round: bool  # nearest needs the bit-pattern rounding: M = 0 or 23, or 2^(emax+23−M) beyond float32 (bf16)

    @property
    def label(self) -> str:
        """The rounding mode and the steps switched on, e.g. ``nearest_saturates`` (names compiled functions)."""
        return self.rounding + "".join(f"_{name}" for name, on in zip(self._fields[1:], self[1:]) if on)


def _f32_bits(v: float) -> int:
    """The float32 bit pattern of v as a signed int32 value (v must be exactly representable)."""
    return struct.unpack("<i", struct.pack("<f", v))[0]


def _overflow_bits(fmt: FloatFormat, rounding: str, overflow: str) -> tuple[int, int]:
    """Bit patterns a finite overflow and an infinite input become."""
    max_bits = _f32_bits(fmt.max)
    if overflow == "saturate" or fmt.policy == "finite":
        return max_bits, max_bits
    special = INF_BITS if fmt.has_inf else _NAN  # fn: NaN is the only special value
    return (max_bits if rounding == "toward_zero" else special), special  # toward zero never overflows a finite x


def _params(fmt: FloatFormat, rounding: str, overflow: str) -> list[int]:
    """The constants of the kernel for one format, as int32 values."""
    shift = 23 - fmt.mbits
    qexp = fmt.emin - fmt.mbits  # the quantum below the smallest normal is 2^qexp, -149 <= qexp <= 104
    ovf, ovf_inf = _overflow_bits(fmt, rounding, overflow)
    y1 = min(-qexp, 127)
    return [
        shift,
        (1 << shift) - 1,  # bits below the cut
        (1 << (shift - 1)) - 1 if shift > 0 else 0,  # half an ulp minus one: RNE bias before the tie bit
        1 if shift > 0 else 0,  # whether a tie bit exists at all (M = 23 rounds nothing)
        ((fmt.bias - 127) << fmt.mbits) & 1 if shift > 0 else 0,  # code parity = float32 parity xor this
        _f32_bits(fmt.max),
        ovf,
        ovf_inf,
        (qexp + 23 + 127) << 23,  # C = 2^(qexp+23): in [C, 2C) float32's ulp is the quantum q
        (fmt.emin + 127) << 23,  # bit pattern of the smallest normal
        _f32_bits(math.ldexp(1.0, y1)),  # 2^-qexp = Y1 · Y2, each a float32
        _f32_bits(math.ldexp(1.0, -qexp - y1)),
        (fmt.emax + 127) << 23,  # bit pattern of 2^emax, the top binade
        shift << 23,  # adds 23 − M to a biased exponent: 2^e → C = 2^(e+23−M)
    ]


@functools.lru_cache(maxsize=None)
def kernel_variant(fmt: FloatFormat, rounding: str, overflow: str) -> Variant:
    """Which optional kernel steps (format, rounding, overflow) needs (cached: called on every quantize)."""
    p = _params(fmt, rounding, overflow)
    nearest = rounding == "nearest"
    return Variant(rounding, nearest and p[_P_FLIP] != 0, not fmt.has_negative_zero,
                   p[_P_OVF] == p[_P_MAX] and p[_P_OVF_INF] == p[_P_MAX],
                   not nearest and p[_P_Y2] != _f32_bits(1.0),
                   nearest and (fmt.mbits in (0, 23) or fmt.emax + 23 - fmt.mbits > 127))


def _mix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's fmix32 finaliser on int32 with wrapping multiplies (logical shifts via masks)."""
    h = h ^ ((h >> 16) & 0xFFFF)
    h = h * -2048144789  # 0x85EBCA6B
    h = h ^ ((h >> 13) & 0x7FFFF)
    h = h * -1028477387  # 0xC2B2AE35
    return h ^ ((h >> 16) & 0xFFFF)


def random_bits(shape: torch.Size, seed: torch.Tensor) -> torch.Tensor:
    """Counter-based uniform int32 bits for every element index, from a 0-dim int32 ``seed`` (no state).

    fmix32(i·φ + key(seed)): the golden-ratio multiplier spreads consecutive counters over all bits before the
    finaliser, and a seed moves the whole stream by a pseudo-random offset (about 2^32 apart).
    """
    idx = torch.arange(math.prod(shape), dtype=torch.int32, device=seed.device).view(shape)
    return _mix32(idx * -1640531535 + _mix32(seed ^ 0x5BD1E995))  # 0x9E3779B1 = 2^32/φ


def _round_bits(xf: torch.Tensor, p: torch.Tensor, v: Variant, r: torch.Tensor | None) -> torch.Tensor:
    """Quantize a float32 tensor; returns the float32 result. ``p`` is the int32 parameter tensor."""
    bits = xf.view(torch.int32)
    sign = bits & _INT_MIN
    a0 = bits & ABS_MASK
    if v.rounding == "nearest" and not v.bit_round:
        # One add for every region: C = 2^(e+23−M), e = |x|'s binade held in [emin, emax] (below emin the grid is
        # the subnormal quantum's, above emax anything is out of range anyway). In [C, 2C) float32's spacing is
        # the quantum 2^(e−M), so |x| + C rounds there to nearest-even (even significand = even code here), and
        # − C is exact. Inf stays Inf; NaN is restored at the end.
        e = torch.clamp(a0 & _EXP, min=p[_P_EMIN_BITS], max=p[_P_EMAX_BITS])
        c = (e + p[_P_CSHIFT]).view(torch.float32)
        m = ((a0.view(torch.float32) + c) - c).view(torch.int32)
        return _finish(m, a0, sign, p, v)
    a = torch.clamp(a0, max=INF_BITS)  # NaN payloads would overflow the rounding add; NaN is restored at the end

    # Normal region: round the float32 pattern at the cut (23 − M bits), carrying into the exponent.
    low = p[_P_LOW]
    if v.rounding == "nearest":
        parity = a >> p[_P_SHIFT]
        if v.tie_flip:
            parity = parity ^ p[_P_FLIP]
        normal = (a + (p[_P_HALF] + (parity & p[_P_LSB]))) & ~low
    elif v.rounding == "stochastic":
        normal = (a + (r & low)) & ~low
    else:
        normal = a & ~low

    # Below the smallest normal the grid is fixed-point with quantum q = 2^(emin−M) = 2^qexp.
    c = p[_P_MAGIC].view(torch.float32)
    if v.rounding == "nearest":
        # |x| + C with C = 2^(qexp+23) lands in [C, 2C), where float32's own spacing is q: the hardware's
        # round-to-nearest-even does the work, and even there means an even k = the even code.
        sub = ((a.view(torch.float32) + c) - c).view(torch.int32)
    else:
        # y = |x| / q (< 2^M; a power-of-two scaling, exact except that a quantum above 1 can push tiny |x|
        # below float32's range, far under one quantum), k = floor(y), plus one with probability frac(y) for
        # stochastic rounding (u has 24 random bits: frac(y) counts to 2^-24 of a quantum); then k·q is rebuilt
        # exactly as (C's bits + k) − C.
        y = torch.minimum(a, p[_P_EMIN_BITS]).view(torch.float32) * p[_P_Y1].view(torch.float32)
        if v.wide_quantum:
            y = y * p[_P_Y2].view(torch.float32)
        yi = torch.floor(y)
        k = yi.to(torch.int32)
        if v.rounding == "stochastic":
            u = ((r >> 8) & 0xFFFFFF).to(torch.float32) * 2.0**-24
            k = k + ((y - yi) > u).to(torch.int32)
        sub = ((p[_P_MAGIC] + k).view(torch.float32) - c).view(torch.int32)
    m = torch.where(a < p[_P_EMIN_BITS], sub, normal)
    return _finish(m, a0, sign, p, v)


def _finish(m: torch.Tensor, a0: torch.Tensor, sign: torch.Tensor, p: torch.Tensor, v: Variant) -> torch.Tensor:
    """Range, specials and sign on the rounded magnitude bits ``m`` (a0: |x|'s bits); the float32 result."""
    if v.saturates:
        m = torch.clamp(m, max=p[_P_MAX])
    else:
        m = torch.where(m > p[_P_MAX], torch.where(a0 >= INF_BITS, p[_P_OVF_INF], p[_P_OVF]), m)
    out = m | (torch.where(m != 0, sign, 0) if v.zero_sign else sign)
    return torch.where(a0 > INF_BITS, _NAN, out).view(torch.float32)


def unscale(q: torch.Tensor, scale: torch.Tensor, pow2: bool) -> torch.Tensor:
    """q / scale rounded once to float32, on every backend (float32 q and scale).

    Triton's float32 ``/`` is PTX div.full (up to 2 ulp off), so it is not used: a power-of-two scale (``pow2``:
    2^k with |k| <= 126, as every scaler produces it) is undone by multiplying with its exact reciprocal, built
    from the exponent bits; any other scale by a float64 division, which rounds to float32 correctly (53 >= 2·24 + 2
    bits, so the double rounding is innocuous: Figueroa 1995). Both equal IEEE float32 division bit for bit.
    """
    if pow2:
        inv = (_INV_POW2_BITS - scale.view(torch.int32)).view(torch.float32)  # 2^-k: biased exponent 254 − e
        return q * inv
    return (q.to(torch.float64) / scale.to(torch.float64)).to(torch.float32)


def scaled_kernel(x: torch.Tensor, p: torch.Tensor, variant: Variant, scale: torch.Tensor | None,
                  seed: torch.Tensor | None, scale_pow2: bool = False) -> torch.Tensor:
    """quantize(x·scale)/scale (scale None: quantize(x)) with the parameters ``p``: pure tensor maths, traceable."""
    xf = x.to(torch.float32)
    if scale is not None:
        xf = xf * scale
    r = random_bits(xf.shape, seed) if variant.rounding == "stochastic" else None
    q = _round_bits(xf, p, variant, r)
    if scale is not None:
        q = unscale(q, scale, scale_pow2)
    return q.to(x.dtype)


def _build(variant: Variant, scaled: str | None) -> fused:
    if scaled is not None:
        pow2 = scaled == "pow2"

        def run(x: torch.Tensor, p: torch.Tensor, scale: torch.Tensor, seed: torch.Tensor | None) -> torch.Tensor:
            return scaled_kernel(x, p, variant, scale, seed, pow2)
    else:
        def run(x: torch.Tensor, p: torch.Tensor, seed: torch.Tensor | None) -> torch.Tensor:
            return scaled_kernel(x, p, variant, None, seed)
    return fused(renamed(run, f"quantize_{variant.label}{'_scaled_' + scaled if scaled else ''}"))


# The scale constants a native call reads only to compute a scale or statistics: a bare quantize does neither.
_UNUSED_CONSTS = torch.zeros(3, dtype=torch.float32)
_KERNELS: dict[tuple[Variant, str | None], fused] = {}


def compiled_kernel(variant: Variant, scaled: str | None) -> fused:
    """The compiled kernel of ``variant``: unscaled (None), or with a ``"pow2"`` or ``"any"`` scale."""
    fn = _KERNELS.get((variant, scaled))
    if fn is None:
        fn = _KERNELS[(variant, scaled)] = _build(variant, scaled)
    return fn


def check_modes(rounding: str, overflow: str) -> None:
    """ValueError naming the bad argument and the valid choices."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding={rounding!r} is not valid; valid: {', '.join(ROUNDINGS)}")
    if overflow not in OVERFLOWS:
        raise ValueError(f"overflow={overflow!r} is not valid; valid: {', '.join(OVERFLOWS)}")


def kernel_params(fmt: FloatFormat, rounding: str, overflow: str, device: torch.device) -> torch.Tensor:
    """The int32 parameter tensor of (format, modes), cached per device so calls never copy host → device."""
    return device_constant(("kernel params", fmt, rounding, overflow), lambda: _params(fmt, rounding, overflow),
                           torch.int32, device)


def draw_seed(device: torch.device, generator: torch.Generator | None = None,
              seed: int | None = None) -> torch.Tensor:
    """0-dim int32 seed tensor: from ``seed``, else one draw from ``generator`` (or the default generator)."""
    if seed is not None:
        return torch.tensor(int(seed) & 0x7FFFFFFF, dtype=torch.int32, device=device)
    gen_device = generator.device if generator is not None else device
    # drawn as int32 directly: the same value as an int64 draw (the range < 2^32 takes one 32-bit draw either way)
    s = torch.randint(0, 2**31 - 1, (), generator=generator, device=gen_device, dtype=torch.int32)
    return s.to(device)  # the same tensor where it was drawn on ``device``


def _as_rows(x: torch.Tensor, scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Few distinct kernel shapes: 1-D without a scale; (rows, last dim) with one."""
    if scale is None:
        return (x if x.dim() == 1 else x.reshape(-1)), None
    cols = x.shape[-1] if x.dim() >= 1 else 1
    x2 = x.reshape(-1, cols)
    if scale.dim() == 0:
        return x2, scale
    if scale.shape[-1] == 1 and scale.numel() * cols == x.numel():  # one scale per row
        return x2, scale.reshape(-1, 1)
    return x2, scale.expand(x.shape).reshape(-1, cols)


def _road(compiled: bool | None, kernel: str | None) -> str:
    """The kernel a call takes: ``kernel``; else ``eager`` for compiled=False, ``auto`` otherwise."""
    if kernel is not None:
        return check_kernel(kernel, "kernel")
    return "eager" if compiled is False else "auto"


def _run(x: torch.Tensor, fmt: FloatFormat, rounding: str, overflow: str, scale: torch.Tensor | None,
         generator: torch.Generator | None, seed: int | torch.Tensor | None, compiled: bool | None,
         scale_pow2: bool = False, kernel: str | None = None) -> torch.Tensor:
    if not isinstance(fmt, FloatFormat):
        raise ValueError(f"fmt must be a FloatFormat (see altgrad.quant.get_format), got {type(fmt).__name__}")
    check_modes(rounding, overflow)
    if not x.is_floating_point():
        raise ValueError(f"quantize needs a floating-point tensor, got dtype {x.dtype}")
    p = kernel_params(fmt, rounding, overflow, x.device)
    s = None
    if rounding == "stochastic":
        s = seed if isinstance(seed, torch.Tensor) else draw_seed(x.device, generator, seed)
    variant = kernel_variant(fmt, rounding, overflow)
    road = _road(compiled, kernel)
    if road == "native" and not native.takes(x):
        raise ValueError(f"kernel='native' takes float32 CPU tensors only, not a {x.dtype} tensor on {x.device}; "
                         "valid: auto, compiled, eager")
    if road in ("auto", "native") and native.takes(x):
        k = native.require() if road == "native" else native.kernel()
        if k is not None:
            given = None if scale is None else scale.detach().to(device=x.device, dtype=torch.float32).contiguous()
            y = native.quant_call(k, x, p, rounding, native.variant_flags(variant), s,
                                  "none" if given is None else "given", scale_pow2, _UNUSED_CONSTS, scale=given)
            if y is not None:
                return y
    xr, sc = _as_rows(x, scale)
    kernel = compiled_kernel(variant, None if sc is None else "pow2" if scale_pow2 else "any")
    args = (xr, p, s) if sc is None else (xr, p, sc.to(torch.float32), s)
    # not differentiable; no_grad (µs per call) only where autograd would otherwise record the kernel
    needs_grad = torch.is_grad_enabled() and any(a is not None and a.requires_grad for a in args)
    with torch.no_grad() if needs_grad else contextlib.nullcontext():
        out = kernel(*args, compiled=False if road == "eager" else True if road == "compiled" else compiled)
    return out if xr is x else out.view(x.shape)


def quantize(x: torch.Tensor, fmt: FloatFormat, rounding: str = "nearest", overflow: str = "saturate",
             generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
    """x rounded onto ``fmt``'s grid (same dtype and shape; not differentiable, see fake_quant).

    rounding: ``nearest`` (ties to the even code), ``stochastic`` (unbiased; reproducible from ``seed`` or one
    draw from ``generator``), ``toward_zero``. overflow: ``saturate`` (clamp to ±max, Inf too) or ``overflow``
    (±Inf where the policy has Inf, NaN where it has only NaN; ``finite`` formats always saturate).
    NaN in → NaN out; −0 is kept only where the policy has −0.
    """
    return _run(x, fmt, rounding, overflow, None, generator, seed, compiled=None)


def quantize_eager(x: torch.Tensor, fmt: FloatFormat, rounding: str = "nearest", overflow: str = "saturate",
                   generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
    """The same as :func:`quantize`, always with the uncompiled kernel (a reference for tests and debugging)."""
    return _run(x, fmt, rounding, overflow, None, generator, seed, compiled=False)


def quantize_scaled(x: torch.Tensor, fmt: FloatFormat, scale: torch.Tensor | None, rounding: str = "nearest",
                    overflow: str = "saturate", generator: torch.Generator | None = None,
                    seed: int | torch.Tensor | None = None, compiled: bool | None = None,
                    scale_pow2: bool = False, kernel: str | None = None) -> torch.Tensor:
    """quantize(x·scale)/scale in one fused pass (``scale`` float32, broadcastable to x; None = 1).

    ``kernel`` (compiled.KERNELS) picks the road; without it ``auto``, where ``compiled=False`` makes the torch
    road eager and ``None`` leaves it to compiled.compiling. ``scale_pow2=True`` promises every scale is a power of
    two in [2^-126, 2^126] (what pow2 and block scalers give): the unscaling is then one exact multiply instead of a
    float64 division (see ``unscale``).
    """
    return _run(x, fmt, rounding, overflow, scale, generator, seed, compiled=compiled, scale_pow2=scale_pow2,
                kernel=kernel)

"""Scalers: choose the scale s for x (the value quantized is x·s, the result divided by s).

Each ScalingSpec kind is an nn.Module whose state (amax history, last scale) lives in buffers, so it is saved in
checkpoints. Every scale is a finite positive float32: an amax of 0, Inf or NaN falls back to the previous scale
(or 1), and scales are clamped to [2^-126, 2^126]. All maths stays on tensors (no host sync).
"""

from __future__ import annotations

import abc
import math

import torch

from altgrad.quant.changes import Watched
from altgrad.quant.device_constants import device_constant
from altgrad.quant.format import FloatFormat
from altgrad.quant.compiled import stored_once
from altgrad.quant.rounding import ABS_MASK, INF_BITS
from altgrad.quant.spec import ScalingSpec

_S_MIN = 2.0**-126
_S_MAX = 2.0**126


def finite_amax(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """max |x| over finite elements (float32; 0 when there are none), over all or along ``dim`` (kept).

    Computed on the float32 bit patterns: with the sign bit cleared, finite values order like their bits and Inf/NaN
    patterns are the largest (>= 0x7F800000), so a select and one integer max replace abs, isfinite, a select and
    a NaN-propagating float max (the same values bit for bit; 8 % of a CPU quantizer call, amax pass included).
    """
    bits = x.detach().to(torch.float32).view(torch.int32) & ABS_MASK
    bits = torch.where(bits < INF_BITS, bits, 0)
    if dim is None:
        amax = bits.amax() if bits.numel() else bits.new_zeros(())
    else:
        amax = bits.amax(dim=dim, keepdim=True)
    return amax.view(torch.float32)


def exact_reciprocal(a: torch.Tensor) -> torch.Tensor:
    """1/a correctly rounded to float32 on every backend (Triton's float32 reciprocal is approximate; a float64
    reciprocal rounded to float32 is exact: 53 >= 2·24 + 2 bits)."""
    return torch.reciprocal(a.to(torch.float64)).to(torch.float32)


def pow2_floor(s: torch.Tensor) -> torch.Tensor:
    """2^floor(log2 s) for positive normal float32 s (drops the mantissa bits)."""
    return (s.view(torch.int32) & 0x7F800000).view(torch.float32)


# Slots of the per-(format, margin, device) float32 constant tensor that the pure scale functions read.
C_MAX, C_MARGIN, C_MIN_NORMAL = range(3)


def scale_consts(fmt: FloatFormat, margin: int, device: torch.device) -> torch.Tensor:
    """float32 [max, 2^-margin, smallest normal] on ``device``, cached (no host → device copy per call)."""
    return device_constant(("scale consts", fmt, margin), lambda: [fmt.max, 2.0 ** -margin, math.ldexp(1.0, fmt.emin)],
                           torch.float32, device)


def scale_from_amax(amax: torch.Tensor, consts: torch.Tensor, prev: torch.Tensor | float, pow2: bool) -> torch.Tensor:
    """s = max / amax / 2^margin (max and 2^-margin from ``consts``), with ``prev`` where amax is 0/Inf/NaN; finite,
    positive, clamped to [2^-126, 2^126], rounded down to a power of two when ``pow2``."""
    valid = torch.isfinite(amax) & (amax > 0)
    s = torch.where(valid, exact_reciprocal(torch.where(valid, amax, 1.0)) * consts[C_MAX], prev) * consts[C_MARGIN]
    s = torch.clamp(torch.nan_to_num(s, nan=1.0, posinf=_S_MAX), _S_MIN, _S_MAX).to(torch.float32)
    return stored_once(pow2_floor(s) if pow2 else s)  # read by every element's loop


# Pure scale functions, one per kind: (x, consts, state, pow2, reduce, block) -> (scale, new state).
# They own the semantics; the Scaler modules own the state (buffers) and apply the new state.
State = tuple[torch.Tensor, ...]


def none_scale(x: torch.Tensor, consts: torch.Tensor, state: State, pow2: bool, reduce: str,
               block: int) -> tuple[torch.Tensor | None, State]:
    """No scaling."""
    return None, ()


def tensor_scale(x: torch.Tensor, consts: torch.Tensor, state: State, pow2: bool, reduce: str,
                 block: int) -> tuple[torch.Tensor, State]:
    """One scale from x's amax; state = (last scale,), the fallback for a 0/Inf/NaN amax."""
    s = scale_from_amax(finite_amax(x), consts, state[0], pow2)
    return s, (s,)


def delayed_scale(x: torch.Tensor, consts: torch.Tensor, state: State, pow2: bool, reduce: str,
                  block: int) -> tuple[torch.Tensor, State]:
    """Scale from the amax history (state = (history, last scale)); x's amax is pushed to the history's front."""
    hist, prev = state
    cur = finite_amax(x)
    ref = hist.amax() if reduce == "max" else hist[0]
    s = scale_from_amax(torch.where(ref > 0, ref, cur), consts, prev, pow2)
    return s, (torch.cat([cur.reshape(1), hist[:-1]]), s)


def channel_scale(x: torch.Tensor, consts: torch.Tensor, state: State, pow2: bool, reduce: str,
                  block: int) -> tuple[torch.Tensor, State]:
    """One scale per row (amax over the last dim); fallback 1; no state."""
    amax = finite_amax(x) if x.dim() < 2 else finite_amax(x, dim=-1)
    return scale_from_amax(amax, consts, 1.0, pow2), ()


def block_scale(x: torch.Tensor, consts: torch.Tensor, state: State, pow2: bool, reduce: str,
                block: int) -> tuple[torch.Tensor, State]:
    """One power-of-two scale per ``block`` values of the last dim (x's shape); fallback 1; no state."""
    cols = x.shape[-1] if x.dim() else 1
    pad = (-cols) % block
    a = torch.nn.functional.pad(x.detach().reshape(-1, cols).to(torch.float32), (0, pad))
    amax = finite_amax(a.reshape(a.shape[0], -1, block), dim=-1)  # (rows, blocks, 1)
    s = scale_from_amax(amax, consts, 1.0, pow2=True).reshape(a.shape[0], -1)  # (rows, blocks)
    # column j takes its block's scale by a gather; the equivalent expand → reshape → [:, :cols] slice was
    # miscompiled by inductor (torch 2.13, CPU) whenever cols is not a multiple of the block: wrong scales past
    # the first block (tests/quant/test_compiled.py::test_block_scales_compile_right_when_rows_are_not_whole_blocks)
    s = s[:, torch.arange(cols, device=s.device) // block]
    return s.reshape(x.shape), ()


class Scaler(Watched, abc.ABC):
    """Base: ``forward(x, update)`` returns s broadcastable to x; ``update=False`` leaves the state untouched.

    ``scale_fn`` is the kind's pure function and ``state()`` its buffers, so fused callers can run the scale
    inside one compiled graph and write the new state back with ``load_state_``. A change of its attributes or
    buffers is counted (changes.Watched): plans resolved from them are then resolved again.
    """

    scale_fn = staticmethod(none_scale)

    def __init__(self, fmt: FloatFormat, spec: ScalingSpec) -> None:
        super().__init__()
        self.fmt = fmt
        self.spec = spec

    def state(self) -> State:
        """The buffers the scale depends on and updates (in the order ``scale_fn`` takes them)."""
        return ()

    @torch.no_grad()
    def load_state_(self, new: State) -> None:
        """Copy a state returned by ``scale_fn`` into the buffers."""
        for buf, value in zip(self.state(), new):
            buf.copy_(value)

    def forward(self, x: torch.Tensor, update: bool = True) -> torch.Tensor:
        """The scale for x; with ``update`` the scaler's state (history, last scale) records this call."""
        spec = self.spec
        consts = scale_consts(self.fmt, spec.margin, x.device)
        s, new = type(self).scale_fn(x, consts, self.state(), spec.pow2, spec.reduce, spec.block)
        if update:
            self.load_state_(new)
        return s


class NoScaler(Scaler):
    """s = 1."""

    def forward(self, x: torch.Tensor, update: bool = True) -> torch.Tensor:
        return torch.ones((), dtype=torch.float32, device=x.device)


class TensorScaler(Scaler):
    """One scale from the current tensor's amax; the last good scale is the fallback for a 0/Inf/NaN amax."""

    scale_fn = staticmethod(tensor_scale)

    def __init__(self, fmt: FloatFormat, spec: ScalingSpec) -> None:
        super().__init__(fmt, spec)
        self.register_buffer("scale", torch.ones((), dtype=torch.float32))

    def state(self) -> State:
        return (self.scale,)


class DelayedScaler(Scaler):
    """Scale from the amax history of previous calls (``max`` or ``most_recent``); the current amax is pushed after.

    Before any history exists (all zeros) the current amax is used, so the first step is not blind.
    """

    scale_fn = staticmethod(delayed_scale)

    def __init__(self, fmt: FloatFormat, spec: ScalingSpec) -> None:
        super().__init__(fmt, spec)
        self.register_buffer("amax_history", torch.zeros(spec.history, dtype=torch.float32))
        self.register_buffer("scale", torch.ones((), dtype=torch.float32))

    def state(self) -> State:
        return (self.amax_history, self.scale)


class ChannelScaler(Scaler):
    """One scale per row (every index of the leading dims, amax over the last dim); fallback 1."""

    scale_fn = staticmethod(channel_scale)


class BlockScaler(Scaler):
    """One power-of-two scale per ``block`` contiguous values of the last dim (MX-style shared exponent).

    s = 2^floor(log2(max / amax_block)), so a block's largest value never saturates. (OCP MX picks
    2^(emax − floor(log2 amax)), up to one binade larger, and saturates the top of the block instead.)
    Returns a scale of x's shape; an all-zero (or non-finite) block gets s = 1.
    """

    scale_fn = staticmethod(block_scale)


_SCALERS: dict[str, type[Scaler]] = {
    "none": NoScaler, "tensor": TensorScaler, "delayed": DelayedScaler, "channel": ChannelScaler,
    "block": BlockScaler}


def make_scaler(spec: ScalingSpec, fmt: FloatFormat) -> Scaler:
    """The Scaler module for ``spec.kind``."""
    return _SCALERS[spec.kind](fmt, spec)


def compute_scale(x: torch.Tensor, fmt: FloatFormat, spec: ScalingSpec) -> torch.Tensor | None:
    """Stateless scale for x (None for kind ``none``); ``delayed`` has no history here, so it uses x's amax."""
    if spec.kind == "none":
        return None
    if spec.kind in ("tensor", "delayed"):
        return scale_from_amax(finite_amax(x), scale_consts(fmt, spec.margin, x.device), 1.0, spec.pow2)
    return _SCALERS[spec.kind](fmt, spec)(x, update=False)

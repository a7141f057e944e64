"""Scalers: choose the scale s for x (the value quantized is x·s, the result divided by s).

Each ScalingSpec kind is an nn.Module whose state (amax history, last scale) lives in buffers, so it is saved in
checkpoints. Every scale is a finite positive float32: an amax of 0, Inf or NaN falls back to the previous scale
(or 1), and scales are clamped to [2^-126, 2^126]. All maths stays on tensors (no host sync).
"""

from __future__ import annotations

import abc

import torch
from torch import nn

from altgrad.quant.format import FloatFormat
from altgrad.quant.spec import ScalingSpec

_S_MIN = 2.0**-126
_S_MAX = 2.0**126


def finite_amax(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """max |x| over finite elements (float32; 0 when there are none), over all or along ``dim`` (kept)."""
    a = x.detach().abs().to(torch.float32)
    a = torch.where(torch.isfinite(a), a, 0.0)
    if dim is None:
        return a.amax() if a.numel() else a.new_zeros(())
    return a.amax(dim=dim, keepdim=True)


def pow2_floor(s: torch.Tensor) -> torch.Tensor:
    """2^floor(log2 s) for positive normal float32 s (drops the mantissa bits)."""
    return (s.view(torch.int32) & 0x7F800000).view(torch.float32)


def scale_from_amax(fmt: FloatFormat, amax: torch.Tensor, prev: torch.Tensor | float, margin: int,
                    pow2: bool) -> torch.Tensor:
    """s = max / amax / 2^margin, with ``prev`` where amax is 0/Inf/NaN; finite, positive, optionally pow2."""
    valid = torch.isfinite(amax) & (amax > 0)
    s = torch.where(valid, fmt.max / torch.where(valid, amax, 1.0), prev) * (2.0 ** -margin)
    s = torch.clamp(torch.nan_to_num(s, nan=1.0, posinf=_S_MAX), _S_MIN, _S_MAX).to(torch.float32)
    return pow2_floor(s) if pow2 else s


class Scaler(nn.Module, abc.ABC):
    """Base: ``forward(x, update)`` returns s broadcastable to x; ``update=False`` leaves the state untouched."""

    def __init__(self, fmt: FloatFormat, spec: ScalingSpec) -> None:
        super().__init__()
        self.fmt = fmt
        self.spec = spec

    @abc.abstractmethod
    def forward(self, x: torch.Tensor, update: bool = True) -> torch.Tensor:
        """The scale for x; with ``update`` the scaler's state (history, last scale) records this call."""


class NoScaler(Scaler):
    """s = 1."""

    def forward(self, x: torch.Tensor, update: bool = True) -> torch.Tensor:
        return torch.ones((), dtype=torch.float32, device=x.device)


class TensorScaler(Scaler):
    """One scale from the current tensor's amax; the last good scale is the fallback for a 0/Inf/NaN amax."""

    def __init__(self, fmt: FloatFormat, spec: ScalingSpec) -> None:
        super().__init__(fmt, spec)
        self.register_buffer("scale", torch.ones((), dtype=torch.float32))

    def forward(self, x: torch.Tensor, update: bool = True) -> torch.Tensor:
        s = scale_from_amax(self.fmt, finite_amax(x), self.scale, self.spec.margin, self.spec.pow2)
        if update:
            with torch.no_grad():
                self.scale.copy_(s)
        return s


class DelayedScaler(Scaler):
    """Scale from the amax history of previous calls (``max`` or ``most_recent``); the current amax is pushed after.

    Before any history exists (all zeros) the current amax is used, so the first step is not blind.
    """

    def __init__(self, fmt: FloatFormat, spec: ScalingSpec) -> None:
        super().__init__(fmt, spec)
        self.register_buffer("amax_history", torch.zeros(spec.history, dtype=torch.float32))
        self.register_buffer("scale", torch.ones((), dtype=torch.float32))

    def forward(self, x: torch.Tensor, update: bool = True) -> torch.Tensor:
        cur = finite_amax(x)
        hist = self.amax_history
        ref = hist.amax() if self.spec.reduce == "max" else hist[0]
        amax = torch.where(ref > 0, ref, cur)
        s = scale_from_amax(self.fmt, amax, self.scale, self.spec.margin, self.spec.pow2)
        if update:
            with torch.no_grad():
                hist.copy_(torch.cat([cur.reshape(1), hist[:-1]]))
                self.scale.copy_(s)
        return s


class ChannelScaler(Scaler):
    """One scale per row (every index of the leading dims, amax over the last dim); fallback 1."""

    def forward(self, x: torch.Tensor, update: bool = True) -> torch.Tensor:
        if x.dim() < 2:
            return scale_from_amax(self.fmt, finite_amax(x), 1.0, self.spec.margin, self.spec.pow2)
        return scale_from_amax(self.fmt, finite_amax(x, dim=-1), 1.0, self.spec.margin, self.spec.pow2)


class BlockScaler(Scaler):
    """One power-of-two scale per ``block`` contiguous values of the last dim (MX-style shared exponent).

    s = 2^floor(log2(max / amax_block)), so a block's largest value never saturates. (OCP MX picks
    2^(emax − floor(log2 amax)), up to one binade larger, and saturates the top of the block instead.)
    Returns a scale of x's shape; an all-zero (or non-finite) block gets s = 1.
    """

    def forward(self, x: torch.Tensor, update: bool = True) -> torch.Tensor:
        b = self.spec.block
        cols = x.shape[-1] if x.dim() else 1
        pad = (-cols) % b
        a = torch.nn.functional.pad(x.detach().reshape(-1, cols).to(torch.float32), (0, pad))
        amax = finite_amax(a.reshape(a.shape[0], -1, b), dim=-1)  # (rows, blocks, 1)
        s = scale_from_amax(self.fmt, amax, 1.0, self.spec.margin, pow2=True)
        s = s.expand(-1, -1, b).reshape(a.shape[0], -1)[:, :cols]
        return s.reshape(x.shape)


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
        return scale_from_amax(fmt, finite_amax(x), 1.0, spec.margin, spec.pow2)
    return _SCALERS[spec.kind](fmt, spec)(x, update=False)

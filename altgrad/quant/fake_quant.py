"""Straight-through fake quantization for training: values on the format's grid forward, gradients untouched.

``fake_quant``: forward x·s → quantize → /s, backward identity (the straight-through estimator).
``quant_grad``: forward identity, backward quantizes the incoming gradient (what a low-precision backward GEMM
would consume). TensorQuantizer and GradQuantizer are the nn.Module forms that keep scaler state and per-call
statistics in buffers.
"""

from __future__ import annotations

import torch
from torch import nn

from altgrad.quant.format import get_format
from altgrad.quant.rounding import draw_seed, quantize_scaled
from altgrad.quant.scaling import compute_scale, make_scaler
from altgrad.quant.spec import QuantSpec
from altgrad.quant.stats import STAT_NAMES, quant_stats


class _FakeQuant(torch.autograd.Function):
    """quantize(x·s)/s forward; the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx, x, fmt, rounding, overflow, scale, seed):  # noqa: ANN001, ANN205 - autograd signature
        return quantize_scaled(x, fmt, scale, rounding, overflow, seed=seed)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        return grad, None, None, None, None, None


def _seed_for(spec: QuantSpec, x: torch.Tensor) -> torch.Tensor | None:
    return draw_seed(x.device) if spec.rounding == "stochastic" else None


def fake_quant(x: torch.Tensor, spec: QuantSpec, scale: torch.Tensor | None = None) -> torch.Tensor:
    """x on the grid {v / s} of ``spec`` (straight-through gradient); s from ``spec.scaling`` unless given."""
    if scale is None:
        scale = compute_scale(x, spec.format, spec.scaling)
    return _FakeQuant.apply(x, spec.format, spec.rounding, spec.overflow, scale, _seed_for(spec, x))


class _QuantGrad(torch.autograd.Function):
    """Identity forward; backward returns the gradient quantized by ``spec`` (and lets ``owner`` record it)."""

    @staticmethod
    def forward(ctx, x, spec, seed, owner):  # noqa: ANN001, ANN205
        ctx.spec, ctx.owner = spec, owner
        ctx.save_for_backward(seed)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        spec, owner = ctx.spec, ctx.owner
        (seed,) = ctx.saved_tensors
        if owner is not None:
            scale = owner.scaler(grad, update=True) if spec.scaling.kind != "none" else None
        else:
            scale = compute_scale(grad, spec.format, spec.scaling)
        gq = quantize_scaled(grad, spec.format, scale, spec.rounding, spec.overflow, seed=seed)
        if owner is not None and owner.track_stats:
            owner.stats.copy_(quant_stats(grad, gq, spec.format, scale))
        return gq, None, None, None


def _default_grad_spec() -> QuantSpec:
    return QuantSpec(get_format("e5m2"))


def quant_grad(x: torch.Tensor, spec: QuantSpec | None = None) -> torch.Tensor:
    """Identity forward; the backward quantizes the incoming gradient with ``spec`` (default: e5m2, tensor scale)."""
    spec = spec or _default_grad_spec()
    seed = _seed_for(spec, x)
    return _QuantGrad.apply(x, spec, seed if seed is not None else x.new_zeros((), dtype=torch.int32), None)


class TensorQuantizer(nn.Module):
    """STE fake quantization of one tensor role with the spec's scaling; scaler state and ``stats`` in buffers.

    ``enabled = False`` makes it the identity (for shadow passes). Scaler state is updated only in training mode.
    """

    def __init__(self, spec: QuantSpec, role: str = "weight", track_stats: bool = True) -> None:
        super().__init__()
        if not isinstance(spec, QuantSpec):
            raise ValueError(f"TensorQuantizer needs a QuantSpec, got {type(spec).__name__}")
        self.spec = spec
        self.role = role
        self.enabled = True
        self.track_stats = track_stats
        self.scaler = make_scaler(spec.scaling, spec.format)
        self.register_buffer("stats", torch.zeros(len(STAT_NAMES), dtype=torch.float32))

    def _scale(self, x: torch.Tensor, update: bool) -> torch.Tensor | None:
        return None if self.spec.scaling.kind == "none" else self.scaler(x, update=update)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x
        spec = self.spec
        scale = self._scale(x, update=self.training)
        y = _FakeQuant.apply(x, spec.format, spec.rounding, spec.overflow, scale, _seed_for(spec, x))
        if self.track_stats:
            with torch.no_grad():
                self.stats.copy_(quant_stats(x, y, spec.format, scale))
        return y

    def scale_for(self, x: torch.Tensor) -> torch.Tensor:
        """The scale a forward on x would use now (broadcastable to x; 1 without scaling); no state change."""
        s = self._scale(x, update=False)
        return torch.ones((), dtype=torch.float32, device=x.device) if s is None else s

    @torch.no_grad()
    def project_(self, w: torch.Tensor, rounding: str | None = None, seed: int | None = None) -> torch.Tensor:
        """Put w itself on the grid {v / s} in place (weights stored without an fp32 master); returns w.

        Stochastic rounding draws from ``seed`` when given (reproducible storage), else from torch's default RNG.
        """
        spec = self.spec
        rounding = rounding or spec.rounding
        scale = self._scale(w, update=False)
        seed = draw_seed(w.device, seed=seed) if rounding == "stochastic" else None
        w.copy_(quantize_scaled(w, spec.format, scale, rounding, spec.overflow, seed=seed))
        return w

    def stat_dict(self) -> dict[str, torch.Tensor]:
        """STAT_NAMES → 0-dim tensors (still on device; reading them as floats is the caller's sync)."""
        return dict(zip(STAT_NAMES, self.stats.unbind(0)))

    def extra_repr(self) -> str:
        s = self.spec
        return f"role={self.role}, format={s.format}, rounding={s.rounding}, scaling={s.scaling.kind}"


class GradQuantizer(nn.Module):
    """Identity forward; quantizes grad_output in the backward pass with ``spec``, recording ``stats`` there."""

    def __init__(self, spec: QuantSpec | None = None, track_stats: bool = True) -> None:
        super().__init__()
        spec = spec or _default_grad_spec()
        if not isinstance(spec, QuantSpec):
            raise ValueError(f"GradQuantizer needs a QuantSpec, got {type(spec).__name__}")
        self.spec = spec
        self.role = "grad"
        self.enabled = True
        self.track_stats = track_stats
        self.scaler = make_scaler(spec.scaling, spec.format)
        self.register_buffer("stats", torch.zeros(len(STAT_NAMES), dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled or not torch.is_grad_enabled() or not x.requires_grad:
            return x
        seed = _seed_for(self.spec, x)
        seed = seed if seed is not None else x.new_zeros((), dtype=torch.int32)
        return _QuantGrad.apply(x, self.spec, seed, self)

    def stat_dict(self) -> dict[str, torch.Tensor]:
        """STAT_NAMES → 0-dim tensors of the last backward pass."""
        return dict(zip(STAT_NAMES, self.stats.unbind(0)))

    def extra_repr(self) -> str:
        s = self.spec
        return f"format={s.format}, rounding={s.rounding}, scaling={s.scaling.kind}"

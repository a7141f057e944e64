"""Straight-through fake quantization for training: values on the format's grid forward, gradients untouched.

``fake_quant``: forward x·s → quantize → /s, backward identity (the straight-through estimator).
``quant_grad``: forward identity, backward quantizes the incoming gradient (what a low-precision backward GEMM
would consume). TensorQuantizer and GradQuantizer are the nn.Module forms that keep scaler state and per-call
statistics in buffers.

Statistics cost about as much as the quantization itself, so they are computed only while ``track_stats`` is on
(the default). When it is off, ``stats`` keeps the values of the last call that recorded them; a switch that turns
``track_stats`` on and off per training step (FakeQuantCallback, ``quant.stats=demand``) gives every quantizer a
shared StatsRecord, and ``stats_step`` then says which step those values are from.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import NamedTuple

import torch
from torch import nn

from altgrad.quant.format import get_format
from altgrad.quant.fused import compile_enabled, fused
from altgrad.quant.quant_call import quant_call, quant_call_body, quant_call_many
from altgrad.quant.rounding import draw_seed, kernel_params, kernel_variant, quantize_scaled
from altgrad.quant.scaling import Scaler, compute_scale, make_scaler, scale_consts
from altgrad.quant.spec import QuantSpec
from altgrad.quant.stats import STAT_NAMES


class _FakeQuant(torch.autograd.Function):
    """quantize(x·s)/s forward; the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx, x, fmt, rounding, overflow, scale, seed, pow2):  # noqa: ANN001, ANN205 - autograd signature
        return quantize_scaled(x, fmt, scale, rounding, overflow, seed=seed, scale_pow2=pow2)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        return grad, None, None, None, None, None, None


def _seed_for(spec: QuantSpec, x: torch.Tensor) -> torch.Tensor | None:
    return draw_seed(x.device) if spec.rounding == "stochastic" else None


def fake_quant(x: torch.Tensor, spec: QuantSpec, scale: torch.Tensor | None = None) -> torch.Tensor:
    """x on the grid {v / s} of ``spec`` (straight-through gradient); s from ``spec.scaling`` unless given."""
    pow2 = False  # a scale given by the caller may be anything
    if scale is None:
        scale, pow2 = compute_scale(x, spec.format, spec.scaling), spec.scaling.powers_of_two
    return _FakeQuant.apply(x, spec.format, spec.rounding, spec.overflow, scale, _seed_for(spec, x), pow2)


class _Straight(torch.autograd.Function):
    """Forward returns the already quantized ``y``; the gradient flows to x unchanged (straight through)."""

    @staticmethod
    def forward(ctx, x, y):  # noqa: ANN001, ANN205
        return y

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        return grad, None


def _traced_quantize(x: torch.Tensor, spec: QuantSpec, scaler: Scaler, seed: torch.Tensor | None,
                     with_stats: bool) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, ...]]:
    """(quantize(x·s)/s, stats or None, the scaler's new state), traced inline into the caller's graph (inside
    torch.compile; eager dispatch goes through ``_quantize_into``); nothing is written."""
    sc = spec.scaling
    p = kernel_params(spec.format, spec.rounding, spec.overflow, x.device)
    consts = scale_consts(spec.format, sc.margin, x.device)
    # the uncached function (pure): dynamo warns about tracing through an lru_cache wrapper
    variant = kernel_variant.__wrapped__(spec.format, spec.rounding, spec.overflow)
    return quant_call_body(x.detach(), p, consts, seed, scaler.state(), type(scaler).scale_fn, sc.pow2,
                           sc.reduce, sc.block, variant, with_stats)


class _Plan(NamedTuple):
    """What one quantizer's eager-dispatched call needs, resolved once per (spec, scaler kind, device, stats)."""

    key: tuple
    call: fused
    params: torch.Tensor
    consts: torch.Tensor


def _plan(owner: nn.Module, device: torch.device) -> _Plan:
    """The owner's cached call for this device (rebuilt when its spec, scaler or stats flag changes)."""
    spec, scaler = owner.spec, owner.scaler
    key = (spec, type(scaler), device, owner.track_stats)
    plan = owner.__dict__.get("_plan")
    if plan is not None and plan.key[0] is spec and plan.key[1:] == key[1:]:
        return plan
    sc = spec.scaling
    variant = kernel_variant(spec.format, spec.rounding, spec.overflow)
    call = quant_call(type(scaler).scale_fn, sc.pow2, sc.reduce, sc.block, variant, owner.track_stats)
    plan = _Plan(key, call, kernel_params(spec.format, spec.rounding, spec.overflow, device),
                 scale_consts(spec.format, sc.margin, device))
    owner.__dict__["_plan"] = plan  # a plain attribute (not state): never saved, rebuilt on demand
    return plan


class _Direct:
    """One quantizer's road for one input signature once ``fused`` has compiled that signature: x (and the seed)
    go straight into the compiled graph and its outputs straight into the buffers, with everything else (kernel
    parameters, constants, which buffer each output goes to) resolved when it was built. Same graph as the general
    road, so the same bits; it saves per-call Python, paid 35 times per train step of the nano model: a whole
    input-quantizer call on 2048x128 (2048x512) took 153 -> 117 µs (317 -> 285 µs) here, interleaved medians."""

    __slots__ = ("spec", "scaler", "state", "stats", "run", "head", "dst")

    def __init__(self, owner: nn.Module, plan: _Plan, static: object, state: tuple[torch.Tensor, ...],
                 update: bool) -> None:
        self.spec, self.scaler, self.state = owner.spec, owner.scaler, state
        self.stats = owner.stats if owner.track_stats else None
        self.run = static.compiled  # tensors in (x, params, consts, [seed], *state), tensors out (y, [stats], *new)
        self.head = (plan.params, plan.consts)
        self.dst = ([self.stats] if self.stats is not None else []) + (list(state) if update else [])

    def fits(self, owner: nn.Module, state: tuple[torch.Tensor, ...]) -> bool:
        """Whether the owner still has the spec and the very buffers this road writes (not replaced since)."""
        return (self.spec is owner.spec and self.scaler is owner.scaler and len(state) == len(self.state)
                and all(map(operator.is_, state, self.state))
                and (self.stats is None or self.stats is owner.stats))

    def __call__(self, x: torch.Tensor, seed: torch.Tensor | None) -> torch.Tensor:
        outs = self.run(x, *self.head, *self.state) if seed is None else self.run(x, *self.head, seed, *self.state)
        if self.dst:
            torch._foreach_copy_(self.dst, list(outs[1:1 + len(self.dst)]))
        return outs[0]


def _quantize_into(owner: nn.Module, x: torch.Tensor, seed: torch.Tensor | None, update: bool) -> torch.Tensor:
    """quantize(x·s)/s through the owner's fused call, then its new scaler state (when ``update``) and statistics
    (when tracked) copied into the owner's buffers in one foreach copy; eager dispatch only (not when traced).
    Once the call's signature has its static compile, later calls of that input signature take a ``_Direct`` road.

    (Writing the buffers inside the compiled graph instead was measured 1.5x slower on a 2048x512 input: the
    in-place update of the scale it also reads split the fused loops.)"""
    state = owner.scaler.state()
    key = (x.shape, x.stride(), x.dtype, x.device, update, owner.track_stats)
    roads = owner.__dict__.get("_direct")
    direct = roads.get(key) if roads is not None else None
    if direct is not None and direct.fits(owner, state) and compile_enabled():
        return direct(x, seed)  # (the compiled graph records no autograd history: x need not be detached)
    x = x.detach()
    plan = _plan(owner, x.device)
    with torch.no_grad():
        y, stats, new = plan.call(x, plan.params, plan.consts, seed, *state)
        dst, src = (list(state), list(new)) if update else ([], [])
        if stats is not None:
            dst.append(owner.stats)
            src.append(stats)
        if dst:
            torch._foreach_copy_(dst, src)
    static = plan.call.static_for(x, plan.params, plan.consts, seed, *state)
    if static is not None:  # this signature is compiled now: later calls take the direct road
        owner.__dict__.setdefault("_direct", {})[key] = _Direct(owner, plan, static, state, update)
    return y


class _StraightMany(torch.autograd.Function):
    """``_Straight`` for n pairs at once: (x1..xn, y1..yn) -> (y1..yn), each gradient passed to its x."""

    @staticmethod
    def forward(ctx, *xs_and_ys):  # noqa: ANN002, ANN205
        n = len(xs_and_ys) // 2
        ctx.n = n
        return xs_and_ys[n:]

    @staticmethod
    def backward(ctx, *grads):  # noqa: ANN002, ANN205
        return (*grads, *([None] * ctx.n))


def quantize_many(pairs: list[tuple[TensorQuantizer, torch.Tensor]]) -> list[torch.Tensor]:
    """``q(x)`` for every (TensorQuantizer, x) pair, with one fused dispatch per configuration instead of one per
    tensor (same values, scaler states and statistics as separate calls; stochastic seeds are drawn in pair order).
    Eager dispatch only: inside a traced region call the quantizers themselves."""
    out: list[torch.Tensor | None] = [None] * len(pairs)
    groups: dict[tuple, list[int]] = {}
    for i, (q, x) in enumerate(pairs):
        if not q.enabled:
            out[i] = x
            continue
        groups.setdefault((q.spec, type(q.scaler), x.device, q.track_stats, q.training), []).append(i)
    for (spec, scaler_type, device, with_stats, training), idx in groups.items():
        if len(idx) == 1:
            q, x = pairs[idx[0]]
            out[idx[0]] = q(x)
            continue
        sc = spec.scaling
        call = quant_call_many(scaler_type.scale_fn, sc.pow2, sc.reduce, sc.block,
                               kernel_variant(spec.format, spec.rounding, spec.overflow), with_stats, len(idx))
        flat: list[torch.Tensor | None] = []
        dst: list[torch.Tensor] = []
        keep: list[bool] = []  # which of the call's written tensors go to a buffer (eval: the stats only)
        for i in idx:
            q, x = pairs[i]
            state = q.scaler.state()
            flat += [x.detach(), _seed_for(spec, x), *state]
            dst += [*state] if training else []
            dst += [q.stats] if with_stats else []
            keep += [training] * len(state) + [True] * with_stats
        with torch.no_grad():
            # Always the training graph (new states computed, then dropped in eval): the values do not depend on
            # it, and validation and sampling then reuse its compile instead of tracing the unrolled graph again.
            ys, written = call(kernel_params(spec.format, spec.rounding, spec.overflow, device),
                               scale_consts(spec.format, sc.margin, device), True, *flat)
            if dst:
                torch._foreach_copy_(dst, [w for w, k in zip(written, keep) if k])
        for i, y in zip(idx, _StraightMany.apply(*(pairs[i][1] for i in idx), *ys)):
            out[i] = y
    return out


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
        if owner is None:
            scale = compute_scale(grad, spec.format, spec.scaling)
            gq = quantize_scaled(grad, spec.format, scale, spec.rounding, spec.overflow, seed=seed,
                                 scale_pow2=spec.scaling.powers_of_two)
            return gq, None, None, None
        if not torch.compiler.is_compiling():
            return _quantize_into(owner, grad, seed, update=True), None, None, None
        gq, stats, new = _traced_quantize(grad, spec, owner.scaler, seed, owner.track_stats)
        owner.scaler.load_state_(new)
        if stats is not None:
            owner.stats.copy_(stats)
        return gq, None, None, None


def _default_grad_spec() -> QuantSpec:
    return QuantSpec(get_format("e5m2"))


def quant_grad(x: torch.Tensor, spec: QuantSpec | None = None) -> torch.Tensor:
    """Identity forward; the backward quantizes the incoming gradient with ``spec`` (default: e5m2, tensor scale)."""
    spec = spec or _default_grad_spec()
    return _QuantGrad.apply(x, spec, _seed_for(spec, x), None)


class StatsRecord:
    """When the quantizers of one model last recorded statistics; shared by all of them, written by the switch.

    ``step``: ``trainer.global_step`` at the start of the last training batch whose forward and backward ran with
    ``track_stats`` on (None: none yet). Within that batch's hooks the stats are current; after it they are stale.
    ``on``: the ``track_stats`` the switch last gave every quantizer (None: not set yet), readable without a loop.
    """

    __slots__ = ("on", "step")

    def __init__(self) -> None:
        self.step: int | None = None
        self.on: bool | None = None


def set_track_stats(quantizers: Iterable[nn.Module], on: bool, record: StatsRecord | None = None) -> None:
    """``track_stats = on`` for every quantizer (and ``stats_record = record`` when one is given)."""
    for q in quantizers:
        q.track_stats = on
        if record is not None:
            q.stats_record = record


def kept_scale(q: nn.Module) -> torch.Tensor | None:
    """The scale q's last call used, where it is known without statistics: the scaler's ``scale`` buffer for one-scale
    kinds (tensor, delayed: the scaler stores the scale it returns; a TensorQuantizer only in training mode), 1 for
    kind none; None for channel and block scaling (many scales; ``stats`` holds their mean when recorded)."""
    kind = q.spec.scaling.kind
    if kind == "none":
        return torch.ones((), dtype=torch.float32, device=q.stats.device)
    if kind in ("tensor", "delayed"):
        return q.scaler.scale
    return None


class _StatsMarker:
    """``stats_record`` / ``stats_step`` of both quantizer classes."""

    stats_record: StatsRecord | None = None

    @property
    def stats_step(self) -> int | None:
        """Global step of the training batch whose passes last wrote ``stats`` (see StatsRecord); None when no switch
        manages ``track_stats`` (then every call with ``track_stats`` on writes them)."""
        record = self.stats_record
        return None if record is None else record.step


class TensorQuantizer(_StatsMarker, nn.Module):
    """STE fake quantization of one tensor role with the spec's scaling; scaler state and ``stats`` in buffers.

    ``enabled = False`` makes it the identity (for shadow passes). Scaler state is updated only in training mode.
    ``track_stats = False`` skips the statistics (``stats`` then keeps its last values; see ``stats_step``).
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
        if not torch.compiler.is_compiling():
            return _Straight.apply(x, _quantize_into(self, x, _seed_for(spec, x), update=self.training))
        y, stats, new = _traced_quantize(x, spec, self.scaler, _seed_for(spec, x), self.track_stats)
        if self.training:
            self.scaler.load_state_(new)
        if stats is not None:
            with torch.no_grad():
                self.stats.copy_(stats)
        return _Straight.apply(x, y)

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
        w.copy_(quantize_scaled(w, spec.format, scale, rounding, spec.overflow, seed=seed,
                                scale_pow2=spec.scaling.powers_of_two))
        return w

    def stat_dict(self) -> dict[str, torch.Tensor]:
        """STAT_NAMES → 0-dim tensors (still on device; reading them as floats is the caller's sync)."""
        return dict(zip(STAT_NAMES, self.stats.unbind(0)))

    def extra_repr(self) -> str:
        s = self.spec
        return f"role={self.role}, format={s.format}, rounding={s.rounding}, scaling={s.scaling.kind}"


class GradQuantizer(_StatsMarker, nn.Module):
    """Identity forward; quantizes grad_output in the backward pass with ``spec``, recording ``stats`` there (when
    ``track_stats`` is on at the backward)."""

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
        return _QuantGrad.apply(x, self.spec, _seed_for(self.spec, x), self)

    def stat_dict(self) -> dict[str, torch.Tensor]:
        """STAT_NAMES → 0-dim tensors of the last backward pass."""
        return dict(zip(STAT_NAMES, self.stats.unbind(0)))

    def extra_repr(self) -> str:
        s = self.spec
        return f"format={s.format}, rounding={s.rounding}, scaling={s.scaling.kind}"

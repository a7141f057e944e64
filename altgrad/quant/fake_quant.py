"""Straight-through fake quantization for training: values on the format's grid forward, gradients untouched.

``fake_quant``: forward x·s → quantize → /s, backward identity (the straight-through estimator).
``quant_grad``: forward identity, backward quantizes the incoming gradient (what a low-precision backward GEMM
would consume). TensorQuantizer and GradQuantizer are the nn.Module forms that keep scaler state and per-call
statistics in buffers; ``Quantizer.road`` says how their eager calls are computed (``choose_road``: the run's
``quant.kernel``, resolved once per quantizer and shown in the layer table).

Statistics are extra work on every element, so they are computed only while ``track_stats`` is on (the default).
When it is off, ``stats`` keeps the values of the last call that recorded them; a switch that turns ``track_stats``
on and off per training step (FakeQuantCallback, ``quant.stats=demand``) gives every quantizer a
shared StatsRecord, and ``stats_step`` then says which step those values are from.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch
from torch import nn

from altgrad.quant import native
from altgrad.quant.changes import Watched
from altgrad.quant.compiled import check_kernel
from altgrad.quant.format import get_format
from altgrad.quant.quantizer_call import quant_call, quant_call_body
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
    torch.compile; eager dispatch goes through ``Quantizer.quantize_now``); nothing is written."""
    sc = spec.scaling
    p = kernel_params(spec.format, spec.rounding, spec.overflow, x.device)
    consts = scale_consts(spec.format, sc.margin, x.device)
    # the uncached function (pure): dynamo warns about tracing through an lru_cache wrapper
    variant = kernel_variant.__wrapped__(spec.format, spec.rounding, spec.overflow)
    return quant_call_body(x.detach(), p, consts, seed, scaler.state(), type(scaler).scale_fn, sc.pow2,
                           sc.reduce, sc.block, variant, with_stats)


NATIVE_KINDS = ("none", "tensor", "delayed")  # scale kinds the native kernel computes itself


def choose_road(spec: QuantSpec, kernel: str | None = None, device: torch.device | str | None = None) -> str:
    """The road (``native``, ``compiled`` or ``eager``) a quantizer with ``spec`` takes for ``kernel``
    (compiled.KERNELS; None: ``auto``) on ``device`` (None: the CPU).

    ``auto``: ``native`` where the C++ kernel serves the scale kind on the CPU and is available, else ``compiled``
    (a native quantizer still sends a tensor the kernel cannot take, bf16 say, down the compiled road). ``native``
    raises (one line) where the kernel cannot serve. ``compiled`` / ``eager``: the torch quant_call, compiled or not.
    """
    kernel = check_kernel("auto" if kernel is None else kernel)
    on_cpu = device is None or torch.device(device).type == "cpu"
    served = spec.scaling.kind in NATIVE_KINDS
    if kernel == "auto":
        return "native" if on_cpu and served and native.kernel() is not None else "compiled"
    if kernel == "native":
        if not served:
            raise ValueError(f"quant.kernel=native does not serve scaling.kind={spec.scaling.kind!r} (it serves "
                             f"{', '.join(NATIVE_KINDS)}); valid for it: auto, compiled, eager")
        if not on_cpu:
            raise ValueError(f"quant.kernel=native runs on the CPU only, not on {device}; valid there: auto, "
                             "compiled, eager")
        native.require()
    return kernel


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
            return owner.quantize_now(grad, seed, update=True), None, None, None
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


# Quantizer → (spec, kernel choice, scaler, stats, *scaler state, track_stats its plan writes for, the plan or None):
# see Quantizer.native_plan
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# TensorQuantizer → (spec, kernel choice, scaler, scaler state, {rounding: plan or None}): see storage_plan
_STORAGE_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Quantizer(_StatsMarker, Watched):
    """What TensorQuantizer and GradQuantizer share: the spec, its scaler (state in buffers), the ``stats`` buffer,
    the ``enabled`` and ``track_stats`` switches and the road an eager call takes (``road``: ``kernel`` resolved by
    ``choose_road`` once per spec and device; ``use_kernel`` changes it)."""

    def __init__(self, spec: QuantSpec, role: str, track_stats: bool, kernel: str | None = None) -> None:
        super().__init__()
        if not isinstance(spec, QuantSpec):
            raise ValueError(f"{type(self).__name__} needs a QuantSpec, got {type(spec).__name__}")
        self.spec = spec
        self.role = role
        self.enabled = True
        self.track_stats = track_stats
        self.scaler = make_scaler(spec.scaling, spec.format)
        self.register_buffer("stats", torch.zeros(len(STAT_NAMES), dtype=torch.float32))
        self.use_kernel("auto" if kernel is None else kernel)

    @property
    def track_stats(self) -> bool:
        """Whether calls record the statistics into ``stats`` (see the module doc)."""
        return self._track_stats

    @track_stats.setter
    def track_stats(self, on: bool) -> None:
        # written into the resolved native plan at once: a C++ Linear node whose backward is still pending holds that
        # plan, and (as on the module road) the gradient's call records per the switch as it is when it runs
        self.__dict__["_track_stats"] = on
        cached = _PLANS.get(self)
        if cached is not None and cached[-1] is not None and cached[-2] != on:
            cached[-1].set_stats(cached[3] if on else None)
            _PLANS[self] = (*cached[:-2], on, cached[-1])

    def __setstate__(self, state: dict) -> None:
        if "track_stats" in state:  # pickled before track_stats became a property
            state["_track_stats"] = state.pop("track_stats")
        super().__setstate__(state)

    def use_kernel(self, kernel: str, device: torch.device | str | None = None) -> str:
        """Resolve ``kernel`` (compiled.KERNELS) for this quantizer's spec on ``device`` (None: the CPU) into ``road``;
        returns it. Raises ValueError (one line) where ``native`` cannot serve."""
        self.kernel = kernel
        self.device_type = "cpu" if device is None else torch.device(device).type
        self.road_for: tuple[QuantSpec, str] = (self.spec, choose_road(self.spec, kernel, self.device_type))
        return self.road_for[1]

    @property
    def road(self) -> str:
        """``native``, ``compiled`` or ``eager`` (see ``choose_road``); resolved again only when ``spec`` is
        replaced (a format fallback)."""
        spec, road = self.road_for
        if spec is not self.spec:
            self.road_for = (self.spec, road := choose_road(self.spec, self.kernel, self.device_type))
        return road

    def quantize_now(self, x: torch.Tensor, seed: torch.Tensor | None, update: bool) -> torch.Tensor:
        """quantize(x·s)/s with the scaler's state, writing the new state (when ``update``) and the statistics (when
        tracked) into the buffers; eager dispatch only (traced calls go through ``_traced_quantize``)."""
        road = self.road
        if road == "native":
            plan = self.native_plan() if native.takes(x) else None
            if plan is not None:
                y = plan(x, None if seed is None else int(seed), update)
                if y is not None:
                    return y
            elif self.kernel == "native":
                raise ValueError(f"quant.kernel=native takes float32 CPU tensors only, not a {x.dtype} tensor on "
                                 f"{x.device}; valid: auto, compiled, eager")
        # auto's compiled road leaves compiling to compiled.compiling (on outside tests); an explicit choice is kept
        return self._compiled(x, seed, update, None if self.kernel == "auto" else road == "compiled")

    def _buffers_native(self) -> bool:
        """Whether the kernel may write the buffers in place: float32 on the CPU (not after ``.double()``)."""
        return all(b.dtype == torch.float32 and b.device.type == "cpu" and b.is_contiguous()
                   for b in (self.stats, *self.scaler.state()))

    def native_plan(self) -> object | None:
        """This quantizer's native call (native.plan: the extension's ``Plan`` or a ctypes ``CallPlan``), resolved
        once and again only when its spec, kernel choice, scaler or buffers change (identity: ``.double()`` or
        ``.to()`` replaces buffers); None where the kernel may not write the buffers in place. A change of
        ``track_stats`` is written into the same plan (``set_stats``), so a backward pass still pending reads the
        switch as it is when it runs, as the module road does. Plans hold raw pointers, so they live beside the module
        (``_PLANS``), never in it: a deep copy or a pickle of the quantizer resolves its own."""
        d = self.__dict__
        scaler, stats = d["_modules"]["scaler"], d["_buffers"]["stats"]
        state = scaler.state()
        cached = _PLANS.get(self)
        if (cached is not None and cached[0] is d["spec"] and cached[1] == d["kernel"] and cached[2] is scaler
                and cached[3] is stats and len(cached) == len(state) + 6
                and all(a is b for a, b in zip(cached[4:-2], state))):
            plan = cached[-1]
            on = d["_track_stats"]
            if plan is not None and cached[-2] != on:
                plan.set_stats(stats if on else None)
                _PLANS[self] = (*cached[:-2], on, plan)
            return plan
        plan = self._resolve_plan(self.spec.rounding, stats if self.track_stats else None, (stats, *state))
        _PLANS[self] = (self.spec, self.kernel, scaler, stats, *state, self.track_stats, plan)
        return plan

    def _resolve_plan(self, rounding: str, stats: torch.Tensor | None, holds: tuple) -> object | None:
        """native.plan for this quantizer's spec, scaler state and ``rounding``, writing ``stats`` (None: none); None
        where the kernel may not write the buffers in place."""
        if not self._buffers_native():
            return None
        spec, state = self.spec, self.scaler.state()
        sc, cpu = spec.scaling, torch.device("cpu")
        return native.plan(
            native.require() if self.kernel == "native" else native.kernel(),
            kernel_params(spec.format, rounding, spec.overflow, cpu), rounding,
            native.variant_flags(kernel_variant(spec.format, rounding, spec.overflow)), sc.kind, sc.pow2,
            scale_consts(spec.format, sc.margin, cpu), scale=state[-1] if state else None,
            history=state[0] if sc.kind == "delayed" else None, reduce_max=sc.reduce == "max", stats=stats,
            holds=holds)

    def node_plan(self) -> object | None:
        """The extension's ``Plan`` QuantLinear's C++ node calls for this quantizer, or None where its calls take
        another road (not native, buffers the kernel may not write, no extension built)."""
        if self.road != "native":
            return None
        plan = self.native_plan()
        ext = native.linear_ext()
        return plan if ext is not None and type(plan) is ext.Plan else None

    def _compiled(self, x: torch.Tensor, seed: torch.Tensor | None, update: bool,
                  compiled: bool | None) -> torch.Tensor:
        spec, state = self.spec, self.scaler.state()
        sc = spec.scaling
        call = quant_call(type(self.scaler).scale_fn, sc.pow2, sc.reduce, sc.block,
                          kernel_variant(spec.format, spec.rounding, spec.overflow), self.track_stats)
        with torch.no_grad():
            y, stats, new = call(x.detach(), kernel_params(spec.format, spec.rounding, spec.overflow, x.device),
                                 scale_consts(spec.format, sc.margin, x.device), seed, *state, compiled=compiled)
            if update:
                for buf, value in zip(state, new):
                    buf.copy_(value)
            if stats is not None:
                self.stats.copy_(stats)
        return y

    @property
    def call_kernel(self) -> str:
        """The kernel a bare quantize of this quantizer's grid takes (storage rounding, the flips diagnostic): its
        road, or ``auto`` on the native road (a tensor the C++ kernel cannot take goes the compiled road)."""
        road = self.road
        return "auto" if road == "native" and self.kernel != "native" else road

    def stat_dict(self) -> dict[str, torch.Tensor]:
        """STAT_NAMES → 0-dim tensors of the last recorded call (still on device; reading them is the caller's sync)."""
        return dict(zip(STAT_NAMES, self.stats.unbind(0)))

    def extra_repr(self) -> str:
        s = self.spec
        return (f"role={self.role}, format={s.format}, rounding={s.rounding}, scaling={s.scaling.kind}, "
                f"road={self.road}")


class TensorQuantizer(Quantizer):
    """STE fake quantization of one tensor role with the spec's scaling; scaler state and ``stats`` in buffers.

    ``enabled = False`` makes it the identity (for shadow passes). Scaler state is updated only in training mode.
    ``track_stats = False`` skips the statistics (``stats`` then keeps its last values; see ``stats_step``).
    """

    def __init__(self, spec: QuantSpec, role: str = "weight", track_stats: bool = True,
                 kernel: str | None = None) -> None:
        super().__init__(spec, role, track_stats, kernel)

    def _scale(self, x: torch.Tensor, update: bool) -> torch.Tensor | None:
        return None if self.spec.scaling.kind == "none" else self.scaler(x, update=update)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x
        spec = self.spec
        if not torch.compiler.is_compiling():
            y = self.quantize_now(x, _seed_for(spec, x), update=self.training)
            # the straight-through node only where autograd records one (a weight or activation in training)
            return _Straight.apply(x, y) if x.requires_grad and torch.is_grad_enabled() else y
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

    def storage_plan(self, rounding: str) -> object | None:
        """The native call ``project_`` makes for ``rounding`` (no statistics, scaler state read only), resolved once
        per rounding and again only when the spec, kernel choice, scaler or its buffers change (as ``native_plan``);
        None where the kernel may not write the buffers in place."""
        d = self.__dict__
        scaler = d["_modules"]["scaler"]
        state = scaler.state()
        cached = _STORAGE_PLANS.get(self)
        if (cached is None or cached[0] is not d["spec"] or cached[1] != d["kernel"] or cached[2] is not scaler
                or len(cached[3]) != len(state) or any(a is not b for a, b in zip(cached[3], state))):
            cached = (d["spec"], d["kernel"], scaler, state, {})
            _STORAGE_PLANS[self] = cached
        plans = cached[4]
        if rounding not in plans:
            plans[rounding] = self._resolve_plan(rounding, None, state)
        return plans[rounding]

    @torch.no_grad()
    def project_(self, w: torch.Tensor, rounding: str | None = None, seed: int | None = None) -> torch.Tensor:
        """Put w itself on the grid {v / s} in place (weights stored without an fp32 master); returns w.

        Stochastic rounding draws from ``seed`` when given (reproducible storage), else from torch's default RNG.
        """
        spec = self.spec
        rounding = rounding or spec.rounding
        drawn = draw_seed(w.device) if rounding == "stochastic" and seed is None else None  # one draw, either road
        if self.road == "native" and native.native_contiguous(w):
            # one kernel call writing w in place: the scale the next forward uses (scaler state read, not updated)
            # and the rounding; a given seed is draw_seed's value without the tensor
            plan = self.storage_plan(rounding)
            if plan is not None:
                s = None if rounding != "stochastic" else int(drawn) if drawn is not None else int(seed) & 0x7FFFFFFF
                if plan(w, s, False, out=w) is not None:
                    return w
        seed = None if rounding != "stochastic" else drawn if drawn is not None else draw_seed(w.device, seed=seed)
        scale = self._scale(w, update=False)
        w.copy_(quantize_scaled(w, spec.format, scale, rounding, spec.overflow, seed=seed,
                                scale_pow2=spec.scaling.powers_of_two, kernel=self.call_kernel))
        return w


class GradQuantizer(Quantizer):
    """Identity forward; quantizes grad_output in the backward pass with ``spec``, recording ``stats`` there (when
    ``track_stats`` is on at the backward)."""

    def __init__(self, spec: QuantSpec | None = None, track_stats: bool = True, kernel: str | None = None) -> None:
        super().__init__(spec or _default_grad_spec(), "grad", track_stats, kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled or not torch.is_grad_enabled() or not x.requires_grad:
            return x
        return _QuantGrad.apply(x, self.spec, _seed_for(self.spec, x), self)

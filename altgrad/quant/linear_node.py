"""A quantized Linear's eager CPU training call as one autograd node (QuantLinear's ``forward`` takes it where it can).

The module road records five to seven nodes per layer (the straight-through nodes of the input and weight quantizers,
the gradient quantizer's node, F.linear's own view, mm and transpose nodes) and makes three nn.Module calls; on a small
step that Python costs more than the quantizer arithmetic. One node makes the same quantizer calls in the same order
(stochastic seeds drawn for the input, the weight, then the gradient; the gradient quantized in the backward), runs
F.linear itself in the forward, and computes the gradients with the very calls F.linear's autograd formulas make
(torch's ``mm_mat1_backward`` / ``mm_mat2_backward`` for the matmul, the engine's ``sum_to`` for a bias), so every
bit is the module road's (tests/layers/test_linear_node.py compares them).

``forward`` takes the C++ node (native_linear.cpp: no Python in the backward at all) where every active quantizer
calls the native kernel through the extension, else ``QuantLinearFunction``, its Python twin (any road: compiled,
eager, a quantizer the kernel cannot serve). What it resolves from the quantizers is kept on the layer until one of
them changes (changes.COUNT), so a call costs a few attribute reads before the node.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.nn.modules import module as _module

from altgrad.quant import changes, native
from altgrad.quant.fake_quant import _seed_for


ROADS = ("auto", "python", "modules")
"""How QuantLinear's eager CPU training calls run (``road``): ``auto`` (the C++ node where it serves, else the Python
node), ``python`` (the Python node), ``modules`` (the quantizer modules around F.linear); the same bits on each."""

_ROAD = ["auto"]


@contextlib.contextmanager
def road(name: str) -> Iterator[None]:
    """Inside the block, QuantLinear's training calls take the road ``name`` (ROADS): benchmarks and tests compare
    them; nothing else needs to (the bits are the same)."""
    if name not in ROADS:
        raise ValueError(f"road {name!r} is not valid; valid: {', '.join(ROADS)}")
    before = _ROAD[0]
    _ROAD[0] = name
    try:
        yield
    finally:
        _ROAD[0] = before


def takes(layer: torch.nn.Module, x: torch.Tensor) -> bool:
    """Whether ``layer(x)`` may run as the Python node: a training call (grad enabled) outside autocast, on float32
    CPU tensors of two or more dimensions, a contiguous input and weight (what native_linear.cpp's ``linear``
    checks for the C++ node)."""
    w, b = layer.weight, layer.bias
    return (torch.is_grad_enabled() and x.dim() >= 2 and x.dtype is torch.float32 and x.device.type == "cpu"
            and x.is_contiguous() and w.dtype is torch.float32 and w.device.type == "cpu" and w.is_contiguous()
            and w.dim() == 2 and (b is None or (b.dtype is torch.float32 and b.dim() == 1))
            and not torch.is_autocast_enabled("cpu")
            and max(x.numel(), x.numel() // max(x.shape[-1], 1) * w.shape[0]) < native.MAX_NUMEL)


class _Resolved:
    """What a QuantLinear's one-node call needs, resolved while ``changes.COUNT`` stays where it was: the extension
    (None: the Python node) and the plans of the active quantizers (input, weight, gradient; None where a role is
    unquantized or switched off), the scaler-update switches of the input and weight calls, every quantizer (for the
    hook check)."""

    __slots__ = ("count", "ext", "plans", "updates", "quantizers")

    def __init__(self, layer: torch.nn.Module) -> None:
        self.count = changes.COUNT[0]
        iq, wq, gq = layer.input_q, layer.weight_q, layer.grad_q
        self.quantizers = tuple(q for q in (iq, wq, gq) if q is not None)
        self.updates = (iq is not None and iq.training, wq is not None and wq.training)
        active = [q if q is not None and q.enabled else None for q in (iq, wq, gq)]
        self.ext = native.linear_ext()
        self.plans = [None if q is None else q.node_plan() for q in active]
        if self.ext is None or any(q is not None and p is None for q, p in zip(active, self.plans)):
            self.ext = None  # a quantizer the C++ node cannot call: the Python node


def forward(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """``layer(x)`` as one node, or None where it cannot serve (no grad, autocast, an operand the node does not take,
    a hook on a quantizer; the caller then takes the module road): the C++ node where the extension is built and
    every active quantizer has its ``node_plan``, else the Python node."""
    chosen = _ROAD[0]
    if chosen == "modules" or not torch.is_grad_enabled() or type(x) not in (torch.Tensor, torch.nn.Parameter):
        return None
    got = layer.__dict__.get("_one_node")
    built = native._LINEAR
    if got is None or got.count != changes.COUNT[0] or got.ext is not (built[0] if built else None):
        got = _Resolved(layer)
        layer.__dict__["_one_node"] = got  # beside nn.Module's registries: not state, not copied by state_dict
    for q in got.quantizers:  # a hook on a quantizer module fires only on the module road
        if q._forward_hooks or q._forward_pre_hooks or q._backward_hooks or q._backward_pre_hooks:
            return None
    if _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return None
    if got.ext is not None and chosen == "auto":
        params = layer._parameters
        if layer.weight_cache is not None:
            layer.weight_cache = None  # a training call: nothing is reused (QuantLinear.quantized_weight)
        plans, updates = got.plans, got.updates
        return got.ext.linear(x, params["weight"], params.get("bias"), plans[0], updates[0], plans[1], updates[1],
                              plans[2])
    if not takes(layer, x):
        return None
    return QuantLinearFunction.apply(x, layer.weight, layer.bias, layer)


class QuantLinearFunction(torch.autograd.Function):
    """y = linear(q_in(x), q_w(W), b); backward: g' = q_grad(g), dx = g'·q_w(W), dW = g'ᵀ·q_in(x), db = Σ g'."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer):  # noqa: ANN001, ANN205 - autograd signature
        iq, wq, gq = layer.input_q, layer.weight_q, layer.grad_q
        xq = x if iq is None or not iq.enabled else iq.quantize_now(x, _seed_for(iq.spec, x), iq.training)
        if wq is None:
            w = weight
        else:
            layer.weight_cache = None  # a training call: nothing is reused (QuantLinear.quantized_weight)
            w = weight if not wq.enabled else wq.quantize_now(weight, _seed_for(wq.spec, weight), wq.training)
        y = F.linear(xq, w, bias)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_q = gq if gq is not None and gq.enabled and (need_x or need_w or need_b) else None
        seed = None if grad_q is None else _seed_for(grad_q.spec, y)
        ctx.grad_q = grad_q
        ctx.x_shape = x.shape
        # the formulas below assume the strides F.linear saw: contiguous operands (every road's quantized output of
        # a contiguous tensor); anything else replays F.linear's own autograd on the saved operands
        ctx.replay = not (xq.is_contiguous() and w.is_contiguous())
        if ctx.replay:
            ctx.save_for_backward(xq, w, bias, seed)
        else:
            ctx.save_for_backward(xq if need_w else None, w if need_x else None, None, seed)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        xq, w, bias, seed = ctx.saved_tensors
        if ctx.grad_q is not None:
            grad = ctx.grad_q.quantize_now(grad, seed, update=True)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        if ctx.replay:
            return (*_replay(xq, w, bias, grad, (need_x, need_w, need_b)), None)
        g2 = grad.reshape(-1, grad.shape[-1]) if grad.dim() != 2 else grad  # F.linear folds to 2-D (a view here)
        dx = dw = db = None
        if need_x:
            # mm_mat1_backward(g, mat2 = Wᵀ, mat1 = the folded input): a column-major input gets (W·gᵀ)ᵀ
            # (only a 1 × 1 one is, among contiguous inputs)
            shape = ctx.x_shape
            dx = (w.t().mm(g2.t()).t() if shape.numel() == 1 else g2.mm(w)).reshape(shape)
        if need_w:
            # mm_mat2_backward(g, mat1, mat2 = Wᵀ): Wᵀ of a contiguous W is column-major, so (gᵀ·x)ᵀ, then Wᵀ's
            # transpose node turns it back: gᵀ·x
            dw = g2.t().mm(xq.reshape(-1, xq.shape[-1]))
        if need_b:
            db = g2.sum([0], keepdim=True).view(-1)  # the engine's sum_to(addmm's self gradient, bias shape)
        return dx, dw, db, None


def _replay(xq: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, grad: torch.Tensor,
            needs: tuple[bool, bool, bool]) -> tuple[torch.Tensor | None, ...]:
    """(dx, dW, db) from F.linear's own autograd on the saved operands (their strides as the forward saw them)."""
    leaves = [t.detach().requires_grad_(need) if t is not None else None for t, need in zip((xq, w, bias), needs)]
    with torch.enable_grad():
        y = F.linear(*leaves)
    wanted = [t for t, need in zip(leaves, needs) if t is not None and need]
    found = iter(torch.autograd.grad(y, wanted, grad))
    return tuple(next(found) if t is not None and need else None for t, need in zip(leaves, needs))

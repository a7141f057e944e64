"""QuantLinear: an nn.Linear computed with fake-quantized weight and input and a quantized grad_output.

The wrapper takes over the original Linear's Parameters (the same objects), so optimizers, tied weights
(nanoGPT's ``lm_head`` ↔ ``wte``) and state-dict keys (``lm_head.weight``) are unchanged by the surgery.
Outside training, a layer reuses its quantized weight while nothing it depends on has changed (``weight_cache``):
the tokens of a sample and the batches of a validation pass see the same weights. An eager CPU training call runs as
one autograd node (linear_node.py: the same quantizer calls and matmuls, the same bits, a fraction of the Python);
everything else (no grad, autocast, torch.compile tracing, another device, a hooked quantizer) calls the quantizer
modules around F.linear (``forward_modules``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from altgrad.quant import changes, linear_node
from altgrad.quant.fake_quant import GradQuantizer, TensorQuantizer
from altgrad.quant.spec import QuantSpec


class QuantLinear(nn.Module):
    """y = linear(q_in(x), q_w(W), b), with q_grad applied to grad_output in the backward pass."""

    def __init__(
        self,
        linear: nn.Linear,
        name: str,
        weight: QuantSpec | None = None,
        input: QuantSpec | None = None,  # noqa: A002 - the role's name
        grad: QuantSpec | None = None,
        tied: bool = False,
        kernel: str | None = None,
    ) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight  # the same Parameter object: ties and optimizer references survive
        self.bias = linear.bias
        self.name = name
        self.tied = tied  # weight shared with another module: quantize in the forward pass only, never in place
        # kernel: how the quantizers' calls run (compiled.KERNELS; None: the process default), e.g. quant.kernel
        self.weight_q = TensorQuantizer(weight, "weight", kernel=kernel) if weight is not None else None
        self.input_q = TensorQuantizer(input, "input", kernel=kernel) if input is not None else None
        self.grad_q = GradQuantizer(grad, kernel=kernel) if grad is not None else None
        # (the weight, what else it was quantized with, the quantized weight); see ``quantized_weight``
        self.weight_cache: tuple[torch.Tensor, tuple, torch.Tensor] | None = None

    def quantized_weight(self) -> torch.Tensor:
        """The weight as the forward pass uses it. Outside training, without autograd and with deterministic rounding,
        the last result is reused while the weight (its version counter counts in-place updates), the quantizer's
        spec, scaler, scaler state and switches are all unchanged; a training call drops it."""
        q, w = self.weight_q, self.weight
        if q is None:
            return w
        if torch.compiler.is_compiling():
            return q(w)
        if self.training or torch.is_grad_enabled() or q.spec.rounding == "stochastic":
            self.weight_cache = None
            return q(w)
        key = (w._version, w.data_ptr(), q.spec, q.scaler, q.enabled, q.track_stats,
               tuple(b._version for b in q.scaler.state()))
        cache = self.weight_cache
        if cache is not None and cache[0] is w and cache[1] == key:
            return cache[2]
        wq = q(w)
        self.weight_cache = (w, key, wq)
        return wq

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            y = linear_node.forward(self, x)
            if y is not None:
                return y
        return self.forward_modules(x)

    def __getstate__(self) -> dict:
        # the one-node road's resolution points into these quantizers' buffers: a copy or a pickle resolves its own
        state = self.__dict__.copy()
        state.pop("_one_node", None)
        return state

    def forward_modules(self, x: torch.Tensor) -> torch.Tensor:
        """The module road: the quantizer modules around F.linear (one straight-through node each); what a compiled
        graph traces, and the reference the one-node road is tested against."""
        if self.input_q is not None:
            x = self.input_q(x)
        y = F.linear(x, self.quantized_weight(), self.bias)
        if self.grad_q is not None:
            y = self.grad_q(y)
        return y

    def quantizers(self) -> Iterator[tuple[str, nn.Module]]:
        """(role, quantizer) for every quantized role of this layer."""
        for role, q in (("weight", self.weight_q), ("input", self.input_q), ("grad", self.grad_q)):
            if q is not None:
                yield role, q

    def extra_repr(self) -> str:
        def fmt(q: nn.Module | None) -> str:
            return "-" if q is None else (q.spec.format.name or repr(q.spec.format))

        return (f"{self.in_features}, {self.out_features}, bias={self.bias is not None}, "
                f"weight={fmt(self.weight_q)}, input={fmt(self.input_q)}, grad={fmt(self.grad_q)}"
                + (", tied" if self.tied else ""))


def iter_quant_linears(model: nn.Module) -> Iterator[tuple[str, QuantLinear]]:
    """Every QuantLinear of ``model`` with its qualified name relative to ``model``."""
    for name, module in model.named_modules():
        if isinstance(module, QuantLinear):
            yield name, module


def weight_grids(model: nn.Module) -> dict[nn.Parameter, TensorQuantizer]:
    """Parameter → the TensorQuantizer whose grid the forward pass puts it on (what ULP-aware optimizers need)."""
    return {m.weight: m.weight_q for _, m in iter_quant_linears(model) if m.weight_q is not None}


def quantize_linears(model: nn.Module, resolved: Mapping[str, "ResolvedLayer"],  # noqa: F821
                     kernel: str | None = None) -> dict[str, QuantLinear]:
    """Swap each nn.Linear named in ``resolved`` for a QuantLinear with its specs (in place; returns the new ones);
    its quantizers run on ``kernel`` (compiled.KERNELS; None: the process default).

    Layers whose three roles are all unquantized stay plain nn.Linear, so an fp32 baseline runs the original graph.
    """
    swapped: dict[str, QuantLinear] = {}
    for name, spec in resolved.items():
        module = model.get_submodule(name)
        if isinstance(module, QuantLinear):
            raise ValueError(f"{name} is already a QuantLinear: the layer map was applied twice")
        if spec.weight is None and spec.input is None and spec.grad is None:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        ql = QuantLinear(module, name, spec.weight, spec.input, spec.grad, tied=spec.tied, kernel=kernel)
        ql.to(device=module.weight.device)
        setattr(parent, child, ql)
        changes.moved()  # the model's structure changed: layer lists cached from it are stale
        swapped[name] = ql
    return swapped

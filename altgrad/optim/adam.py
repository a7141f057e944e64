"""Multi-tensor Adam(W) arithmetic shared by the plain group, ManifoldAdamW and GridOptim's inner rule.

The operation order copies torch's ``_multi_tensor_adam`` (foreach path), so a group stepped with ``stiffness=None``
is bitwise identical to ``torch.optim.AdamW(foreach=True)``; a per-coordinate stiffness S turns it into AdamW with
per-coordinate learning rate lr·S (the same ops, with the denominator divided by S).
"""

from __future__ import annotations

import torch
from torch import Tensor


def init_adam_state(state: dict, p: Tensor) -> None:
    """Zero moments and a float32 CPU step counter, as torch's AdamW keeps them."""
    state["step"] = torch.tensor(0.0, dtype=torch.float32)
    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def adam_moments_(
    grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor], steps: list[Tensor],
    beta1: float, beta2: float,
) -> tuple[list[float], list[float]]:
    """Advance step counters and moments in place; return the bias corrections 1 − β1^t and √(1 − β2^t)."""
    for step in steps:
        step += 1
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    bc1 = [1 - beta1 ** step.item() for step in steps]
    bc2_sqrt = [(1 - beta2 ** step.item()) ** 0.5 for step in steps]
    return bc1, bc2_sqrt


def adam_denominators(exp_avg_sqs: list[Tensor], bc2_sqrt: list[float], eps: float) -> list[Tensor]:
    """√v̂ + ε per tensor (new tensors)."""
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, bc2_sqrt)
    torch._foreach_add_(denom, eps)
    return denom


def adamw_step_(
    params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
    steps: list[Tensor], *, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
    stiffness: list[Tensor] | None = None,
) -> None:
    """w ← w − lr·S·(m̂/(√v̂+ε) + wd·w), with S ≡ 1 (plain AdamW) when ``stiffness`` is None.

    The decay is AdamW's decoupled decay at the same per-coordinate rate lr·S, so the ratio of decay to update is
    the one AdamW has; only the step length is measured in ULPs.
    """
    if not params:
        return
    if weight_decay != 0:
        if stiffness is None:
            torch._foreach_mul_(params, 1 - lr * weight_decay)
        else:
            torch._foreach_addcmul_(params, stiffness, params, value=-lr * weight_decay)
    bc1, bc2_sqrt = adam_moments_(grads, exp_avgs, exp_avg_sqs, steps, beta1, beta2)
    denom = adam_denominators(exp_avg_sqs, bc2_sqrt, eps)
    if stiffness is not None:
        torch._foreach_div_(denom, stiffness)  # m̂/((√v̂+ε)/S) = S·m̂/(√v̂+ε)
    torch._foreach_addcdiv_(params, exp_avgs, denom, [-lr / bc for bc in bc1])


HYPER = ("lr", "weight_decay", "bc1", "bc2_sqrt", "eps")
"""Slots of the float32 hyper-parameter tensor the fused steps take: tensors, not Python floats, so a learning-rate
schedule or Adam's bias corrections never make torch.compile specialise (and recompile) on their values."""


def hyper_tensor(lr: float, weight_decay: float, bc1: float, bc2_sqrt: float, eps: float,
                 device: torch.device) -> Tensor:
    """float32 [lr, weight_decay, bc1, bc2_sqrt, eps] on ``device`` (the order of HYPER)."""
    return torch.tensor([lr, weight_decay, bc1, bc2_sqrt, eps], dtype=torch.float32, device=device)

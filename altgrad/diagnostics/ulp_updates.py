"""Update sizes in units of the weight's own grid spacing: the mechanism behind "ULP-aware updates help".

For a weight w on a grid with spacing S(w) = ulp(w·s)/s (s: the quantizer's scale), an update Δw with
|Δw| < S/2 is lost entirely when the weight is stored on the grid with round-to-nearest (and only survives in
expectation with stochastic rounding); with fp32 master weights it accumulates but moves nothing until enough
such steps add up. |Δw|/|w| by |w| decile tells the shape of the step: a step ∝ |w| (relative, or ULP-aware within a
binade) gives the same ratio in every decile; Adam's step, independent of |w|, gives a ratio that falls with |w|.
"""

from __future__ import annotations

import torch

from altgrad.quant.ulp import scaled_ulp

QUANTILES = (0.1, 0.5, 0.9)
DECILES = 10


def ulp_ratio(delta: torch.Tensor, w: torch.Tensor, fmt, scale: torch.Tensor | float) -> torch.Tensor:
    """|Δw| / S(w) elementwise, S(w) = ulp(w·s)/s on ``fmt`` (a FloatFormat) at scale ``s`` (broadcastable)."""
    return delta.detach().float().abs() / scaled_ulp(w, fmt, scale)


def decile_index(magnitude: torch.Tensor) -> torch.Tensor:
    """0 … 9: the decile of each element's value within the tensor (0 = smallest tenth; ties by position)."""
    n = magnitude.numel()
    order = torch.argsort(magnitude.reshape(-1), stable=True)
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(n, device=magnitude.device)
    return torch.div(ranks * DECILES, max(n, 1), rounding_mode="floor")


def decile_indices(magnitudes: list[torch.Tensor]) -> list[torch.Tensor]:
    """``decile_index`` of each tensor, the tensors of one size sorted together (one stable argsort along the rows of
    their stack: each row's order, and so its ranks, is the one it has alone)."""
    out: list[torch.Tensor | None] = [None] * len(magnitudes)
    by_size: dict[tuple[int, torch.device], list[int]] = {}
    for i, m in enumerate(magnitudes):
        by_size.setdefault((m.numel(), m.device), []).append(i)
    for (n, device), members in by_size.items():
        if len(members) == 1 or n == 0:
            for i in members:
                out[i] = decile_index(magnitudes[i])
            continue
        rows = torch.stack([magnitudes[i].reshape(-1) for i in members])
        order = torch.argsort(rows, dim=1, stable=True)
        ranks = torch.empty_like(order).scatter_(1, order, torch.arange(n, device=device).expand(len(members), n))
        deciles = torch.div(ranks * DECILES, n, rounding_mode="floor")
        for i, row in zip(members, deciles.unbind(0)):
            out[i] = row.reshape(magnitudes[i].shape)
    return out  # type: ignore[return-value]


def summarize_updates(ratios: torch.Tensor, relative: torch.Tensor, deciles: torch.Tensor) -> dict[str, float]:
    """Run-level aggregates from every sampled update (flat tensors, on any device; one host transfer).

    ``ratios``: |Δw|/S for the updates that moved (Δw ≠ 0); ``relative``: |Δw|/|w| for weights with w ≠ 0 and
    ``deciles`` their |w| decile. Keys: ulp_update_q10/q50/q90, sub_half_ulp_share, rel_update_d1 … d10 (median
    |Δw|/|w| per decile); an aggregate without data is left out.
    """
    out: dict[str, float] = {}
    r = ratios.detach().float().reshape(-1).cpu()
    r = r[torch.isfinite(r)]
    if r.numel():
        qs = torch.quantile(r, torch.tensor(QUANTILES, dtype=torch.float32)) if r.numel() <= 2**24 else \
            torch.quantile(r[torch.randperm(r.numel(), generator=torch.Generator().manual_seed(0))[: 2**24]],
                           torch.tensor(QUANTILES, dtype=torch.float32))
        for q, v in zip(QUANTILES, qs.tolist()):
            out[f"ulp_update_q{round(100 * q)}"] = v
        out["sub_half_ulp_share"] = float((r < 0.5).float().mean())
    rel = relative.detach().float().reshape(-1).cpu()
    dec = deciles.reshape(-1).cpu()
    keep = torch.isfinite(rel)
    rel, dec = rel[keep], dec[keep]
    for d in range(DECILES):
        values = rel[dec == d]
        if values.numel():
            out[f"rel_update_d{d + 1}"] = float(values.median())
    return out

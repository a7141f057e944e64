"""Synthetic sweep folders with known numbers: the tests write every summary.json, metrics.csv and layer_map.json.

Sweep "ab" (flat job dirs 0, 1, …, like a Hydra multirun), seeds 0–2, fp32 master unless said:
- adamw vs manifold[update] in e4m3, e5m2, e3m4, e7m0; Δ per seed (manifold − adamw):
  e7m0 [-0.50, -0.52, -0.48] (p ≈ 5e-4, "**"), e4m3 [-0.10, -0.12, -0.08] (p ≈ 0.013, "*"),
  e5m2 [1, 2, 3] (mean 2, CI half-width t(0.975, 2)/√3 = 2.4841, "n.s."),
  e3m4: seed 0 −0.2, seed 1 +0.2, manifold seed 2 diverged at step 40, adamw seed 2 failed (no metrics).
- grid on-grid nearest in e4m3 (no on-grid AdamW → fp32-master AdamW baseline): Δ [0.05, 0.06, 0.04] ("*", worse).
- AdamW stall ratio: e5m2 0.2, e4m3 0.4, e3m4 0.5, e7m0 0.9.
- one job dir with a corrupt summary.json, one with only .hydra/overrides.yaml (killed).

Sweep "stages" (failure_stage, nested dirs FORMAT/STAGE/SEED), adamw, seeds 0–2 (Δ vs fp32 paired by seed):
- fp32 3.00, 3.02, 2.99;
- e4m3 forward Δ [.01, 0, .01] (p ≈ 0.18) → +grad Δ [.02, .03, .01] (p ≈ 0.074): within seed noise →
  +storage Δ [.50, .53, .48] (+16.6%, degraded);
- e7m0 forward Δ [.10, .10, .09] (+3.2%, p ≈ 0.0012: degraded by the test alone, ok with a 5 % minimum) → +grad:
  seed 1 diverged → +storage: every seed diverged.
  e4m3's stages are read from layer_map.json, e7m0's from config.format.grad.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ADAMW_BASE = {"e4m3": 3.2, "e5m2": 4.0, "e3m4": 3.5, "e7m0": 3.9}
MANIFOLD_DELTA = {"e7m0": [-0.50, -0.52, -0.48], "e4m3": [-0.10, -0.12, -0.08], "e5m2": [1.0, 2.0, 3.0],
                  "e3m4": [-0.2, 0.2, None]}
GRID_DELTA = [0.05, 0.06, 0.04]
STALL = {"e5m2": 0.2, "e4m3": 0.4, "e3m4": 0.5, "e7m0": 0.9}
LABELS = {"adamw": "adamw", "manifold": "manifold[update]", "grid": "grid"}


def write_job(path: Path, *, fmt: str, optimizer: str, seed: int, final: float | None, status: str = "completed",
              master: str = "fp32", lr: float = 1e-3, experiment: str | None = "manifold_ab",
              stall: float | None = None, grad: str | None = "e5m2", layer_map_json: bool = True,
              metrics: bool = True, steps: int = 50, **extra: Any) -> Path:
    """One job dir as train() leaves it: summary.json, metrics.csv, layer_map.json, .hydra/overrides.yaml."""
    path.mkdir(parents=True, exist_ok=True)
    (path / ".hydra").mkdir(exist_ok=True)
    (path / ".hydra" / "overrides.yaml").write_text(
        f"- format={fmt}\n- optimizer={optimizer}\n- seed={seed}\n- quant.master={master}\n")
    summary = {
        "status": status, "steps": steps, "final_val_loss": final, "best_val_loss": None if final is None else final,
        "tokens_per_second": 1000.0, "wall_seconds": 1.0, "seed": seed, "format": fmt, "optimizer": optimizer,
        "optimizer_label": LABELS.get(optimizer, optimizer), "layer_map": "uniform", "model": "nano",
        "data": "embedded", "lr": lr, "master": master, "storage_rounding": "nearest", "experiment": experiment,
        "diverged_at_step": None, "divergence_cause": None, "error": None,
        "diagnostics": {"mean_stall_ratio": stall, "final_flip_rate": 0.01, "mean_oscillation_rate": 0.1,
                        "min_grad_cosine": 0.9, "mean_effective_bits": 5.0},
        "fallbacks": [], "config": {"format": {"name": fmt, "grad": grad}, "quant": {"master": master}},
    }
    summary.update(extra)
    (path / "summary.json").write_text(json.dumps(summary))
    if layer_map_json and fmt != "fp32":
        spec = {"format": {"name": fmt}, "rounding": "nearest"}
        grad_spec = {"format": {"name": grad}, "rounding": "nearest"} if grad else None
        layers = {name: {"weight": spec, "input": spec, "grad": grad_spec, "tied": name == "lm_head"}
                  for name in ("transformer.h.0.attn.c_attn", "lm_head")}
        (path / "layer_map.json").write_text(json.dumps(layers))
    if metrics:
        end = final if final is not None else 9.0
        rows = ["step,epoch,train/loss,val/loss,val/ppl"]
        for step in range(0, steps + 1, 10):
            rows.append(f"{step},0,{end + 1.0 + 0.01 * step},,")
            val = end + 2.0 * (1 - step / steps)
            rows.append(f"{step},0,,{val if status != 'diverged' or step < steps else 'nan'},")
        (path / "metrics.csv").write_text("\n".join(rows) + "\n")
    return path


def build_ab_sweep(root: Path) -> Path:
    index = 0

    def job(**kw: Any) -> None:
        nonlocal index
        write_job(root / str(index), **kw)
        index += 1

    for fmt, base in ADAMW_BASE.items():
        for seed in range(3):
            adamw = base + 0.01 * seed
            if fmt == "e3m4" and seed == 2:
                job(fmt=fmt, optimizer="adamw", seed=seed, final=None, status="failed", metrics=False,
                    error="RuntimeError: CUDA out of memory", stall=None)
            else:
                job(fmt=fmt, optimizer="adamw", seed=seed, final=adamw, stall=STALL[fmt])
            delta = MANIFOLD_DELTA[fmt][seed]
            if delta is None:
                job(fmt=fmt, optimizer="manifold", seed=seed, final=None, status="diverged", stall=0.1, lr=0.3,
                    diverged_at_step=40, divergence_cause="nonfinite loss")
            else:
                job(fmt=fmt, optimizer="manifold", seed=seed, final=adamw + delta, stall=0.1, lr=0.3)
            if fmt == "e4m3":
                job(fmt=fmt, optimizer="grid", seed=seed, final=adamw + GRID_DELTA[seed], master="none",
                    stall=0.05, lr=0.5)
    corrupt = root / str(index)
    (corrupt / ".hydra").mkdir(parents=True)
    (corrupt / ".hydra" / "overrides.yaml").write_text("- format=e5m2\n- optimizer=grid\n- seed=0\n")
    (corrupt / "summary.json").write_text('{"status": "completed", "final_val_lo')
    killed = root / str(index + 1)
    (killed / ".hydra").mkdir(parents=True)
    (killed / ".hydra" / "overrides.yaml").write_text("- format=e7m0\n- optimizer=madam\n- seed=1\n")
    (root / "multirun.yaml").write_text("hydra: {}\n")
    return root


STAGE_LOSSES = {
    ("fp32", "fp32"): [3.00, 3.02, 2.99],
    ("e4m3", "forward"): [3.01, 3.02, 3.00], ("e4m3", "forward+grad"): [3.02, 3.05, 3.00],
    ("e4m3", "forward+grad+storage"): [3.50, 3.55, 3.47],
    ("e7m0", "forward"): [3.10, 3.12, 3.08], ("e7m0", "forward+grad"): [3.15, None, 3.14],
    ("e7m0", "forward+grad+storage"): [None, None, None],
}


def build_stage_sweep(root: Path) -> Path:
    for (fmt, stage), losses in STAGE_LOSSES.items():
        for seed, loss in enumerate(losses):
            write_job(root / fmt / stage / str(seed), fmt=fmt, optimizer="adamw", seed=seed, final=loss,
                      status="completed" if loss is not None else "diverged", experiment="failure_stage",
                      master="none" if stage.endswith("storage") else "fp32",
                      grad="e5m2" if "grad" in stage else None, layer_map_json=fmt == "e4m3",
                      diverged_at_step=None if loss is not None else 20,
                      divergence_cause=None if loss is not None else "loss spike")
    return root

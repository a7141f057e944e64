"""The job bench's reference row: a plain PyTorch training loop of the same model and recipe as a training job.

    python -m altgrad.bench._reference_loop OUT.json [overrides ...]

A nanoGPT-style ``train.py``: forward, cross-entropy, backward, global grad-norm clip, AdamW step with the warm-up +
cosine learning rate, nothing else (no Lightning, no logger, no callbacks, no checkpoints, no quantization). The
model, data windows, batch size, optimizer hyper-parameters, schedule, seed and validation cadence come from the
same Hydra config a job would compose from ``overrides``, so the throughput it reaches is what the job's own steps
could reach. Writes ``timing`` in the layout of a job's summary.json (module.JobClock) to OUT.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

CONF = Path(__file__).resolve().parents[2] / "conf"


def compose(overrides: list[str]) -> Any:
    """The job's config for these overrides (``paths.output_dir`` needs no Hydra run)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose("train", overrides=[*overrides, "paths.output_dir=."])


def run(cfg: Any) -> dict[str, Any]:
    """Train as configured with the plain loop; the ``timing`` dict of a job summary plus steps and losses."""
    import hydra
    import torch
    import torch.nn.functional as F

    from altgrad.model import GPT, GPTConfig
    from altgrad.module import JobClock, WarmupCosine
    from altgrad.optim import weight_decay_groups

    clock = JobClock()
    torch.manual_seed(int(cfg.seed))
    torch.set_float32_matmul_precision(cfg.trainer.matmul_precision)
    data = hydra.utils.instantiate(cfg.data, _convert_="all")
    data.prepare_data()
    data.setup("fit")
    m, t, o, s = cfg.model, cfg.trainer, cfg.optimizer, cfg.schedule
    model = GPT(GPTConfig(block_size=m.block_size, vocab_size=m.vocab_size or data.vocab_size, n_layer=m.n_layer,
                          n_head=m.n_head, n_embd=m.n_embd, dropout=m.dropout, bias=m.bias))
    groups, _ = weight_decay_groups(model, float(o.weight_decay))
    opt = torch.optim.AdamW(groups, lr=float(o.lr), betas=tuple(o.betas), eps=float(o.eps))
    schedule = WarmupCosine(s.warmup_steps, s.decay_steps or t.max_steps, s.min_lr_ratio)
    val_loader = data.val_dataloader()

    @torch.no_grad()
    def evaluate() -> float:
        started = time.perf_counter()
        model.eval()
        losses = [F.cross_entropy(model(x).float().flatten(0, 1), y.flatten()).item() for x, y in val_loader]
        model.train()
        clock.validation_seconds += time.perf_counter() - started
        return sum(losses) / len(losses)

    clock.fit_start = time.time()
    initial = evaluate() if t.initial_validation else None
    batches = iter(data.train_dataloader())
    loss_value = float("nan")
    for step in range(int(t.max_steps)):
        started = time.perf_counter()
        lr = float(o.lr) * schedule(step)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = next(batches)
        logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        if t.gradient_clip_val is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), float(t.gradient_clip_val))
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - started
        if clock.first_step_done is None:
            clock.first_step_done, clock.first_step_seconds = time.time(), dt
        clock.step_done(dt, x.numel())
        if (step + 1) % int(t.log_every_n_steps) == 0:
            loss_value = loss.item()  # what a logger would read
        if (step + 1) % int(t.val_check_interval) == 0 and step + 1 < int(t.max_steps):
            evaluate()
    final = evaluate()
    return {"steps": int(t.max_steps), "initial_val_loss": initial, "final_val_loss": final,
            "train_loss": loss_value, "timing": clock.summary(fit_end=time.time())}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help"}:
        print(__doc__.strip().splitlines()[2].strip())
        return 0 if argv else 2
    out = Path(argv[0])
    result = run(compose(argv[1:]))
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

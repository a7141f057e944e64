"""The caveats of a report, computed from the runs themselves: the scale they ran at, the hardware they simulated
the formats on, whether the loss was still falling at the horizon, and how the lrs were chosen.

The answer of a study holds for what was run; these lines say what that was, so a reader does not have to dig the
limits of the evidence out of the configs. Scope: the jobs of the declared studies (the evaluation) when there are
any, else every completed job; jobs outside the scope (a pilot, the tuning) are read only for what they add.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from altgrad.report.load import Job

STILL_LEARNING = 0.03
"""Relative fall of the validation loss over the last quarter of the horizon above which runs count as still
learning at the horizon (the pilot's horizon rule uses the same 3 %)."""


def _distinct(values: Sequence[object]) -> list[object]:
    return list(dict.fromkeys(v for v in values if v is not None))


def _loss_at(curve: Sequence[tuple[int, float]], step: int) -> float | None:
    """The validation loss logged at the last step <= ``step`` (None when the curve starts later)."""
    before = [v for s, v in curve if s <= step]
    return before[-1] if before else None


def _shape(job: Job) -> str:
    m = job.config.get("model") or {}
    n = job.summary.get("n_params")
    size = f"{n / 1e6:.2f} M parameters" if isinstance(n, (int, float)) else "size unknown"
    parts = [f"{m['n_layer']} layers" if "n_layer" in m else None,
             f"width {m['n_embd']}" if "n_embd" in m else None,
             f"context {m['block_size']}" if "block_size" in m else None]
    detail = ", ".join(p for p in parts if p)
    return f"{job.get('model') or '?'} ({size}{': ' + detail if detail else ''})"


def _steps(job: Job) -> int:
    """The optimizer steps a run took (its summary's, else its curve's last logged step)."""
    steps = job.summary.get("steps")
    return int(steps) if isinstance(steps, (int, float)) else job.curve[-1][0]


def scale_line(scope: Sequence[Job]) -> str:
    shapes = _distinct([_shape(j) for j in scope])
    data = _distinct([str(j.get("data")) for j in scope if j.get("data")])
    steps = _distinct([j.summary.get("steps") for j in scope if j.state == "completed"])
    tokens = [t for t in (j.summary.get("tokens_seen") for j in scope) if isinstance(t, (int, float))]
    text = (f"Scale: {'one model, ' if len(shapes) == 1 else 'models '}{'; '.join(map(str, shapes))}, on "
            f"{', '.join(map(str, data)) or 'unknown data'}")
    if steps:
        text += f"; {', '.join(map(str, steps))} steps"
    if tokens:
        text += f", {statistics.median(tokens) / 1e6:.2f} M tokens per run"
    return text + (". Effects at this scale are not known to hold for larger models or longer training."
                   if len(shapes) == 1 else ".")


def hardware_line(scope: Sequence[Job]) -> str:
    trainers = [j.config.get("trainer") or {} for j in scope]
    where = _distinct([t.get("accelerator") for t in trainers])
    precision = _distinct([t.get("precision") for t in trainers])
    return (f"Hardware: {', '.join(map(str, where)) or 'unknown'}, precision {', '.join(map(str, precision)) or '?'}. "
            "The formats are simulated: values are rounded exactly onto each format's grid, but the matrix "
            "products then run and accumulate in that precision, so the accumulation error of a real 8-bit GEMM "
            "and any speed effect are not part of the evidence.")


def horizon_lines(scope: Sequence[Job], others: Sequence[Job]) -> list[str]:
    done = [j for j in scope if j.state == "completed" and j.curve]
    if not done:
        return []
    horizon = statistics.median_low([_steps(j) for j in done])
    falls = []
    for job in done:
        start, end = _loss_at(job.curve, horizon * 3 // 4), _loss_at(job.curve, horizon)
        if start is not None and end is not None and end > 0:
            falls.append((start - end) / end)
    lines = []
    if falls:
        med = statistics.median(falls)
        span = f"{100 * min(falls):.1f}–{100 * max(falls):.1f} %"
        if med > STILL_LEARNING:
            lines.append(f"Horizon: H = {horizon} steps, and the runs were still learning there: over the last "
                         f"quarter of H their validation loss fell by a median {100 * med:.1f} % ({span} over "
                         f"{len(falls)} runs). The comparison is at this budget; a ranking at H need not hold at "
                         "longer horizons.")
        else:
            lines.append(f"Horizon: H = {horizon} steps; over its last quarter the validation loss changed by a "
                         f"median {100 * med:.1f} % ({span} over {len(falls)} runs): close to settled at H.")
    models = {(j.get("model"), j.get("data")) for j in done}
    longer = [j for j in others if j.state == "completed" and (j.get("model"), j.get("data")) in models
              and j.curve and _steps(j) >= 2 * horizon]
    for job in longer:
        at_h, end = _loss_at(job.curve, horizon), job.curve[-1][1]
        if at_h is not None and at_h > 0:
            lines.append(f"A longer run of the same model and data ({job.format} {job.optimizer_label}, lr "
                         f"{job.lr:g}, seed {job.seed}): validation loss {at_h:.3f} at step {horizon}, {end:.3f} at "
                         f"step {_steps(job)} ({100 * (at_h - end) / at_h:.0f} % lower).")
    return lines


def tuning_line(scope: Sequence[Job], others: Sequence[Job]) -> str | None:
    evaluated = {j.seed for j in scope if j.seed is not None}
    arms = {(j.format, j.optimizer_label) for j in scope}
    tuning = [j for j in others if (j.format, j.optimizer_label) in arms and j.seed not in evaluated]
    seeds = sorted({j.seed for j in tuning if j.seed is not None})
    if not tuning or not seeds:
        return None
    return (f"Tuning: the lrs were picked on seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))} "
            f"({len(tuning)} tuning runs), disjoint from the {len(evaluated)} evaluation seeds; the CIs above "
            "hold the lrs fixed, so the noise of picking them" + (" on one seed" if len(seeds) == 1 else "")
            + " is not in them.")


def caveat_lines(jobs: Sequence[Job], study_jobs: Sequence[Job] = ()) -> list[str]:
    """The caveats of the evidence (markdown sentences): scale, hardware, horizon, tuning."""
    scope = list(study_jobs) or [j for j in jobs if j.state == "completed"]
    if not scope:
        return []
    inside = {id(j) for j in scope}
    others = [j for j in jobs if id(j) not in inside]
    lines = [scale_line(scope), hardware_line(scope), *horizon_lines(scope, others)]
    tuning = tuning_line(scope, others) if study_jobs else None
    return lines + ([tuning] if tuning else [])

"""The caveats of a report, computed from the runs themselves: the scale they ran at, the hardware they simulated
the formats on, what the format was applied to and how the weights were stored, the data, whether the loss was
still falling at the horizon (and what a Δ is worth in steps there), how the lrs were chosen, and contrasts whose
arms take the same step by construction in some format.

The answer of a study holds for what was run; these lines say what that was, so a reader does not have to dig the
limits of the evidence out of the configs. Scope: the jobs of the declared studies (the evaluation) when there are
any, else every completed job; jobs outside the scope (a pilot, the tuning) are read only for what they add.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from altgrad.report.load import Job
from altgrad.report.order import FORMAT_ORDER, mantissa_bits, rank
from altgrad.report.stats import summarize
from altgrad.report.study import Comparison, StudyResult, optimizer_of_arm

STILL_LEARNING = 0.03
"""Fall of the validation loss over the last quarter of the horizon, relative to its value at the start of that
quarter, above which runs count as still learning at the horizon."""
CLIFF = 1.5
"""A loss ratio from one scanned lr to the next above which the caveats call it a cliff."""
DATA_SOURCES = {"embedded": "synthetic text from the package's embedded grammar generator",
                "hub": "a Hugging Face dataset", "local": "local text files",
                "folder": "split text files read from a data folder (their sha256 under Provenance)"}
"""How the caveats name a ``data.source``."""


def _distinct(values: Sequence[object]) -> list[object]:
    return list(dict.fromkeys(v for v in values if v is not None))


def loss_at(curve: Sequence[tuple[int, float]], step: int) -> float | None:
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
        start, end = loss_at(job.curve, horizon * 3 // 4), loss_at(job.curve, horizon)
        if start is not None and end is not None and start > 0:
            falls.append((start - end) / start)
    lines = []
    if falls:
        med = statistics.median(falls)
        fell = span([100 * f for f in falls], "{:.1f}") + " %"
        base = f"relative to its value at step {horizon * 3 // 4}, the start of that quarter"
        if med > STILL_LEARNING:
            lines.append(f"Horizon: H = {horizon} steps, and the runs were still learning there: over the last "
                         f"quarter of H their validation loss fell by a median {100 * med:.1f} % ({fell} over "
                         f"{len(falls)} runs; {base}). The comparison is at this budget; a ranking at H need not "
                         "hold at longer horizons.")
        else:
            lines.append(f"Horizon: H = {horizon} steps; over its last quarter the validation loss changed by a "
                         f"median {100 * med:.1f} % ({fell} over {len(falls)} runs; {base}): close to settled "
                         "at H.")
    models = {(j.get("model"), j.get("data")) for j in done}
    longer = [j for j in others if j.state == "completed" and (j.get("model"), j.get("data")) in models
              and j.curve and _steps(j) >= 2 * horizon]
    for job in longer:
        at_h, end = loss_at(job.curve, horizon), job.curve[-1][1]
        if at_h is not None and at_h > 0:
            lines.append(f"A longer run of the same model and data ({job.format} {job.optimizer_label}, lr "
                         f"{job.lr:g}, seed {job.seed}): validation loss {at_h:.3f} at step {horizon}, {end:.3f} at "
                         f"step {_steps(job)} ({100 * (at_h - end) / at_h:.0f} % below its value at step "
                         f"{horizon}).")
    return lines


def tuning_line(scope: Sequence[Job], others: Sequence[Job]) -> str | None:
    evaluated = {j.seed for j in scope if j.seed is not None}
    arms = {(j.format, j.arm) for j in scope}
    tuning = [j for j in others if (j.format, j.arm) in arms and j.seed not in evaluated]
    seeds = sorted({j.seed for j in tuning if j.seed is not None})
    if not tuning or not seeds:
        return None
    return (f"Tuning: the lrs were picked on seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))} "
            f"({len(tuning)} tuning runs of the evaluated arms), disjoint from the {len(evaluated)} evaluation seeds; "
            "the CIs above hold the lrs fixed, so the noise of picking them"
            + (" on one seed" if len(seeds) == 1 else "") + " is not in them.")


def tuning_runs(scope: Sequence[Job], others: Sequence[Job]) -> dict[tuple[str, str], dict[float, list[Job]]]:
    """Per evaluated (format, arm): the tuning runs at the evaluation's horizon, by lr."""
    evaluated = {j.seed for j in scope}
    arms = {(j.format, j.arm) for j in scope}
    horizons = {_steps(j) for j in scope if j.state == "completed"}
    out: dict[tuple[str, str], dict[float, list[Job]]] = {}
    for j in others:
        key = (j.format, j.arm)
        if key in arms and j.seed not in evaluated and j.lr is not None and j.state in ("completed", "diverged") \
                and (j.state == "diverged" or _steps(j) in horizons):
            out.setdefault(key, {}).setdefault(j.lr, []).append(j)
    return out


def span(values: Sequence[float], fmt: str) -> str:
    """``fmt`` of the least and greatest value joined by "–", or once where the two read the same."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}–{hi}"


def lr_grid_line(scope: Sequence[Job], others: Sequence[Job]) -> str | None:
    """How coarse the lr scan was, and what lay one step above each evaluated lr on the tuning seeds."""
    runs = tuning_runs(scope, others)
    picks = {(j.format, j.arm): j.lr for j in scope if j.lr is not None}
    ratios, above, diverged, counted = [], [], 0, 0
    for key, by_lr in runs.items():
        lrs = sorted(by_lr)
        ratios += [b / a for a, b in zip(lrs, lrs[1:]) if a > 0]
        pick = picks.get(key)
        up = [x for x in lrs if pick is not None and x > pick and not math.isclose(x, pick)]
        at = next((x for x in lrs if pick is not None and math.isclose(x, pick)), None)
        if not up or at is None:
            continue
        here = summarize([j.final_loss for j in by_lr[at] if j.final_loss is not None]).mean
        nxt = by_lr[up[0]]
        counted += 1
        if any(j.state == "diverged" for j in nxt):
            diverged += 1
            continue
        there = summarize([j.final_loss for j in nxt if j.final_loss is not None]).mean
        if here and there is not None:
            above.append(there / here)
    if not ratios:
        return None
    text = (f"Learning-rate scan: adjacent scanned lrs are {span(ratios, '×{:.2g}')} apart, so an "
            "evaluated lr may sit up to that factor from the best one")
    if counted:
        parts = []
        if above:
            parts.append(f"ended at {span(above, '{:.2g}')}× (median {statistics.median(above):.2g}×) the "
                         "loss at the evaluated lr")
        if diverged:
            parts.append(f"diverged in {diverged}")
        text += (f"; on the tuning seeds the next scanned lr above the evaluated one {' and '.join(parts)} "
                 f"({counted} format × arm scans)")
        cliffs = diverged + sum(r >= CLIFF for r in above)
        if cliffs:
            text += (f": {cliffs} of the {counted} picks sit one grid step below a loss cliff (≥ {CLIFF:g}× the "
                     "loss, or divergence)")
    return text + ". See the lr–loss figure and the sensitivity table."


def storage_line(scope: Sequence[Job]) -> str:
    """How the weights were stored, and what that lets the grid do to the optimizer."""
    storages = _distinct([j.storage for j in scope])
    if storages == ["fp32 master"]:
        return ("Storage: every evaluated run keeps fp32 master weights; the format rounds only what the forward "
                "pass reads, so an update below half a ULP accumulates in the master copy instead of being lost. "
                "The grid reaches the optimizer only through the step size (a step in ULPs is a step ∝ the "
                "weight's spacing), never through whether an update lands: what the study says about ULP-aware "
                "updates holds for this regime, not for weights stored on the grid.")
    return ("Storage: " + ", ".join(map(str, storages)) + " (on-grid: the weights are stored in the format, so an "
            "update that rounds back to the same value is lost).")


def role_format(spec: object) -> str:
    """The format name of one role's spec in a run's layer_map.json, or ``unquantized``."""
    fmt = spec.get("format") if isinstance(spec, dict) else None
    name = fmt.get("name") if isinstance(fmt, dict) else None
    return str(name) if name else "unquantized"


def roles_line(scope: Sequence[Job]) -> str | None:
    """What the format under test was applied to, read from the runs' resolved layer maps."""
    per_format: dict[str, dict[str, set[str]]] = {}
    for job in scope:
        if not isinstance(job.layer_map, dict):
            continue
        roles = per_format.setdefault(job.format, {"weight": set(), "input": set(), "grad": set()})
        for layer in job.layer_map.values():
            if isinstance(layer, dict):
                for role, names in roles.items():
                    names.add(role_format(layer.get(role)))
    if not per_format:
        return None
    formats = sorted(per_format, key=lambda f: rank(FORMAT_ORDER, f))
    inputs = [f for f in formats if per_format[f]["input"] == per_format[f]["weight"] != {"unquantized"}]
    grads: dict[str, list[str]] = {}
    for f in formats:
        grads.setdefault("/".join(sorted(per_format[f]["grad"])), []).append(f)
    if not inputs:
        applied = ""
    elif len(inputs) == len(formats):
        applied = ", and the layer inputs (activations) in every format"
    else:
        applied = f", and the layer inputs (activations) in {', '.join(inputs)}"
    held: dict[str, list[str]] = {}  # the inputs' precision where it is not the format under test
    for f in formats:
        if f not in inputs:
            held.setdefault("/".join(sorted(per_format[f]["input"])), []).append(f)
    text = ("What a format is applied to (the runs' layer_map.json): the weights" + applied
            + ("; layer inputs " + _precisions(held) if held else "") + "; gradients " + _precisions(grads))
    mixed = inputs or any(g != "unquantized" for g in grads)
    return text + (". A difference between formats is a difference of weights, activations and gradients together, "
                   "not of the weight grid alone." if mixed else ".")


def _precisions(groups: dict[str, list[str]]) -> str:
    """``unquantized (e4m3, e7m0), in e5m2 (e0m7)``: a role's precision and the formats that hold it there."""
    return ", ".join(f"{'in ' + g if g != 'unquantized' else g} ({', '.join(fs)})" for g, fs in groups.items())


def data_line(scope: Sequence[Job]) -> str | None:
    """What the runs were trained on (``data.source``), and a warning where it is synthetic."""
    datas = _distinct([json_key(j.config.get("data")) for j in scope])
    if not datas:
        return None
    parts = []
    for key in datas:
        d = dict(key)
        source = d.get("source")
        what = DATA_SOURCES.get(str(source), f"source {source}") if source else "source unknown"
        tokens = f", tokenizer {d['tokenizer']}" if d.get("tokenizer") else ""
        parts.append(f"{d.get('name') or '?'} — {what}{tokens}")
    synthetic = any(dict(k).get("source") == "embedded" for k in datas)
    return ("Data: " + "; ".join(parts) + "."
            + (" What holds on generated text need not hold on natural text." if synthetic else ""))


def json_key(data: object) -> tuple | None:
    """A hashable view of a data config's identifying fields (name, source, tokenizer)."""
    if not isinstance(data, dict):
        return None
    return tuple((k, str(data.get(k))) for k in ("name", "source", "tokenizer") if data.get(k) is not None)


def _mean_curve_at(jobs: Sequence[Job], step: int) -> float | None:
    values = [v for j in jobs if j.state == "completed" and (v := loss_at(j.curve, step)) is not None]
    return statistics.fmean(values) if values else None


def time_shift_line(result: StudyResult) -> str | None:
    """The primary Δ in steps of the reference arm's own descent at the horizon: how early, not how low."""
    primary = result.endpoint.primary_contrast
    done = [j for j in result.declared_jobs if j.state == "completed" and j.curve]
    if not done:
        return None
    horizon = result.endpoint.horizon or statistics.median_low([_steps(j) for j in done])
    start = horizon * 3 // 4
    rates, parts = [], []
    for c in sorted(result.of(primary), key=lambda c: rank(FORMAT_ORDER, c.format)):
        if c.reference is None or c.test.mean is None:
            continue
        a, b = _mean_curve_at(c.reference.jobs, start), _mean_curve_at(c.reference.jobs, horizon)
        if a is None or b is None or horizon <= start:
            continue
        rate = (a - b) / (horizon - start)  # nats per step over the last quarter
        rates.append(rate)
        if rate > 0:
            steps = abs(c.test.mean) / rate
            parts.append(f"{c.format} {steps:.0f} ({100 * steps / horizon:.0f} %)")
    if not rates or not parts:
        return None
    return (f"Time shift: at the horizon ({horizon} steps) the {primary.reference} arms were still descending, by a "
            f"median {100 * statistics.median(rates):.3f} nats per 100 steps over the last quarter (mean curve per "
            f"format); measured in that descent, |Δ({primary.name})| is worth ≈ " + ", ".join(parts) + " steps (in "
            "brackets: share of the horizon). While the curves still fall, a Δ at the horizon can be one arm reaching "
            "the same curve earlier rather than a lower loss.")


def _ulp_is_magnitude(c: Comparison) -> bool:
    """Whether one arm is ManifoldAdamW stepping in ULPs on the update and the other the relative step, in a format
    without mantissa bits, where the ULP at w is |w|: with ``smooth`` stiffness (|w|·2^−M) always, with ``pow2``
    (2^⌊log2|w|⌋) where w is on the grid, i.e. stored there (no float32 master copy, which sits between grid points)."""
    names = {optimizer_of_arm(c.treatment).get("name"), optimizer_of_arm(c.reference).get("name")}
    arm = next((a for a in (c.treatment, c.reference) if optimizer_of_arm(a).get("name") == "manifold"), None)
    if names != {"manifold", "relative"} or arm is None or mantissa_bits(c.format) != 0:
        return False
    manifold = optimizer_of_arm(arm)
    on_grid = all(j.master == "none" for j in arm.jobs)
    return (manifold.get("stiffness_on", "update") == "update"
            and (manifold.get("stiffness_kind", "pow2") == "smooth" or on_grid))


def same_step_line(result: StudyResult) -> str | None:
    """The contrasts whose two arms take the same step by construction in some format (manifold against relative
    where a ULP is |w|), so that their Δ there cannot tell the grid from a step ∝ |w|."""
    hits = [c for c in (*result.comparisons, *result.secondary, *result.controls)
            if c.treatment is not None and c.reference is not None and _ulp_is_magnitude(c)]
    if not hits:
        return None
    names = "; ".join(f"{c.contrast.label + ': ' if c.contrast.label else ''}{c.contrast.name} in {c.format}"
                      for c in hits)
    return (f"Same step by construction: {names}. The format has no mantissa bits, so every value on its grid is a "
            "power of two and the ULP at a weight stored there is |w|: ManifoldAdamW's step lr · ULP(w) · m̂/(√v̂+ε) "
            "is the relative step lr · |w| · m̂/(√v̂+ε) except at the grid's lower edge. A Δ ≈ 0 there is expected "
            "whatever the grid does; only formats with mantissa bits can separate the grid from a step ∝ |w|.")


def caveat_lines(jobs: Sequence[Job], study_jobs: Sequence[Job] = (),
                 results: Sequence[StudyResult] = ()) -> list[str]:
    """The caveats of the evidence (markdown sentences): scale, hardware, storage, what the format is applied to,
    data, horizon and time shift, tuning and its lr grid. Before a declared study's evaluation has runs, they
    describe its other completed runs but not its failure-stage ladder, whose rungs quantize more than the weights
    by design (the ladder's table says what each rung ran)."""
    ladder = {id(j) for r in results for j in r.ladder_jobs}
    completed = [j for j in jobs if j.state == "completed"]
    scope = list(study_jobs) or [j for j in completed if id(j) not in ladder] or completed
    if not scope:
        return []
    inside = {id(j) for j in scope}
    others = [j for j in jobs if id(j) not in inside]
    lines = [scale_line(scope), hardware_line(scope), storage_line(scope)]
    lines += [line for line in (roles_line(scope), data_line(scope)) if line]
    lines += horizon_lines(scope, others)
    lines += [line for r in results if (line := time_shift_line(r))]
    lines += [line for r in results if (line := same_step_line(r))]
    if study_jobs:
        lines += [line for line in (tuning_line(scope, others), lr_grid_line(scope, others)) if line]
    return lines

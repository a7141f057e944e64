"""The report's PNG figures (matplotlib's object API with the Agg canvas: no display, no global pyplot state)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from altgrad.report.benefit import Benefit
from altgrad.report.cells import Cell, describe, varying_fields
from altgrad.report.ladder import Ladder
from altgrad.report.load import Job
from altgrad.report.order import FORMAT_ORDER, OPTIMIZER_ORDER, STORAGE_ORDER, mantissa_bits, preset_of, rank
from altgrad.report.study import StudyResult


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=100)
    return path


def _grid(n: int, ncols: int = 4) -> tuple[int, int]:
    cols = min(ncols, max(n, 1))
    return math.ceil(n / cols), cols


def seed_band(curves: Sequence[Sequence[tuple[int, float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """steps, mean, min and max over the curves at every step any of them logged."""
    by_step: dict[int, list[float]] = {}
    for curve in curves:
        for step, value in curve:
            by_step.setdefault(step, []).append(value)
    steps = np.array(sorted(by_step), dtype=float)
    vals = [by_step[int(s)] for s in steps]
    return (steps, np.array([np.mean(v) for v in vals]), np.array([min(v) for v in vals]),
            np.array([max(v) for v in vals]))


Colour = tuple[float, float, float, float]


def arm_palette(labels: Sequence[str]) -> dict[str, Colour]:
    """One colour per arm (optimizer label), in report order, so that an arm has the same colour in every figure of
    a report."""
    ordered = sorted(set(labels), key=lambda lab: rank(OPTIMIZER_ORDER, lab))
    cmap = colormaps["tab10"]
    return {lab: cmap(i % 10) for i, lab in enumerate(ordered)}


@dataclass(frozen=True)
class CurveGroup:
    """One line of a validation-loss panel: its seeds' curves, the arm that colours it, its legend text."""

    panel: str
    arm: str
    label: str
    jobs: tuple[Job, ...]
    dashed: bool = False


def plot_curves(groups: Sequence[CurveGroup], path: Path, palette: dict[str, Colour],
                title: str = "Validation loss", log_y: bool = False) -> Path | None:
    """One panel per format (report order): a line per group, the mean over its seeds' val/loss with a min–max band,
    coloured by its arm; ``log_y`` puts the loss on a log axis that starts after the shared initial loss."""
    groups = [g for g in groups if any(j.curve for j in g.jobs)]
    if not groups:
        return None
    panels = sorted({g.panel for g in groups}, key=lambda f: rank(FORMAT_ORDER, f))
    rows, cols = _grid(len(panels))
    per_panel = max(sum(g.panel == f for g in groups) for f in panels)
    fig = Figure(figsize=(4.2 * cols, (3.0 + 0.16 * per_panel) * rows), layout="constrained")
    fallback = colormaps["tab10"]
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        tops, bottoms, later = [], [], []
        for k, g in enumerate(g for g in groups if g.panel == panel):
            curves = [j.curve for j in g.jobs if j.curve]
            steps, mean, lo, hi = seed_band(curves)
            colour = palette.get(g.arm, fallback(k % 10))
            ax.plot(steps, mean, lw=1.4, color=colour, ls="--" if g.dashed else "-",
                    label=f"{g.label} (n={len(curves)})")
            if len(curves) > 1:
                ax.fill_between(steps, lo, hi, color=colour, alpha=0.12 if g.dashed else 0.2, lw=0)
            tops += [cv[0][1] for cv in curves]
            bottoms.append(float(lo.min()))
            later += [float(m) for m in mean[1:]]
        if log_y and bottoms and min(bottoms) > 0 and later:
            # log axis from just below the lowest band to the highest mean after the first logged step: the shared
            # initial loss would otherwise flatten the part of the curves where the arms differ
            ax.set_yscale("log")
            ax.set_ylim(min(bottoms) * 0.95, max(later) * 1.1)
            ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        elif tops and bottoms and max(tops) > min(bottoms):
            # a diverging run's loss explodes; the initial loss is the natural ceiling of a training curve
            ax.set_ylim(min(bottoms) - 0.02 * (max(tops) - min(bottoms)), max(tops) * 1.05)
        ax.set_title(panel)
        ax.set_xlabel("step")
        ax.set_ylabel("val/loss" + (" (log)" if log_y else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
    fig.suptitle(f"{title} (line: mean over seeds, band: min–max)")
    return _save(fig, path)


def plot_val_loss(cells: Sequence[Cell], path: Path, title: str = "Validation loss",
                  palette: dict[str, Colour] | None = None) -> Path | None:
    """One panel per format: val/loss vs step per optimizer (and storage, lr, …) with its seed band; lines of one
    arm share the arm's colour (``palette``) and differ in dash when the arm has several lines."""
    with_curves = [c for c in cells if any(j.curve for j in c.jobs)]
    label_fields = [f for f in varying_fields(with_curves) if f not in ("format", "experiment")]
    seen: dict[tuple[str, str], int] = {}
    groups = []
    for c in with_curves:
        key = (c["format"], c["optimizer_label"])
        seen[key] = seen.get(key, 0) + 1
        groups.append(CurveGroup(c["format"], c["optimizer_label"] if palette else describe(dict(c.key), label_fields),
                                 describe(dict(c.key), label_fields), c.jobs, dashed=seen[key] > 1))
    return plot_curves(groups, path, palette or {}, title)


def plot_lr_scan(jobs: Sequence[Job], path: Path, palette: dict[str, Colour],
                 evaluated: dict[tuple[str, str], float] | None = None,
                 title: str = "Tuning: final validation loss against lr",
                 ring: str = "lr the evaluation used") -> Path | None:
    """One panel per format: final val loss (mean over the seeds run) against lr on a log axis, one line per arm;
    a diverged lr is an ``x`` at the panel's top, the lr in ``evaluated`` a ring (``ring`` says what it is)."""
    by: dict[tuple[str, str], dict[float, list[Job]]] = {}
    for j in jobs:
        if j.lr is not None and j.lr > 0 and j.state in ("completed", "diverged"):
            by.setdefault((j.format, j.arm), {}).setdefault(j.lr, []).append(j)
    by = {k: v for k, v in by.items() if len(v) >= 2}
    if not by:
        return None
    evaluated = evaluated or {}
    panels = sorted({f for f, _ in by}, key=lambda f: rank(FORMAT_ORDER, f))
    rows, cols = _grid(len(panels))
    fig = Figure(figsize=(4.2 * cols, 3.4 * rows), layout="constrained")
    seeds = sorted({j.seed for j in jobs if j.seed is not None})
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        arms = sorted((a for f, a in by if f == panel), key=lambda a: rank(OPTIMIZER_ORDER, a))
        finite = [x for a in arms for js in by[(panel, a)].values() for j in js if (x := j.final_loss) is not None]
        top = max(finite) * 1.08 if finite else 1.0
        for arm in arms:
            points = by[(panel, arm)]
            lrs = sorted(points)
            means = [float(np.mean(v)) if (v := [j.final_loss for j in points[x] if j.final_loss is not None])
                     else math.nan for x in lrs]
            colour = palette.get(arm, "0.4")
            ax.plot(lrs, means, "o-", ms=3, lw=1.2, color=colour, label=arm)
            gone = [x for x, m in zip(lrs, means) if math.isnan(m)]
            if gone:
                ax.plot(gone, [top] * len(gone), "x", color=colour, ms=7, mew=1.5)
            pick = evaluated.get((panel, arm))
            at = [m for x, m in zip(lrs, means) if pick is not None and math.isclose(x, pick) and not math.isnan(m)]
            if at:
                ax.plot([pick], at, "o", ms=10, mfc="none", mec=colour, mew=1.5)
        ax.set_xscale("log")
        ax.set_ylim(top=top * 1.04)
        ax.set_title(panel)
        ax.set_xlabel("lr (each arm's own unit; manifold: ULPs per step)", fontsize=7)
        ax.set_ylabel("final val loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="best")
    seed_text = (f"seed {seeds[0]}, one run per point" if len(seeds) == 1 else
                 f"mean over seeds {', '.join(map(str, seeds))}")
    fig.suptitle(f"{title} ({seed_text}; ring: {ring}; x: diverged)")
    return _save(fig, path)


def plot_benefit(benefits: Sequence[Benefit], path: Path) -> Path | None:
    """Forest plot of Δ final val loss vs AdamW with paired-seed 95% CIs (green: significant gain, red: loss)."""
    rows = [b for b in benefits if b.diff.diff.mean is not None]
    if not rows:
        return None
    fig = Figure(figsize=(8, 0.35 * len(rows) + 1.4), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    for y, b in enumerate(reversed(rows)):
        d = b.diff.diff
        color = "tab:green" if b.improves else "tab:red" if b.worsens else "0.5"
        ax.errorbar(d.mean, y, xerr=d.half_width if d.half_width is not None else None, fmt="o", color=color,
                    capsize=3)
    ax.set_yticks(range(len(rows)))
    fields = [f for f in varying_fields([b.treatment for b in rows]) if f != "lr"]
    ax.set_yticklabels([describe(dict(b.treatment.key), fields) for b in reversed(rows)], fontsize=7)
    ax.axvline(0.0, color="k", lw=0.8)
    ax.set_xlabel("Δ final val loss vs AdamW (negative = ULP-aware update helps)")
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def sub_half_ulp_by_mantissa(result: StudyResult) -> dict[str, list[tuple[int, float]]]:
    """Per arm of a declared study: (mantissa bits, median over seeds of the share of updates below half a ULP of
    the weight's grid), in mantissa order; arms and formats without that diagnostic are left out."""
    out: dict[str, list[tuple[int, float]]] = {}
    for (fmt, arm), entry in sorted(result.arms.items(), key=lambda kv: (rank(OPTIMIZER_ORDER, kv[0][1]),
                                                                          mantissa_bits(kv[0][0]) or 0)):
        bits = mantissa_bits(fmt)
        shares = [job.summary.get("diagnostics", {}).get("sub_half_ulp_share") for job in entry.jobs]
        shares = [x for x in shares if isinstance(x, (int, float)) and math.isfinite(x)]
        if bits is not None and shares:
            out.setdefault(arm, []).append((bits, float(np.median(shares))))
    return out


def plot_study_by_mantissa(result: StudyResult, path: Path, palette: dict[str, Colour] | None = None) -> Path | None:
    """The declared study against mantissa bits: left, Δ of each contrast per format with its declared CI (hollow:
    formats outside the family, descriptive); right, each arm's median share of updates below half a ULP of the
    weight's grid (the mechanism: a step below ½ ULP is lost to round-to-nearest without a master copy). A contrast
    takes its reference arm's colour, an arm its own (``palette``)."""
    comparisons = [c for c in (*result.comparisons, *result.outside)
                   if c.test.mean is not None and mantissa_bits(c.format) is not None]
    if not comparisons:
        return None
    contrasts = list(dict.fromkeys(c.contrast for c in comparisons))
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    colors = colormaps["tab10"]
    palette = palette or arm_palette([lab for c in contrasts for lab in (c.treatment, c.reference)])
    outside = {id(c) for c in result.outside}
    for i, contrast in enumerate(contrasts):
        offset = 0.25 * (i - (len(contrasts) - 1) / 2)
        colour = palette.get(contrast.reference, colors(i))
        for c in (c for c in comparisons if c.contrast == contrast):
            ci = c.ci
            yerr = None if ci is None else [[c.test.mean - ci[0]], [ci[1] - c.test.mean]]
            left.errorbar(mantissa_bits(c.format) + offset, c.test.mean, yerr=yerr, fmt="o", capsize=3,
                          color=colour, mfc="white" if id(c) in outside else colour)
        left.plot([], [], "o", color=colour, label=contrast.name)
    left.axhline(0.0, color="k", lw=0.8)
    left.set_xlabel("mantissa bits")
    left.set_ylabel(f"Δ {result.endpoint.metric} (negative: treatment helps)")
    left.set_title(f"Δ per format, {100 * (1 - result.endpoint.alpha):g}% CI (hollow: outside the family)",
                   fontsize=9)
    left.legend(fontsize=7)
    for j, (arm, points) in enumerate(sub_half_ulp_by_mantissa(result).items()):
        right.plot(*zip(*points), "o-", color=palette.get(arm, colors(len(contrasts) + j)), label=arm)
    right.set_xlabel("mantissa bits")
    right.set_ylabel("share of updates < ½ ULP (median over seeds)")
    right.set_ylim(-0.02, 1.02)
    right.set_title("mechanism: updates below half a ULP of the weight's grid", fontsize=9)
    if right.lines:
        right.legend(fontsize=7)
    bits = sorted({mantissa_bits(c.format) for c in comparisons})
    names = {b: "/".join(sorted({c.format for c in comparisons if mantissa_bits(c.format) == b},
                                key=lambda f: rank(FORMAT_ORDER, f))) for b in bits}
    for ax in (left, right):
        ax.set_xticks(bits)
        ax.set_xticklabels([f"{b}\n{names[b]}" for b in bits], fontsize=7)
        ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_diagnostics(cells: Sequence[Cell], names: Sequence[str], path: Path) -> Path | None:
    """Heat maps, one per diagnostic: format (rows) × optimizer and storage (columns), mean over runs."""
    if not names:
        return None
    formats = sorted({c["format"] for c in cells}, key=lambda f: rank(FORMAT_ORDER, f))
    columns = sorted({(c["optimizer_label"], c["storage"]) for c in cells},
                     key=lambda k: (rank(OPTIMIZER_ORDER, k[0]), rank(STORAGE_ORDER, k[1])))
    rows, cols = _grid(len(names), 3)
    fig = Figure(figsize=(max(4.0, 0.9 * len(columns) + 2.5) * cols, (0.35 * len(formats) + 2.0) * rows),
                 layout="constrained")
    for i, name in enumerate(names):
        grid = np.full((len(formats), len(columns)), np.nan)
        for r, fmt in enumerate(formats):
            for k, col in enumerate(columns):
                vals = [j.diagnostics[name] for c in cells if c["format"] == fmt
                        and (c["optimizer_label"], c["storage"]) == col for j in c.jobs if name in j.diagnostics]
                if vals:
                    grid[r, k] = float(np.mean(vals))
        ax = fig.add_subplot(rows, cols, i + 1)
        image = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="viridis")
        middle = np.nanmean(grid) if np.isfinite(grid).any() else 0.0
        for (r, k), v in np.ndenumerate(grid):
            if np.isfinite(v):  # dark text on the bright (high) end of viridis, light text on the dark end
                ax.text(k, r, f"{v:.2g}", ha="center", va="center", fontsize=6, color="k" if v > middle else "w")
        ax.set_xticks(range(len(columns)))
        ax.set_xticklabels([f"{o}\n{s}" for o, s in columns], fontsize=6, rotation=45, ha="right")
        ax.set_yticks(range(len(formats)))
        ax.set_yticklabels(formats, fontsize=7)
        ax.set_title(name, fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.04)
    return _save(fig, path)


def plot_format_grids(formats: Sequence[str], path: Path) -> tuple[Path | None, str | None]:
    """Every positive representable value of each format on a log2 axis; (None, why) when it cannot be drawn."""
    names = sorted(set(formats) - {"fp32"}, key=lambda f: rank(FORMAT_ORDER, f))
    if not names:
        return None, "format value grids skipped: no quantized format in the sweep"
    try:
        from altgrad.quant import get_format
    except ImportError as exc:
        return None, f"format value grids skipped: altgrad.quant is not importable ({exc})"
    grids, skipped = [], []
    for name in names:
        try:
            values = get_format(preset_of(name) or name).values()
            values = np.asarray(values.detach().cpu() if hasattr(values, "detach") else values, dtype=np.float64)
        except (ValueError, KeyError) as exc:
            skipped.append(f"{name} ({exc})")
            continue
        positive = values[values > 0]
        if positive.size:
            grids.append((name, np.log2(positive)))
    note = f"formats without a known grid: {', '.join(skipped)}" if skipped else None
    if not grids:
        return None, note
    fig = Figure(figsize=(14, 0.45 * len(grids) + 1.4), layout="constrained")
    full, zoom = fig.subplots(1, 2, width_ratios=(3, 2))
    window = (-4.0, 4.0)  # the zoom shows the spacing (values per octave = 2^mantissa bits) where scaled weights live
    for y, (_, g) in enumerate(grids):
        if g.size > 2048:  # bf16/fp16: a solid band at this width; drawing 30k ticks would only cost time
            full.hlines(y, g.min(), g.max(), lw=9, color="tab:blue")
        else:
            full.vlines(g, y - 0.35, y + 0.35, lw=0.5, color="tab:blue")
        inside = g[(g >= window[0]) & (g <= window[1])]
        zoom.vlines(inside, y - 0.35, y + 0.35, lw=0.5, color="tab:blue")
    for ax in (full, zoom):
        ax.set_yticks(range(len(grids)))
        ax.set_yticklabels([n for n, _ in grids], fontsize=7)
        ax.set_ylim(len(grids) - 0.5, -0.5)
        ax.grid(axis="x", alpha=0.3)
    for y, (name, g) in enumerate(grids):
        full.text(g.max() + 0.5, y, f"{g.size} values, 2^{g.min():.0f}…2^{g.max():.1f}", va="center", fontsize=6)
    full.set_xlabel("log2 of each positive representable value (before scaling)")
    zoom.set_xlim(*window)
    zoom.set_xlabel("zoom: 2^-4 … 2^4")
    return _save(fig, path), note


def plot_parallel(jobs: Sequence[Job], path: Path) -> Path | None:
    """Parallel coordinates: format, optimizer, storage, log10 lr → final val loss (diverged runs in red)."""
    runs = [j for j in jobs if j.final_loss is not None or j.state == "diverged"]
    if not runs:
        return None
    axes: list[tuple[str, list[float], dict[float, str]]] = []
    for title, values, order in (("format", [j.format for j in runs], FORMAT_ORDER),
                                 ("optimizer", [j.optimizer_label for j in runs], OPTIMIZER_ORDER),
                                 ("storage", [j.storage for j in runs], STORAGE_ORDER)):
        levels = sorted(set(values), key=lambda v: rank(order, v))
        pos = {v: (i / (len(levels) - 1) if len(levels) > 1 else 0.5) for i, v in enumerate(levels)}
        axes.append((title, [pos[v] for v in values], {p: v for v, p in pos.items()}))
    if all(j.lr is not None for j in runs):
        axes.append(_numeric_axis("log10 lr", [math.log10(j.lr) for j in runs if j.lr is not None]))
    losses = [j.final_loss for j in runs if j.final_loss is not None]
    lo, hi = (min(losses), max(losses)) if losses else (0.0, 1.0)

    def loss_position(loss: float | None) -> float:
        if loss is None:
            return 1.08  # diverged runs end above the loss axis
        return (loss - lo) / (hi - lo) if hi > lo else 0.5

    ticks = {0.0: f"{lo:.4g}", 1.0: f"{hi:.4g}"} if hi > lo else {0.5: f"{lo:.4g}"} if losses else {}
    ticks[1.08] = "diverged"
    axes.append(("final val loss", [loss_position(j.final_loss) for j in runs], ticks))

    fig = Figure(figsize=(2.2 * len(axes) + 1, 5), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    cmap = colormaps["viridis"]
    for i, job in enumerate(runs):
        ys = [a[1][i] for a in axes]
        if job.final_loss is None:
            ax.plot(range(len(axes)), ys, color="tab:red", lw=0.8, ls="--", alpha=0.7)
        else:
            ax.plot(range(len(axes)), ys, color=cmap(loss_position(job.final_loss)), lw=1.0, alpha=0.8)
    for x, (title, _, labels) in enumerate(axes):
        ax.axvline(x, color="k", lw=0.8)
        for y, text in labels.items():
            ax.text(x + 0.03, y, text, fontsize=6, va="center")
    ax.set_xticks(range(len(axes)))
    ax.set_xticklabels([a[0] for a in axes])
    ax.set_yticks([])
    ax.set_ylim(-0.08, 1.15)
    ax.set_title("Configuration → final val loss (colour: loss, dark = low; red dashed: diverged)")
    return _save(fig, path)


def _numeric_axis(title: str, values: Sequence[float]) -> tuple[str, list[float], dict[float, str]]:
    """Values scaled to [0, 1] with min/max tick labels (a constant axis sits at 0.5)."""
    lo, hi = min(values), max(values)
    if hi == lo:
        return title, [0.5] * len(values), {0.5: f"{lo:.4g}"}
    return title, [(v - lo) / (hi - lo) for v in values], {0.0: f"{lo:.4g}", 1.0: f"{hi:.4g}"}


def plot_ladder(lad: Ladder | None, path: Path) -> Path | None:
    """Failure stages: Δ of each ladder stage against the reference cell per format, with its paired 95% CI; the
    tie margin dashed (a stage fails when its Δ exceeds it significantly); failing stages filled, others hollow."""
    if lad is None or not any(r.vs_reference.mean is not None for r in lad.rungs):
        return None
    arms = list(dict.fromkeys(r.arm for r in lad.rungs))
    fig = Figure(figsize=(1.3 * len(arms) + 3.0, 4.0), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    cmap = colormaps["tab10"]
    width = 0.6 / max(len(lad.formats), 1)
    for k, fmt in enumerate(lad.formats):
        colour = cmap(k % 10)
        pts = [(arms.index(r.arm) + (k - (len(lad.formats) - 1) / 2) * width, r) for r in lad.rungs
               if r.format == fmt and r.vs_reference.mean is not None]
        if not pts:
            continue
        ax.plot([x for x, _ in pts], [r.vs_reference.mean for _, r in pts], color=colour, lw=0.8, alpha=0.6)
        for x, r in pts:
            ci = r.vs_reference.ci()
            err = None if ci is None else [[r.vs_reference.mean - ci[0]], [ci[1] - r.vs_reference.mean]]
            ax.errorbar(x, r.vs_reference.mean, yerr=err, fmt="o", color=colour, capsize=3,
                        mfc=colour if r.fails else "white", label=fmt if x == pts[0][0] else None)
    ax.axhline(0.0, color="k", lw=0.8)
    ax.axhline(lad.margin, color="0.4", lw=0.8, ls="--", label=f"margin {lad.margin:g}")
    ax.set_xticks(range(len(arms)))
    ax.set_xticklabels(arms, fontsize=8)
    ax.set_ylabel(f"Δ final val loss vs {lad.reference_format} {lad.reference_arm}")
    ax.set_title("Failure stages (filled: fails, one-sided Holm)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)

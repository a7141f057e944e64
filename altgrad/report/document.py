"""Assemble report.md and its PNG figures from one or more sweep folders."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from altgrad.report import plots, tables
from altgrad.report.benefit import stability_thresholds, ulp_benefits
from altgrad.report.cells import group_cells
from altgrad.report.findings import findings
from altgrad.report.load import load_sweeps
from altgrad.report.stages import attribute_failures

REPORT_NAME = "report.md"


def _figure(path: Path | None, caption: str, missing: str) -> str:
    return f"![{caption}]({path.name})" if path is not None else f"_{missing}_"


def write_report(sweep_dirs: Sequence[str | os.PathLike[str]], out_dir: str | os.PathLike[str] | None = None,
                 threshold: float = 0.05, command: str | None = None) -> Path:
    """Read the sweeps, write report.md and its figures into out_dir (default: the first sweep dir); its path."""
    sweep = load_sweeps(sweep_dirs)
    out = Path(out_dir) if out_dir is not None else sweep.roots[0]
    out.mkdir(parents=True, exist_ok=True)

    cells = group_cells(sweep.jobs)
    main_cells = [c for c in cells if c["stage"] is None]  # stage is set for failure_stage jobs only
    stage_cells = [c for c in cells if c["stage"] is not None]
    benefits = ulp_benefits(cells)
    attributions = attribute_failures(sweep.jobs, threshold)
    thresholds = stability_thresholds(cells)
    diverged = sweep.by_state("diverged")
    not_completed = [j for j in sweep.jobs if j.state != "completed"]
    diag_names = tables.diagnostic_names(cells)

    val_png = plots.plot_val_loss(main_cells, out / "val_loss.png")
    stage_val_png = plots.plot_val_loss(stage_cells, out / "val_loss_failure_stage.png",
                                        title="Validation loss per failure stage")
    benefit_png = plots.plot_benefit(benefits, out / "benefit.png")
    diag_png = plots.plot_diagnostics(main_cells or cells, diag_names, out / "diagnostics.png")
    grid_png, grid_note = plots.plot_format_grids([c["format"] for c in cells], out / "format_grids.png")
    # failure_stage runs differ by stage, which the parallel axes do not show; keep them out unless alone
    parallel_png = plots.plot_parallel([j for c in (main_cells or cells) for j in c.jobs],
                                       out / "parallel_coordinates.png")

    parts = [
        "# AltGrad sweep report",
        "",
        "Sweeps: " + ", ".join(f"`{r}`" for r in sweep.roots) + (f"  \nCommand: `{command}`" if command else ""),
        "",
        "## Findings",
        "",
        findings(sweep, cells, benefits, attributions, threshold),
        "",
        "## ULP-aware benefit (Δ final val loss vs AdamW, paired by seed)",
        "",
        ("Δ = optimizer − AdamW in the same format, storage and context, over the seeds both completed; negative "
         "means the ULP-aware update helps. Marks: `**` p < 0.01, `*` p < 0.05 (the 95% CI excludes 0), `n.s.` "
         "not significant, `n<2` fewer than two seed pairs."),
        "",
        tables.benefit_table(benefits) if benefits else "_No format has both AdamW and another optimizer._",
        "",
        _figure(benefit_png, "Δ final val loss vs AdamW", "No Δ to plot."),
        "",
        "## Validation loss",
        "",
        _figure(val_png, "validation loss per format", "No job logged val/loss in metrics.csv."),
        "",
        ("Final and best validation loss per configuration: mean ± std over seeds (completed runs only) and the "
         "95% Student-t confidence interval of the mean."),
        "",
        tables.cell_table(cells) if cells else "_No job has a summary._",
        "",
    ]
    if thresholds:
        parts += ["## Stability threshold (learning-rate scan)", "", tables.stability_table(thresholds), ""]
    parts += ["## Divergences", "",
              tables.divergence_table(diverged) if diverged else "_No job diverged._", ""]
    parts += ["## Failure-stage attribution", ""]
    if attributions:
        parts += [(f"A stage fails when any seed diverged or its mean final loss is more than {100 * threshold:g}% "
                   "above the stage before it (fp32 before the first stage)."), "",
                  tables.stage_summary_table(attributions), "", tables.stage_table(attributions), "",
                  _figure(stage_val_png, "validation loss per failure stage", "No failure_stage job logged val/loss."),
                  ""]
    else:
        parts += ["_No failure_stage jobs in these sweeps._", ""]
    parts += ["## Why: update stalls, flips, gradient fidelity, effective bits", ""]
    if diag_names:
        parts += [tables.diagnostics_table(cells), "",
                  _figure(diag_png, "diagnostics per format", "No diagnostics to plot."), ""]
    else:
        parts += ["_No diagnostics in the summaries._", ""]
    parts += ["Format value grids (every positive representable value):", "",
              _figure(grid_png, "format value grids", grid_note or "No format grid to draw."), ""]
    if grid_png is not None and grid_note:
        parts += [f"_{grid_note}_", ""]
    parts += ["## Configuration vs final loss", "",
              _figure(parallel_png, "parallel coordinates", "No run with a final loss or divergence."), ""]
    parts += ["## Jobs", "",
              f"{len(sweep.jobs)} job dirs found; {len(not_completed)} did not complete.", ""]
    if not_completed:
        parts += [tables.jobs_table(not_completed), ""]

    report = out / REPORT_NAME
    report.write_text("\n".join(parts))
    return report

"""How much of a declared contrast's Δ depends on the reference arm's learning rate: the reference at the lrs next
to its declared one, wherever records exist.

Two sources, never pooled:

- *evaluation seeds*: runs of the declaration itself at an lr set by hand (``StudyResult.off_lr``), paired by seed
  with the treatment arm as declared, so Δ gets a CI;
- *tuning seeds*: the runs the lrs were picked from (same configuration, their own seeds, usually one), paired by
  seed with the treatment's tuning run at its declared lr; with one seed there is no CI, and the row says so.

A run is the reference arm at another lr when its resolved config equals the arm's except for the learning rates
(``optimizer.lr``, ``baseline.lr``), the seeds, the paths and names, and the declaration itself (see ``NOT_CONFIG``):
runs that differ in anything else (another horizon, model or format) are never taken for a neighbour. Rows are
descriptive: outside the declared family and its correction.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from altgrad.report.endpoint import Contrast
from altgrad.report.load import Job
from altgrad.report.stats import TTest, t_test
from altgrad.report.study import StudyResult, label_of, lr_of_arm, run_value

LR_KEYS = ("optimizer.lr", "baseline.lr")
"""The config keys a neighbouring lr may change (an arm's own lr and that of its grid-less parameters)."""
NOT_CONFIG_PREFIXES = ("paths.", "hydra.", "endpoint.", "tuned_lr.")
NOT_CONFIG_NAMES = ("seed", "save_dir", "csv_path", "run_name", "ckpt_path", "resume_sweep", "experiment_name")
"""What is not part of a run's configuration here: where it was written, what it was called, the seeds (data order,
initialisation, diagnostic samples) and the declaration it was analysed under."""
JOB_FIELDS = ("format", "optimizer_label", "storage", "model", "data", "layer_map")
"""Compared on top of the config (and in place of it for records without one)."""


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value}


def configuration(job: Job, without: Sequence[str] = ()) -> str:
    """A canonical text of the job's configuration (see the module docstring), leaving out the keys ``without``."""
    flat = {k: v for k, v in _flatten(job.config).items()
            if not k.startswith(NOT_CONFIG_PREFIXES) and k.rsplit(".", 1)[-1] not in NOT_CONFIG_NAMES
            and k not in without}
    for name in JOB_FIELDS:
        flat[f"job.{name}"] = getattr(job, name) if name in ("format", "optimizer_label", "storage") else job.get(name)
    return json.dumps(flat, sort_keys=True, default=str)


@dataclass(frozen=True)
class Neighbour:
    """The reference arm of one contrast in one format at one lr, from one source, against the treatment arm."""

    contrast: Contrast
    format: str
    source: str                       # "evaluation" or "tuning"
    lr: float
    declared_lr: float
    seeds: tuple[int, ...]
    reference: dict[int, float]       # its value per seed
    failures: int                     # diverged runs among them (entered at their initial loss)
    delta: TTest                      # treatment (declared lr) − this reference, paired by seed

    @property
    def is_declared(self) -> bool:
        return math.isclose(self.lr, self.declared_lr, rel_tol=1e-9)


def _per_seed(jobs: Sequence[Job], result: StudyResult) -> tuple[dict[int, float], int]:
    values: dict[int, list[float]] = {}
    failures = 0
    for job in jobs:
        value, kind = run_value(job, result.endpoint)
        failures += kind == "failure"
        if value is not None and job.seed is not None:
            values.setdefault(job.seed, []).append(value)
    return {s: math.fsum(v) / len(v) for s, v in values.items()}, failures


def _rows(contrast: Contrast, fmt: str, source: str, by_lr: dict[float, list[Job]], declared_lr: float,
          treatment: dict[int, float], result: StudyResult) -> list[Neighbour]:
    rows = []
    for lr in sorted(by_lr):
        reference, failures = _per_seed(by_lr[lr], result)
        seeds = tuple(sorted(s for s in reference if s in treatment))
        if not seeds:
            continue
        rows.append(Neighbour(contrast, fmt, source, lr, declared_lr, seeds, reference, failures,
                              t_test([treatment[s] - reference[s] for s in seeds])))
    return rows


def _nearest(lrs: Sequence[float], declared: float) -> set[float]:
    """The declared lr and the nearest lr on each side of it."""
    below = [x for x in lrs if x < declared and not math.isclose(x, declared)]
    above = [x for x in lrs if x > declared and not math.isclose(x, declared)]
    keep = {x for x in lrs if math.isclose(x, declared)}
    return keep | ({max(below)} if below else set()) | ({min(above)} if above else set())


def neighbours(result: StudyResult, others: Sequence[Job]) -> list[Neighbour]:
    """Per declared contrast and family format: the reference arm at its off-lr evaluation runs and at the tuning
    lrs next to its declared one (``others``: the sweep's jobs outside the declaration), each against the treatment
    arm at its declared lr on the same seeds."""
    out: list[Neighbour] = []
    off_lr = list(result.off_lr)
    for contrast in result.endpoint.contrasts:
        for fmt in result.formats:
            treat, ref = result.arms.get((fmt, contrast.treatment)), result.arms.get((fmt, contrast.reference))
            if treat is None or ref is None or not treat.jobs or not ref.jobs:
                continue
            declared_lr = lr_of_arm(ref)
            if declared_lr is None:
                continue
            ref_shape = configuration(ref.jobs[0], LR_KEYS)
            treat_shape = configuration(treat.jobs[0])
            # evaluation seeds: the declaration's own runs at a hand-set lr
            evaluation: dict[float, list[Job]] = {}
            for job in off_lr:
                if job.lr is not None and configuration(job, LR_KEYS) == ref_shape:
                    evaluation.setdefault(job.lr, []).append(job)
            out += _rows(contrast, fmt, "evaluation", evaluation, declared_lr, treat.values, result)
            # tuning seeds: the same configuration on other seeds, beside the treatment's tuning run at its lr
            tuning: dict[float, list[Job]] = {}
            for job in others:
                if job.lr is not None and label_of(job, result.endpoint) == contrast.reference \
                        and configuration(job, LR_KEYS) == ref_shape:
                    tuning.setdefault(job.lr, []).append(job)
            treatment_tuning, _ = _per_seed([j for j in others if label_of(j, result.endpoint) == contrast.treatment
                                             and configuration(j) == treat_shape], result)
            keep = _nearest(sorted(tuning), declared_lr)
            out += _rows(contrast, fmt, "tuning", {lr: js for lr, js in tuning.items() if lr in keep}, declared_lr,
                         treatment_tuning, result)
    return out


def declared_delta(result: StudyResult, contrast: Contrast, fmt: str) -> float | None:
    """The declared comparison's mean Δ in a format."""
    return next((c.test.mean for c in result.of(contrast) if c.format == fmt), None)

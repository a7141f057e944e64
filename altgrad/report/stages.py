"""Failure-stage attribution: at which quantization stage does a format first break?

The ``failure_stage`` experiment runs each format at growing stages: the forward pass only (weights and inputs
quantized, gradients not), + gradients, + weights stored on the grid (no fp32 master). The stage of a job is read
from what it actually ran: the resolved layer_map.json (any layer with a ``grad`` spec), else the config's
``format.grad``, and ``master``.

A stage fails when any seed diverged, or when its final loss is above fp32's by more than seed noise explains: the
paired-by-seed difference stage − fp32 (same optimizer, same seeds) is tested against zero, and the p-values of every
stage of every format are Holm-corrected together; ``threshold`` (default 0) additionally asks for a minimum relative
increase, for a reviewer who wants practical as well as statistical significance. Each stage's step from the stage
before it is shown with its own paired CI, as a description.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from altgrad.report.load import Job
from altgrad.report.order import FORMAT_ORDER, STAGE_ORDER, rank
from altgrad.report.stats import Summary, TTest, holm, summarize, t_test

_UNQUANTIZED = {"", "none", "null", "fp32", "off", "false"}
FAILURE_EXPERIMENT = "failure_stage"


def is_failure_stage(job: Job) -> bool:
    """Whether the job belongs to a failure_stage experiment (its debug variant included)."""
    return FAILURE_EXPERIMENT in str(job.get("experiment") or "")


def grad_quantized(job: Job) -> bool:
    """Whether the job quantized gradients anywhere: the resolved layer map first, else ``format.grad``."""
    if isinstance(job.layer_map, dict):
        grads = [layer.get("grad") for layer in job.layer_map.values() if isinstance(layer, dict) and "grad" in layer]
        if grads:
            return any(_quantized(g) for g in grads)
    fmt_cfg = job.config.get("format")
    if isinstance(fmt_cfg, dict) and "grad" in fmt_cfg:
        return _quantized(fmt_cfg["grad"])
    return _quantized(job.get("format.grad"))


def stage_of(job: Job) -> str | None:
    """``fp32`` / ``forward`` / ``forward+grad`` / ``forward+grad+storage`` for failure_stage jobs, else None."""
    if not is_failure_stage(job):
        return None
    if job.format == "fp32":
        return "fp32"
    parts = ["forward"]
    if grad_quantized(job):
        parts.append("grad")
    if job.master == "none":
        parts.append("storage")
    return "+".join(parts)


@dataclass(frozen=True)
class StageResult:
    """One stage of one format: its losses, how many seeds broke, and the verdict against fp32 and seed noise."""

    stage: str
    jobs: tuple[Job, ...]
    loss: Summary
    reference: float | None          # fp32's mean final loss
    relative_change: float | None    # (mean − fp32 mean) / fp32 mean
    verdict: str
    vs_fp32: TTest = TTest(0, None, None, None)         # paired by seed: stage − fp32
    vs_previous: TTest = TTest(0, None, None, None)     # paired by seed: stage − the stage before (fp32 first)
    p_adjusted: float | None = None                     # Holm over every stage test of the sweep

    @property
    def n_diverged(self) -> int:
        return sum(j.state == "diverged" for j in self.jobs)

    @property
    def n_failed(self) -> int:
        return sum(j.state == "failed" for j in self.jobs)

    @property
    def failed(self) -> bool:
        return self.verdict in ("diverged", "degraded")


@dataclass(frozen=True)
class FormatAttribution:
    """The stages of one (format, optimizer) in order, and the first one that failed (None: none did)."""

    format: str
    optimizer_label: str
    fp32_reference: float | None
    stages: tuple[StageResult, ...]
    fp32_seed_std: float | None = None

    @property
    def first_failure(self) -> StageResult | None:
        return next((s for s in self.stages if s.failed), None)


def _by_seed(jobs: Iterable[Job]) -> dict[int, float]:
    out: dict[int, list[float]] = {}
    for j in jobs:
        if j.final_loss is not None and j.seed is not None:
            out.setdefault(j.seed, []).append(j.final_loss)
    return {s: sum(v) / len(v) for s, v in out.items()}


def _paired(a: dict[int, float], b: dict[int, float]) -> TTest:
    return t_test([a[s] - b[s] for s in a if s in b])


def attribute_failures(jobs: Iterable[Job], threshold: float = 0.0, alpha: float = 0.05) -> list[FormatAttribution]:
    """Walk each format's stages in order; judge each against fp32 (paired by seed, Holm over all stages)."""
    if threshold < 0:
        raise ValueError(f"degradation threshold must be >= 0 (a relative loss increase), got {threshold}")
    relevant = [j for j in jobs if is_failure_stage(j) and j.state in ("completed", "diverged", "failed")]
    groups: dict[tuple[str, str, str], list[Job]] = {}
    for job in relevant:
        groups.setdefault((job.optimizer_label, job.format, stage_of(job) or "?"), []).append(job)

    def fp32_jobs(optimizer_label: str) -> list[Job]:
        """The fp32 reference: same optimizer if it ran fp32, else any optimizer's fp32 runs."""
        same = [j for (opt, fmt, _), js in groups.items() for j in js if fmt == "fp32" and opt == optimizer_label]
        return same or [j for (_, fmt, _), js in groups.items() for j in js if fmt == "fp32"]

    drafts = []
    pairs = {(o, f) for o, f, _ in groups if f != "fp32"}
    for opt, fmt in sorted(pairs, key=lambda k: (rank(FORMAT_ORDER, k[1]), k[0])):
        ref_jobs = fp32_jobs(opt)
        ref_seeds = _by_seed(ref_jobs)
        fp32 = summarize(list(ref_seeds.values()))
        previous = ref_seeds
        stages = []
        for stage in sorted({s for o, f, s in groups if (o, f) == (opt, fmt)}, key=lambda s: rank(STAGE_ORDER, s)):
            stage_jobs = tuple(groups[(opt, fmt, stage)])
            seeds = _by_seed(stage_jobs)
            loss = summarize(list(seeds.values()))
            change = None
            if loss.mean is not None and fp32.mean is not None and fp32.mean != 0:
                change = (loss.mean - fp32.mean) / abs(fp32.mean)
            stages.append([stage, stage_jobs, loss, fp32.mean, change, _paired(seeds, ref_seeds),
                           _paired(seeds, previous)])
            if seeds:
                previous = seeds
        drafts.append((opt, fmt, fp32, stages))

    # the family: every stage with a test (untestable ones, < 2 seed pairs, are not in it)
    adjusted = iter(holm([st[5].p_value for *_, stages in drafts for st in stages if st[5].p_value is not None]))
    out = []
    for opt, fmt, fp32, stages in drafts:
        results = []
        for stage, stage_jobs, loss, reference, change, vs_fp32, vs_prev in stages:
            p_adj = 1.0 if vs_fp32.p_value is None else next(adjusted)
            if any(j.state == "diverged" for j in stage_jobs):
                verdict = "diverged"
            elif loss.mean is None:
                verdict = "no data"
            elif vs_fp32.p_value is None:
                verdict = "no reference"
            elif (vs_fp32.mean or 0.0) > 0 and p_adj < alpha and (change or 0.0) > threshold:
                verdict = "degraded"
            else:
                verdict = "ok"
            results.append(StageResult(stage, stage_jobs, loss, reference, change, verdict, vs_fp32, vs_prev,
                                       None if vs_fp32.p_value is None else p_adj))
        out.append(FormatAttribution(fmt, opt, fp32.mean, tuple(results), fp32.std))
    return out


def _quantized(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, dict):
        return _quantized(value["format"]) if "format" in value else bool(value)
    return str(value).strip().lower() not in _UNQUANTIZED

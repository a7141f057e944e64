"""Failure-stage attribution: at which quantization stage does a format first break?

The ``failure_stage`` experiment runs each format at growing stages: the forward pass only (weights and inputs
quantized, gradients not), + gradients, + weights stored on the grid (no fp32 master). The stage of a job is read
from what it actually ran: the resolved layer_map.json (any layer with a ``grad`` spec), else the config's
``format.grad``, and ``master``. A stage fails when any seed diverged, or when its mean final loss is worse than
the stage before it (fp32 for the first) by more than a relative threshold.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from altgrad.report.load import Job
from altgrad.report.order import FORMAT_ORDER, STAGE_ORDER, rank
from altgrad.report.stats import Summary, summarize

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
    """One stage of one format: its losses, how many seeds broke, and the verdict against the stage before."""

    stage: str
    jobs: tuple[Job, ...]
    loss: Summary
    reference: float | None
    relative_change: float | None
    verdict: str

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

    @property
    def first_failure(self) -> StageResult | None:
        return next((s for s in self.stages if s.failed), None)


def attribute_failures(jobs: Iterable[Job], threshold: float = 0.05) -> list[FormatAttribution]:
    """Walk each format's stages in order and judge each against the previous one (fp32 before the first)."""
    if threshold < 0:
        raise ValueError(f"degradation threshold must be >= 0 (a relative loss increase), got {threshold}")
    relevant = [j for j in jobs if is_failure_stage(j) and j.state in ("completed", "diverged", "failed")]
    groups: dict[tuple[str, str, str], list[Job]] = {}
    for job in relevant:
        groups.setdefault((job.optimizer_label, job.format, stage_of(job) or "?"), []).append(job)

    def fp32_mean(optimizer_label: str) -> float | None:
        """The fp32 reference: same optimizer if it ran fp32, else any optimizer's fp32 runs."""
        for same_optimizer in (True, False):
            losses = [j.final_loss for (opt, fmt, _), js in groups.items() for j in js
                      if fmt == "fp32" and (opt == optimizer_label or not same_optimizer)]
            mean = summarize(losses).mean
            if mean is not None:
                return mean
        return None

    out = []
    pairs = {(o, f) for o, f, _ in groups if f != "fp32"}
    for opt, fmt in sorted(pairs, key=lambda k: (rank(FORMAT_ORDER, k[1]), k[0])):
        reference = fp32_ref = fp32_mean(opt)
        stages = []
        for stage in sorted({s for o, f, s in groups if (o, f) == (opt, fmt)}, key=lambda s: rank(STAGE_ORDER, s)):
            stage_jobs = tuple(groups[(opt, fmt, stage)])
            loss = summarize([j.final_loss for j in stage_jobs])
            change = None
            if loss.mean is not None and reference is not None and reference != 0:
                change = (loss.mean - reference) / abs(reference)
            if any(j.state == "diverged" for j in stage_jobs):
                verdict = "diverged"
            elif loss.mean is None:
                verdict = "no data"
            elif change is not None and change > threshold:
                verdict = "degraded"
            elif change is None:
                verdict = "no reference"
            else:
                verdict = "ok"
            stages.append(StageResult(stage, stage_jobs, loss, reference, change, verdict))
            if loss.mean is not None:
                reference = loss.mean
        out.append(FormatAttribution(fmt, opt, fp32_ref, tuple(stages)))
    return out


def _quantized(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, dict):
        return _quantized(value["format"]) if "format" in value else bool(value)
    return str(value).strip().lower() not in _UNQUANTIZED

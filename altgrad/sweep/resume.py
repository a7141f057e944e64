"""``+resume_sweep=true``: a rerun of a sweep skips every job whose earlier run in the same job dir finished.

Finished means summary.json says ``completed`` or ``diverged`` (both are results: a deterministic rerun of a
diverged job diverges again). A job that did not finish but left ``checkpoints/last.ckpt`` — interrupted (SIGTERM,
SIGINT, SIGUSR1/2), failed, or killed without a summary (SIGKILL, a lost node) — resumes in place from it; a job
with no checkpoint (never started, or stopped before its first one) runs from the start. The same holds for a
single run given a fixed ``hydra.run.dir`` (the requeue recipe in docs/faults.md).

A job dir holding a run of a *different* configuration is refused (``ResumeRefused``), never overwritten, and the
sweep stops there: a rerun must use the same sweep folder (``hydra.sweep.dir=multirun/NAME/DATE/TIME``) and the same
grid values (job dirs are named by them). Keys that only say where things are written (the sweep folder, logger
paths) never count, so a moved sweep folder resumes.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from altgrad.config import ConfigError
from altgrad.resume_check import flatten

FINISHED = ("completed", "diverged")
SUMMARY = "summary.json"
# Config keys that say where and how a run is stored or shown, not what it computes (format.label: the name a run
# records for its format option, e.g. bf16_ref; runs recorded before it existed have none).
# A tuned-lr table is not identity either: the lrs a run takes from it are in optimizer.lr and baseline.lr.
NOT_IDENTITY = ("paths", "resume_sweep", "resume_with_new_config", "ckpt_path", "run_name", "format.label",
                "data.cache_dir", "trainer.progress_refresh", "tuned_lr", "logger.*.save_dir", "logger.*.dir",
                "quant.kernel",      # how quantizer calls run, the same bits on every road
                "trainer.profiler")  # Lightning's profiler only times the hooks


def _identity(config: dict[str, Any]) -> dict[str, Any]:
    """The flattened config without the keys of NOT_IDENTITY (and anything below them)."""
    return {k: v for k, v in flatten(config).items()
            if not any(fnmatch.fnmatchcase(k, skip) or fnmatch.fnmatchcase(k, skip + ".*") for skip in NOT_IDENTITY)}


def config_differences(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key: stored → current` for every identity key whose value differs (lists compared whole), sorted."""
    a, b = _identity(stored), _identity(current)
    return [f"{k}: {a.get(k)!r} → {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _read_summary(cfg: DictConfig) -> tuple[Path, dict[str, Any] | None]:
    path = Path(cfg.paths.output_dir) / SUMMARY
    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return path, None  # no summary (never ran, killed) or a broken one
    return path, summary if isinstance(summary, dict) else None


class ResumeRefused(ConfigError):
    """+resume_sweep=true met a job dir holding a run of another configuration: that job, and the sweep, stop."""


def _check_same(path: Path, what: str, stored: Any, cfg: DictConfig) -> None:
    current = OmegaConf.to_container(cfg, resolve=True)
    differences = config_differences(stored, current) if isinstance(stored, dict) else ["it records no config"]
    if differences:
        shown = "; ".join(differences[:3]) + (f"; … ({len(differences)} keys)" if len(differences) > 3 else "")
        raise ResumeRefused(f"resume_sweep: {path} holds {what} of another configuration ({shown}); nothing was "
                            "changed and no further job started; rerun the same grid in the same hydra.sweep.dir, "
                            "or give a new sweep dir")


@dataclass(frozen=True)
class ResumePoint:
    """A job dir whose unfinished run continues from its checkpoint, and how that run ended."""

    job_dir: Path
    how: str  # "was interrupted (SIGTERM at step 57)", "failed (…)", "ended without a summary (killed)"


def unfinished_run(cfg: DictConfig) -> ResumePoint | None:
    """When ``resume_sweep`` is set (and no ``ckpt_path``): this job's dir, if its earlier run did not finish but
    left a checkpoint, else None. Raises ResumeRefused when that run had another configuration."""
    if not cfg.get("resume_sweep") or cfg.get("ckpt_path"):
        return None
    job_dir = Path(cfg.paths.output_dir)
    checkpoint = job_dir / "checkpoints" / "last.ckpt"
    if not checkpoint.is_file():
        return None
    path, summary = _read_summary(cfg)
    status = summary.get("status") if summary is not None else None
    if status in FINISHED:
        return None  # skip_finished's business
    if status == "interrupted":
        how = f"was interrupted ({summary.get('interrupted_by')} at step {summary.get('steps')})"
    elif status == "failed":
        how = f"failed ({str(summary.get('error'))[:120]})"
    else:
        how = "ended without a summary (killed)"
    stored = summary.get("config") if summary is not None else None
    if not isinstance(stored, dict):  # killed: the checkpoint records the configuration it was trained under
        from altgrad.resume_check import RECORD, read_checkpoint

        record = read_checkpoint(checkpoint).get(RECORD)
        stored = record.get("config") if isinstance(record, dict) else None
    _check_same(path if summary is not None else checkpoint, "an unfinished run", stored, cfg)
    return ResumePoint(job_dir, how)


def finished_run(cfg: DictConfig) -> dict[str, Any] | None:
    """The summary of this job's finished earlier run when ``resume_sweep`` is set, else None (run the job).

    Raises ResumeRefused (a ConfigError) when the job dir holds a finished run of another configuration.
    """
    if not cfg.get("resume_sweep"):
        return None
    path, summary = _read_summary(cfg)
    if summary is None or summary.get("status") not in FINISHED:
        return None
    _check_same(path, f"a {summary.get('status')} run", summary.get("config"), cfg)
    return summary


def skip_finished(cfg: DictConfig) -> bool:
    """True (and one line on stdout) when ``resume_sweep`` is set and this job already finished: skip it."""
    summary = finished_run(cfg)
    if summary is None:
        return False
    print(f"resume_sweep: {cfg.paths.output_dir} already {summary['status']}; skipped", flush=True)
    return True

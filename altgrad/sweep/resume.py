"""``+resume_sweep=true``: a rerun of a sweep skips every job whose earlier run in the same job dir finished.

Finished means summary.json says ``completed`` or ``diverged`` (both are results: a deterministic rerun of a
diverged job diverges again). A job that failed, was killed, or never started runs again. A job dir holding a
finished run of a *different* configuration is an error for that job, never overwritten: a rerun must use the same
sweep folder (``hydra.sweep.dir=multirun/NAME/DATE/TIME``) and the same grid values (job dirs are named by them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from altgrad.config import ConfigError

FINISHED = ("completed", "diverged")
SUMMARY = "summary.json"
# Config keys that say where and how a run is stored or shown, not what it computes.
# A tuned-lr table is not identity either: the lrs a run takes from it are in optimizer.lr and baseline.lr.
NOT_IDENTITY = ("paths", "resume_sweep", "run_name", "data.cache_dir", "trainer.progress_refresh", "tuned_lr")


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def _identity(config: dict[str, Any]) -> dict[str, Any]:
    """The flattened config without the keys of NOT_IDENTITY (and anything below them)."""
    return {k: v for k, v in _flatten(config).items()
            if not any(k == skip or k.startswith(skip + ".") for skip in NOT_IDENTITY)}


def config_differences(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key: stored → current` for every identity key whose value differs (lists compared whole), sorted."""
    a, b = _identity(stored), _identity(current)
    return [f"{k}: {a.get(k)!r} → {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def finished_run(cfg: DictConfig) -> dict[str, Any] | None:
    """The summary of this job's finished earlier run when ``resume_sweep`` is set, else None (run the job).

    Raises ConfigError (a ValueError) when the job dir holds a finished run of another configuration.
    """
    if not cfg.get("resume_sweep"):
        return None
    path = Path(cfg.paths.output_dir) / SUMMARY
    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # no summary (never ran, killed) or a broken one: run again
    if not isinstance(summary, dict) or summary.get("status") not in FINISHED:
        return None
    stored = summary.get("config")
    current = OmegaConf.to_container(cfg, resolve=True)
    differences = config_differences(stored, current) if isinstance(stored, dict) else ["summary has no config"]
    if differences:
        shown = "; ".join(differences[:3]) + (f"; … ({len(differences)} keys)" if len(differences) > 3 else "")
        raise ConfigError(f"resume_sweep: {path} holds a finished run of another configuration ({shown}); "
                         "rerun the same grid in the same hydra.sweep.dir, or give a new sweep dir")
    return summary


def skip_finished(cfg: DictConfig) -> bool:
    """True (and one line on stdout) when ``resume_sweep`` is set and this job already finished: skip it."""
    summary = finished_run(cfg)
    if summary is None:
        return False
    print(f"resume_sweep: {cfg.paths.output_dir} already {summary['status']}; skipped", flush=True)
    return True

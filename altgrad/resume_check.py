"""What `ckpt_path` may resume: a readable AltGrad checkpoint, short of `trainer.max_steps`, trained under the same
configuration of everything that shapes its state (model, format, layer map, storage, optimizer, data stream).

Keys that only say where things are written or how they are shown never count, so a moved run or sweep resumes.
`+resume_with_new_config=true` resumes under a different configuration on purpose (fine-tuning in another format,
say): summary.json then records the checkpoint's configuration beside the new one. Every problem is one line.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import pickle
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from altgrad.config import ConfigError

log = logging.getLogger(__name__)
RECORD = "altgrad"  # the checkpoint key LastCheckpoint writes: {"config": resolved config}
# What shapes a checkpoint's state; everything else (steps, intervals, paths, loggers, callbacks) may change.
STATE_KEYS = ("seed", "model", "format", "layer_map", "quant.master", "quant.storage_rounding", "optimizer", "data",
              "trainer.accumulate_grad_batches")
# Below STATE_KEYS, keys that say where data is cached or how it is loaded, not what it is, or how a run is named;
# quant.kernel: how quantizer calls run (every road gives the same bits).
NOT_STATE = ("data.cache_dir", "data.num_workers", "format.label", "quant.kernel")
# Keys added after records were written, with the value a record without them ran and the optimizers it applies to
# (None: every run; optimizer.kernel: the compiled step was the only one outside tests; trainer.compile_mode:
# torch.compile's default mode); a stored config lacking them compares as if it had that value.
LATER_KEYS = {"optimizer.kernel": ("compiled", ("ManifoldAdamW", "RelativeAdamW", "GridOptim")),
              "trainer.compile_mode": ("default", None)}
# Values that run the same arithmetic, compared as one: the native step and ``auto`` (native or compiled) give the
# compiled step's bits (tests/optim/test_native_step.py); ``eager`` differs in float32 rounding.
SAME_BITS = {"optimizer.kernel": {"auto": "compiled", "native": "compiled"}}
OVERRIDE = "resume_with_new_config"
# The model's tensor shapes (and what the weights mean): never overridable, the weights would not fit.
SHAPE_KEYS = ("model.block_size", "model.vocab_size", "model.n_layer", "model.n_head", "model.n_embd", "model.bias")


class CheckpointError(ConfigError):
    """A checkpoint that cannot be resumed; the message is one line naming the file and what to do."""


@dataclass
class ResumePlan:
    """What a resume will do: the checkpoint's step, and how its configuration differs from this run's."""

    path: Path
    step: int
    stored_config: dict[str, Any] | None
    differences: list[str] = field(default_factory=list)
    optimizer_changed: bool = False
    metrics_rows: int | None = None  # metrics.csv rows written when it was saved


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as {"dotted.key": leaf}, the form both resume checks compare (LATER_KEYS filled in, SAME_BITS
    values named by the one they equal)."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        if not prefix:
            target = str(out.get("optimizer._target_", "")).rsplit(".", 1)[-1]
            for key, (value, targets) in LATER_KEYS.items():
                if key not in out and (targets is None or target in targets):
                    out[key] = value
            for key, same in SAME_BITS.items():
                if key in out and out[key] in same:
                    out[key] = same[out[key]]
        return out
    return {prefix[:-1]: node}


def state_config(config: dict[str, Any]) -> dict[str, Any]:
    """The flattened keys of `config` that shape a checkpoint's state (STATE_KEYS minus NOT_STATE)."""
    def counts(key: str) -> bool:
        inside = any(key == k or key.startswith(k + ".") for k in STATE_KEYS)
        return inside and not any(fnmatch.fnmatch(key, k) or key.startswith(k + ".") for k in NOT_STATE)

    return {k: v for k, v in flatten(config).items() if counts(k)}


def config_differences(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key: stored → current` for each state key that differs, sorted."""
    a, b = state_config(stored), state_config(current)
    missing = object()
    return [f"{k}: {a.get(k, '<absent>')!r} → {b.get(k, '<absent>')!r}" for k in sorted(set(a) | set(b))
            if a.get(k, missing) != b.get(k, missing)]


def read_checkpoint(path: str | os.PathLike, key: str = "ckpt_path") -> dict[str, Any]:
    """Load a checkpoint's tensors and plain containers (memory-mapped, never unpickling code); one-line errors."""
    import torch

    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as err:
        raise CheckpointError(f"{key}={str(path)!r} cannot be read ({err.strerror})") from None
    if size == 0:
        raise CheckpointError(f"{key}={str(path)!r} is an empty file (0 bytes), not a checkpoint; give another "
                              "checkpoint, or drop ckpt_path to start fresh")
    try:
        checkpoint = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        # weights_only refused an object: AltGrad checkpoints hold tensors and plain containers only.
        raise CheckpointError(f"{key}={str(path)!r} holds Python objects beyond tensors and plain containers, which "
                              "AltGrad checkpoints never do; not loaded (unpickling it could run code)") from None
    except (RuntimeError, OSError, EOFError, ValueError, zipfile.BadZipFile, KeyError, AttributeError) as err:
        raise CheckpointError(f"{key}={str(path)!r} is not a readable PyTorch checkpoint (corrupt, truncated or "
                              f"another kind of file: {type(err).__name__}); give another checkpoint, or drop "
                              "ckpt_path to start fresh") from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict) \
            or "global_step" not in checkpoint or "optimizer_states" not in checkpoint:
        raise CheckpointError(f"{key}={str(path)!r} is not an AltGrad training checkpoint (no model state, step "
                              "and optimizer state); give checkpoints/last.ckpt of an AltGrad run")
    return checkpoint


def plan_resume(path: str | os.PathLike, current: dict[str, Any], max_steps: int) -> ResumePlan:
    """Check `path` against this run's resolved config; raise CheckpointError (one line) when it cannot resume."""
    checkpoint = read_checkpoint(path)
    step = int(checkpoint["global_step"])
    record = checkpoint.get(RECORD)
    stored = record.get("config") if isinstance(record, dict) else None
    plan = ResumePlan(Path(path), step, stored if isinstance(stored, dict) else None)
    if isinstance(record, dict) and isinstance(record.get("metrics_rows"), int):
        plan.metrics_rows = record["metrics_rows"]
    if plan.stored_config is None:
        log.warning("%s records no configuration (an older AltGrad checkpoint): resuming without the configuration "
                    "check", path)
    else:
        _compare(plan, current)
    # A run interrupted after its last step (before its final validation) is finished by resuming it: no steps left.
    if step > max_steps or (step == max_steps and not unfinished(Path(path))):
        raise CheckpointError(f"ckpt_path={str(path)!r} is at step {step}, which already reaches trainer.max_steps="
                              f"{max_steps}: nothing to train; set trainer.max_steps above {step} to continue it")
    return plan


def unfinished(checkpoint: Path) -> bool:
    """Whether `checkpoint` is the last.ckpt of a run dir whose run has no result yet (interrupted, failed or killed:
    its summary.json is not completed or diverged)."""
    import json

    if checkpoint.name != "last.ckpt" or checkpoint.parent.name != "checkpoints":
        return False
    try:
        summary = json.loads((checkpoint.parent.parent / "summary.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return True  # killed before it wrote a summary
    return not isinstance(summary, dict) or summary.get("status") not in ("completed", "diverged")


def _compare(plan: ResumePlan, current: dict[str, Any]) -> None:
    """Fill plan.differences; raise when the model shape differs, or anything differs without the override."""
    path = plan.path
    plan.differences = config_differences(plan.stored_config, current)
    plan.optimizer_changed = any(d.startswith("optimizer.") for d in plan.differences)
    shape = [d for d in plan.differences if d.split(":", 1)[0] in SHAPE_KEYS]
    if shape:
        raise CheckpointError(f"ckpt_path={str(path)!r} holds another model shape ({'; '.join(shape)}): its weights "
                              "cannot resume this model, with or without +resume_with_new_config; drop ckpt_path to "
                              "start fresh, or resume with the checkpoint's model settings")
    if plan.differences and not current.get(OVERRIDE):
        shown = "; ".join(plan.differences[:4]) + (f"; … ({len(plan.differences)} keys)"
                                                   if len(plan.differences) > 4 else "")
        raise CheckpointError(f"ckpt_path={str(path)!r} was trained with another configuration ({shown}); drop "
                              f"ckpt_path to start fresh, or add +{OVERRIDE}=true to continue it under this one")


def adapt_checkpoint(checkpoint: dict[str, Any], plan: ResumePlan) -> None:
    """Under +resume_with_new_config with another optimizer: its state and the lr schedule start afresh (the old
    optimizer's moments would be read as the new one's, or not fit at all); weights, step and data position stay.
    Under any new configuration the diagnostics instruments start afresh too: their run-level aggregates (update
    sizes, flip means, …) and per-weight histories describe one configuration, so summary.json's diagnostics cover
    the steps run under this one (``diagnostics_from_step``)."""
    if plan.optimizer_changed:
        checkpoint["optimizer_states"] = []
        checkpoint["lr_schedulers"] = []
    if plan.differences:
        states = checkpoint.get("callbacks") or {}
        for key, state in states.items():
            if isinstance(state, dict) and "run_state" in state:  # an Instrument's (altgrad.callbacks.base)
                states[key] = {}

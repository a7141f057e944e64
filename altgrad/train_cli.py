"""The command line of `python -m altgrad.train`: what runs around a run, not the run itself (`altgrad.train`).

Before Hydra starts: the overrides are checked (one readable line, exit 2) and an explicit run dir that is taken is
refused before Hydra writes into it. After a run: the console report, the line an interrupted run ends with and the
command that resumes it. And the filters that keep Lightning's console to what applies to this bench.
"""

from __future__ import annotations

import logging
import shlex
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from altgrad.config import ConfigError, resolve_checkpoint

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


# --- after a run -------------------------------------------------------------------------------------------------
def resume_command(cfg: DictConfig, run_dir: Path) -> str:
    """The command line that resumes this run in its own folder (the same overrides, plus where to resume)."""
    overrides: list[str] = []
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.initialized():
            hc = HydraConfig.get()
            if hc.mode == RunMode.MULTIRUN:
                if COMMAND_ARGS is not None:
                    return sweep_resume_command(COMMAND_ARGS, hc.sweep.dir)
                return (f"rerun the sweep's command with hydra.sweep.dir={shlex.quote(hc.sweep.dir)} "
                        "+resume_sweep=true")
            overrides = [o for o in hc.overrides.task
                         if o.split("=", 1)[0].lstrip("+~") not in ("ckpt_path", "hydra.run.dir")]
    except (ImportError, ValueError):
        pass
    words = ["python", "-m", "altgrad.train", *overrides, f"ckpt_path={run_dir}", f"hydra.run.dir={run_dir}"]
    return " ".join(shlex.quote(w) for w in words)


def console_report(summary: dict[str, Any], run_dir: Path) -> None:
    """The few lines a finished run prints: status, losses, throughput, the sample and where its files are."""
    lines = [f"status: {summary['status']}  steps: {summary['steps']}  wall: {summary['wall_seconds']:.0f} s"]
    for key in ("initial_val_loss", "final_val_loss", "best_val_loss"):
        if summary.get(key) is not None:
            lines.append(f"{key}: {summary[key]:.4f}")
    if summary.get("tokens_per_second"):
        lines.append(f"tokens/s: {summary['tokens_per_second']:.0f}")
    if summary.get("sample"):
        lines.append("sample:\n" + summary["sample"])
    lines.append(f"run dir: {run_dir}")
    print("\n".join(lines), flush=True)


def interrupt_line(summary: dict[str, Any]) -> str:
    """The last line of an interrupted run: where it stopped, what was saved, and the command that continues it."""
    head = f"interrupted by {summary['interrupted_by']} at step {summary['steps']}"
    if summary.get("checkpoint"):
        saved = ("checkpoint saved" if summary["checkpoint_step"] == summary["steps"]
                 else f"last checkpoint at step {summary['checkpoint_step']}")
        return f"{head}; {saved}; resume with: {summary['resume_command']}"
    return f"{head}; nothing trained yet, so no checkpoint: rerun the same command to start again"


# --- Lightning's console -----------------------------------------------------------------------------------------
class _DropTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Tip:" not in record.getMessage()


def quiet_lightning() -> None:
    """Lightning's console lines once (not again through Hydra's root handler), without advertising tips or
    warnings that do not apply to this bench."""
    lightning_logger = logging.getLogger("lightning")
    if lightning_logger.handlers:
        lightning_logger.propagate = False
        for handler in lightning_logger.handlers:
            if not any(isinstance(f, _DropTips) for f in handler.filters):
                handler.addFilter(_DropTips())
    # Our training stream is an endless, resumable IterableDataset built in the main process on purpose.
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*resuming from a checkpoint that ended before the epoch ended.*")
    # The run dir already holds .hydra/ when the CSV logger starts; it only ever writes metrics.csv/hparams.yaml.
    warnings.filterwarnings("ignore", message=r".*Experiment logs directory .* exists and is not empty.*")
    # Lightning 2.6.6's utilities/_pytree.py uses torch's LeafSpec, which torch 2.13 deprecates with a warning:
    # remove this filter once the Lightning in use no longer triggers it.
    warnings.filterwarnings("ignore", message=r".*treespec, LeafSpec.*")


# --- before Hydra ------------------------------------------------------------------------------------------------
# Hydra's flags that take the next word as their value.
_VALUE_FLAGS = ("-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir", "-c", "--cfg", "-p",
                "--package", "--experimental-rerun", "-i", "--info", "-sc", "--shell-completion")


def command_line_problem(args: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """One line for the command-line mistakes Hydra reports badly (a traceback, or a parser message without a hint):
    a config group set to null, and a word that is no override (an unquoted value with a space, split by the shell).
    None when there is none."""
    groups = sorted(p.name for p in conf_dir.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    for k, arg in enumerate(args):
        if arg.startswith("-") or (k > 0 and args[k - 1] in _VALUE_FLAGS):
            continue
        key, sep, value = arg.partition("=")
        if not sep:
            before = args[k - 1] if k > 0 else ""
            if "=" in before and not before.startswith("-"):
                return (f"{arg!r} is not an override (key=value): if it is the rest of {before!r}, a value with a "
                        f"space must be quoted, e.g. {shlex.quote(before + ' ' + arg)}")
            return f"{arg!r} is not an override (key=value) or a flag; e.g. trainer.max_steps=100"
        group = key.lstrip("+")
        if group in groups and value.strip().lower() in ("null", "~", "") \
                and not (conf_dir / group / f"{value.strip()}.yaml").is_file():
            options = sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
            return (f"{group}={value} names no option of the {group} group; valid: {', '.join(options)}"
                    + (" (or leave it out)" if group == "experiment" else ""))
    return None


def check_run_dir(args: list[str]) -> None:
    """A single run with an explicit hydra.run.dir: refuse a folder that is taken before Hydra writes into it."""
    from altgrad.run_dir import EXIT_CODE, RunDirError, probe, writable

    given = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith(("+", "~")))
    sweep = any(a in ("-m", "--multirun") for a in args) or "experiment" in given
    # A sweep's job dirs are checked per job (and +resume_sweep resumes or skips what a folder holds): here only
    # whether the folder, or the default one's root, can be written at all.
    root = given.get("hydra.sweep.dir" if sweep else "hydra.run.dir") or ("multirun" if sweep else "outputs")
    if "${" not in root and not writable(Path(root)):
        key = "hydra.sweep.dir" if sweep else "hydra.run.dir"
        print(f"error: {root} cannot be written (permission denied or not a folder); give a writable {key}",
              file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CODE)
    run_dir = given.get("hydra.run.dir")
    if sweep or any(a.startswith("+resume_sweep=") for a in args) or not run_dir or "${" in run_dir:
        return
    try:
        ckpt = resolve_checkpoint(given["ckpt_path"]) if given.get("ckpt_path") not in (None, "null") else None
    except ConfigError:
        ckpt = None  # reported by train() with the rest of the config
    try:
        probe(Path(run_dir), ckpt)
    except RunDirError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CODE) from None


def sweep_resume_command(args: list[str], sweep_dir: str | Path) -> str:
    """The sweep's command again, in its folder and with +resume_sweep=true (what continues an interrupted sweep)."""
    keep = [a for a in args if a.split("=", 1)[0].lstrip("+~") not in ("hydra.sweep.dir", "resume_sweep")]
    words = ["python", "-m", "altgrad.train", *keep, f"hydra.sweep.dir={sweep_dir}", "+resume_sweep=true"]
    return " ".join(shlex.quote(w) for w in words)


COMMAND_ARGS: list[str] | None = None
"""The command line `cli` runs (None in a process that did not start from it: a parallel launcher's worker)."""


def cli(task: Callable[[], Any], argv: list[str] | None = None) -> None:
    """Check the overrides (one readable line on error, exit 2), then hand over to Hydra (`task`: the Hydra main,
    `altgrad.train.main`, which imports this module: not the other way round). A parallel sweep stopped by a signal
    or a refusal ends here (exit 128 + signal, or 2) once its workers are done."""
    global COMMAND_ARGS
    from altgrad.interrupts import GUARD, RunInterrupted, exit_code, signal_name
    from altgrad.preflight import check_overrides
    from altgrad.run_dir import EXIT_CODE
    from altgrad.sweep import naming, stop  # noqa: F401  (naming registers the job-dir resolver of the sweep configs)

    GUARD.install()  # a signal during start-up ends with one line, not a traceback
    args = sys.argv[1:] if argv is None else argv
    COMMAND_ARGS = list(args)
    multirun = any(a in ("-m", "--multirun") for a in args)
    try:
        message = command_line_problem(args) or check_overrides(args, CONF_DIR)
        if message:
            print(f"error: {message}", file=sys.stderr, flush=True)
            raise SystemExit(2)
        check_run_dir(args)
        task()
    except RunInterrupted as err:
        state = stop.ACTIVE
        stop.finish()
        name = signal_name(err.signum)
        if multirun or state is not None:
            where = state.sweep_dir if state is not None else "<its folder>"
            line = (f"interrupted by {name} outside a job's training: nothing to save there; resume the sweep with: "
                    + sweep_resume_command(args, where))
        else:
            line = f"interrupted by {name} during start-up, before training: nothing to save; rerun to start"
        print(line, file=sys.stderr, flush=True)
        raise SystemExit(exit_code(err.signum)) from None
    except BaseException:
        stop.finish()
        raise
    state = stop.ACTIVE
    outcome = stop.finish()
    if outcome is None:
        return
    kind, signum = outcome
    if kind == stop.REFUSED:
        raise SystemExit(EXIT_CODE)  # the refusing job said why
    print(f"interrupted by {signal_name(signum)}: the sweep's running jobs stopped with their checkpoints and the "
          f"others did not start; resume with: {sweep_resume_command(args, state.sweep_dir)}", file=sys.stderr,
          flush=True)
    raise SystemExit(exit_code(signum))

"""`python -m altgrad.train [overrides]`: a thin Hydra entry point over the plain, testable `train(cfg) -> summary`.

train() validates the config, checks the checkpoint it resumes and claims its run dir, builds data, model, callbacks,
loggers and the Lightning Trainer, fits, and always ends by writing `summary.json` atomically in the run dir (status
completed | diverged | interrupted | failed). Everything it writes goes under `cfg.paths.output_dir` (Hydra's run dir
by default). Heavy libraries load inside the functions that need them, so a mistyped override is reported within a
second, before torch or Lightning is imported. docs/faults.md: interrupts, shared folders, resumes, bad inputs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from altgrad.atomic import write_text
from altgrad.config import ConfigError, RunConfig, resolve_checkpoint, validate
from altgrad.host_memory import keep_freed_memory

if TYPE_CHECKING:
    import lightning as L

    from altgrad.callbacks.fake_quant import FakeQuantCallback
    from altgrad.module import AltGradModule
    from altgrad.resume_check import ResumePlan

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
SUMMARY = "summary.json"


# --- building blocks -------------------------------------------------------------------------------------------
def _instantiate_mapping(node: DictConfig | None) -> list[Any]:
    """Instantiate every `{_target_: ...}` entry of a name -> config mapping, in file order (null entries skipped)."""
    if node is None:
        return []
    out = []
    for _, entry in node.items():
        if isinstance(entry, DictConfig) and "_target_" in entry:
            out.append(hydra.utils.instantiate(entry, _convert_="all"))
    return out


def build_fake_quant(run: RunConfig, run_dir: Path) -> FakeQuantCallback:
    """FakeQuantCallback from the `format`, `layer_map` and `quant` sections (the layer map's own keys as composed)."""
    from altgrad.callbacks.fake_quant import FakeQuantCallback

    q = run.quant
    return FakeQuantCallback(run.composed.format, run.composed.layer_map, master=q.master,
                             storage_rounding=q.storage_rounding, seed=run.seed, run_dir=run_dir, stats=q.stats,
                             kernel=q.kernel)


def build_callbacks(run: RunConfig, run_dir: Path, resume: ResumePlan | None = None) -> list[L.Callback]:
    """Quantization + fingerprint, the configured callbacks (cfg.callbacks, in order), checkpointing, progress bar,
    and the once-per-run console warning about formats that flush or saturate a role."""
    from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar

    from altgrad.checkpoint import LastCheckpoint

    class LossProgressBar(TQDMProgressBar):
        """TQDM bar showing the logged loss and tokens/s (without Lightning's version number)."""

        def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
            items = super().get_metrics(trainer, pl_module)
            items.pop("v_num", None)
            return items

    from altgrad.callbacks.fingerprint import FingerprintCallback
    from altgrad.callbacks.range_warning import RangeWarning

    # Quantization surgery comes first: every other callback sees the quantized model, and (master=none) the
    # weights are back on their grid before any instrument reads them after a step.
    # It also switches the quantizers' statistics on for the steps where a callback reads them (quant.stats=demand).
    callbacks = [build_fake_quant(run, run_dir), FingerprintCallback(),
                 *_instantiate_mapping(run.composed.get("callbacks"))]
    try:  # recorded in every checkpoint, so a resume can check it continues the same configuration
        config = OmegaConf.to_container(run.composed, resolve=True)
    except OmegaConfBaseException:  # e.g. ${hydra:...} outside a Hydra job: checkpoints then record none
        config = None
    callbacks.append(RangeWarning())
    callbacks.append(LastCheckpoint(run_dir / "checkpoints", run.trainer.checkpoint_every_n_steps, config=config,
                                    resume=resume))
    if not any(isinstance(c, ProgressBar) for c in callbacks):
        callbacks.append(LossProgressBar(refresh_rate=run.trainer.progress_refresh))
    return callbacks


def build_loggers(run: RunConfig, run_dir: Path) -> list[Any]:
    """The configured loggers (W&B offline by default); a CSVLogger writing metrics.csv in run_dir is always there."""
    from lightning.pytorch.loggers import CSVLogger

    loggers = _instantiate_mapping(run.composed.get("logger"))
    if not any(isinstance(lg, CSVLogger) for lg in loggers):
        loggers.insert(0, CSVLogger(save_dir=str(run_dir), name="", version=""))
    return loggers


def build_trainer(run: RunConfig, run_dir: Path, callbacks: list[Any], loggers: list[Any]) -> L.Trainer:
    """A Lightning Trainer from the `trainer` group: step-based, validation every N steps, atomic checkpoints."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelSummary

    from altgrad.checkpoint import AtomicCheckpointIO

    t = run.trainer
    return L.Trainer(
        accelerator=t.accelerator,
        devices=t.devices,
        precision=t.precision,
        max_steps=t.max_steps,
        max_epochs=-1,
        val_check_interval=t.val_check_interval,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=-1 if t.initial_validation else 0,
        log_every_n_steps=t.log_every_n_steps,
        gradient_clip_val=t.gradient_clip_val,
        accumulate_grad_batches=t.accumulate_grad_batches,
        deterministic=t.deterministic,
        benchmark=False,
        callbacks=callbacks,
        logger=loggers,
        plugins=[AtomicCheckpointIO()],
        default_root_dir=str(run_dir),
        enable_checkpointing=False,  # LastCheckpoint (always on) writes checkpoints/last.ckpt
        enable_progress_bar=True,
        # Lightning adds its own summary unless a configured callback already is one.
        enable_model_summary=not any(isinstance(c, ModelSummary) for c in callbacks),
    )


def build_module(run: RunConfig, vocab_size: int) -> AltGradModule:
    """The LightningModule: GPT of the `model` group (vocab from the tokenizer unless set), optimizer, schedule."""
    from altgrad.model import GPTConfig
    from altgrad.module import AltGradModule, WarmupCosine

    shape = {k: v for k, v in dataclasses.asdict(run.model).items() if k != "name"}  # every other key: a field
    gpt = GPTConfig(**shape | {"vocab_size": run.model.vocab_size or vocab_size})
    schedule = WarmupCosine(run.schedule.warmup_steps, run.decay_steps, run.schedule.min_lr_ratio)
    optimizer = OmegaConf.to_container(run.composed.optimizer, resolve=True)
    return AltGradModule(gpt, optimizer, schedule, compile=run.trainer.compile, peak_flops=run.trainer.peak_flops)


# --- summary -----------------------------------------------------------------------------------------------------
def base_summary(run: RunConfig) -> dict[str, Any]:
    """The summary fields known before training; train() fills in the results."""
    return {
        "status": "completed",
        "steps": 0,
        "final_val_loss": None,
        "best_val_loss": None,
        "initial_val_loss": None,
        "tokens_per_second": None,
        "wall_seconds": None,
        "seed": run.seed,
        "format": run.format_label,
        "optimizer": run.optimizer.name,
        "optimizer_label": run.optimizer_label,
        "layer_map": run.layer_map.name,
        "model": run.model.name,
        "data": run.data.name,
        "lr": float(run.optimizer.lr),
        "master": run.quant.master,
        "storage_rounding": run.quant.storage_rounding,
        "experiment": run.experiment_name,
        "arm": OmegaConf.select(run.composed, "arm"),  # a study arm's name (conf/arm/), else None
        "run_name": run.run_name,
        "diverged_at_step": None,
        "divergence_cause": None,
        "error": None,
        "diagnostics": {},
        "fallbacks": [],
        "config": OmegaConf.to_container(run.composed, resolve=True),
    }


def _plain(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become null (JSON has no NaN), tensors and numpy scalars become numbers."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def write_summary(run_dir: Path, summary: dict[str, Any]) -> Path:
    """Write summary.json atomically: readers see the old file or the whole new one, never half of it."""
    return write_text(run_dir / SUMMARY, json.dumps(_plain(summary), indent=2, allow_nan=False) + "\n")


def _finish_status(summary: dict[str, Any]) -> None:
    """A run that completed with a non-finite validation loss diverged, even if no callback said so."""
    final = summary.get("final_val_loss")
    if summary["status"] == "completed" and final is not None and not math.isfinite(final):
        summary.update(status="diverged", diverged_at_step=summary.get("diverged_at_step") or summary["steps"],
                       divergence_cause=summary.get("divergence_cause") or "non-finite validation loss")


def _sample(module: AltGradModule, tokenizer: Any, n_tokens: int, seed: int) -> str:
    """A short continuation of <|endoftext|>, to see what the model learned."""
    import torch

    model = module.model
    device = next(model.parameters()).device
    start = torch.full((1, 1), tokenizer.eot_token, dtype=torch.long, device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    try:
        out = model.generate(start, n_tokens, generator=generator)
    finally:
        model.train(was_training)
    return tokenizer.decode(out[0, 1:].tolist())


# --- the run -----------------------------------------------------------------------------------------------------
def train(cfg: DictConfig) -> dict[str, Any]:
    """Train one run as configured and return its summary (also written to `<paths.output_dir>/summary.json`).

    Raises ConfigError (a bad config or checkpoint) or RunDirError (the run dir is taken) before writing anything.
    A signal (SIGTERM, SIGINT, SIGUSR1/2) ends the run as status "interrupted" with a checkpoint at the step reached;
    any other failure during the run is recorded as status "failed" with its error in summary.json, then re-raised.
    """
    from altgrad.interrupts import GUARD, RunInterrupted, signal_name
    from altgrad.preflight import check_step_memory
    from altgrad.resume_check import plan_resume
    from altgrad.run_dir import claim, resumes_here

    run = validate(cfg)
    run_dir = run.run_dir
    ckpt_path = str(resolve_checkpoint(run.ckpt_path)) if run.ckpt_path else None
    config = OmegaConf.to_container(cfg, resolve=True)
    plan = plan_resume(ckpt_path, config, run.trainer.max_steps) if ckpt_path else None
    run_claim = claim(run_dir, ckpt_path)
    in_place = resumes_here(run_dir, ckpt_path)
    previous = _previous_summary(run_dir) if in_place else {}
    summary = base_summary(run)
    if plan is not None:
        summary.update(resumed_from=ckpt_path, resumed_at_step=plan.step, resumed_in_place=in_place)
        if plan.differences:
            summary.update(resumed_with_new_config=plan.differences, resumed_from_config=plan.stored_config)
    started = time.perf_counter()
    GUARD.reset()
    installed = GUARD.install()
    trainer = module = None
    try:
        import lightning as L
        import torch

        _quiet_lightning()
        L.seed_everything(run.seed, workers=True, verbose=False)
        torch.set_float32_matmul_precision(run.trainer.matmul_precision)
        if run.trainer.keep_freed_memory:
            keep_freed_memory()
        datamodule = hydra.utils.instantiate(cfg.data, _convert_="all")
        summary["data_files"] = datamodule.data_files  # sha256 of each data file (None: generated or hub data)
        check_step_memory(run, datamodule.vocab_size)
        module = build_module(run, datamodule.vocab_size)
        callbacks = build_callbacks(run, run_dir, resume=plan)
        loggers = build_loggers(run, run_dir)
        if in_place and plan is not None:
            from altgrad.metrics_csv import append_on_resume

            stopped_here = previous.get("status") == "interrupted" and previous.get("steps") == plan.step
            append_on_resume(loggers, run_dir, plan.metrics_rows, None if stopped_here else plan.step)
        trainer = build_trainer(run, run_dir, callbacks, loggers)
        for logger in loggers:
            logger.log_hyperparams(summary["config"])
        if plan is not None and plan.differences:
            module.strict_loading = False  # quantizer buffers of another format are taken fresh
        # weights_only=True: resuming proves the checkpoint holds only plain containers.
        _fit(trainer, module, datamodule, ckpt_path)
        if module.run_summary.get("final_val_step") != trainer.global_step:
            trainer.validate(module, datamodule=datamodule, verbose=False)
        summary["steps"] = int(trainer.global_step)
        summary["n_params"] = module.model.num_params()
        summary.update(module.run_summary)
        _finish_status(summary)
        if run.trainer.sample_tokens and summary["status"] == "completed":
            summary["sample"] = _sample(module, datamodule.tokenizer, run.trainer.sample_tokens, run.seed)
    except RunInterrupted as err:
        signum = GUARD.signum if GUARD.signum is not None else err.signum
        step = int(trainer.global_step) if trainer is not None else 0
        # Normally saved at this very step; after a second signal (stop at once) the last one written before.
        saved = _saved_step(trainer)
        if saved < 0 and in_place and plan is not None:
            saved = plan.step  # this run wrote none yet: the checkpoint it resumed from is still there
        if module is not None:
            summary.update(module.run_summary)
            summary["n_params"] = module.model.num_params()
        summary.update(status="interrupted", steps=step, interrupted_by=signal_name(signum), signal=int(signum),
                       interrupted_at_step=step, checkpoint_step=saved if saved > 0 else None,
                       checkpoint=str(run_dir / "checkpoints" / "last.ckpt") if saved > 0 else None)
        summary["resume_command"] = resume_command(cfg, run_dir) if summary["checkpoint"] else None
    except BaseException as err:
        summary["status"] = "failed"
        summary["error"] = f"{type(err).__name__}: {err}"
        raise
    finally:
        _finish_wandb(failed=summary["status"] in ("failed", "interrupted"))
        summary["wall_seconds"] = time.perf_counter() - started
        write_summary(run_dir, summary)
        run_claim.release()
        GUARD.deferring = False
        if installed:
            GUARD.uninstall()
    return _plain(summary)  # exactly what summary.json holds


def _fit(trainer: L.Trainer, module: AltGradModule, datamodule: Any, ckpt_path: str | None) -> None:
    """trainer.fit, with a checkpoint that does not fit this model (under +resume_with_new_config) as one line."""
    from altgrad.resume_check import CheckpointError

    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    except RuntimeError as err:
        text = str(err)
        if ckpt_path and trainer.global_step == 0 and "Error(s) in loading state_dict" in text:
            detail = " ".join(line.strip() for line in text.splitlines()[1:3])
            raise CheckpointError(f"ckpt_path={ckpt_path!r} does not fit this model ({detail[:300]}); the model "
                                  "shape must match to resume, even with +resume_with_new_config") from None
        raise


def _previous_summary(run_dir: Path) -> dict[str, Any]:
    try:
        previous = json.loads((run_dir / SUMMARY).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return previous if isinstance(previous, dict) else {}


def _saved_step(trainer: Any) -> int:
    if trainer is None:
        return -1
    from altgrad.checkpoint import LastCheckpoint

    for callback in getattr(trainer, "callbacks", None) or []:
        if isinstance(callback, LastCheckpoint):
            return callback.saved_at
    return -1


def resume_command(cfg: DictConfig, run_dir: Path) -> str:
    """The command line that resumes this run in its own folder (the same overrides, plus where to resume)."""
    import shlex

    overrides: list[str] = []
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.initialized():
            hc = HydraConfig.get()
            if hc.mode == RunMode.MULTIRUN:
                return (f"rerun the sweep's command with hydra.sweep.dir={shlex.quote(hc.sweep.dir)} "
                        "+resume_sweep=true")
            overrides = [o for o in hc.overrides.task
                         if o.split("=", 1)[0].lstrip("+~") not in ("ckpt_path", "hydra.run.dir")]
    except (ImportError, ValueError):
        pass
    words = ["python", "-m", "altgrad.train", *overrides, f"ckpt_path={run_dir}", f"hydra.run.dir={run_dir}"]
    return " ".join(shlex.quote(w) for w in words)


def _finish_wandb(failed: bool) -> None:
    """Close the W&B run, so the next job of a multirun starts its own."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish(exit_code=1 if failed else 0)


class _DropTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Tip:" not in record.getMessage()


def _quiet_lightning() -> None:
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


def _report(summary: dict[str, Any], run_dir: Path) -> None:
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


# --- command line ------------------------------------------------------------------------------------------------
@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> None:
    """Hydra task: one job of `python -m altgrad.train` (or of a `-m` multirun)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from altgrad.data.sources import DataUnavailableError
    from altgrad.interrupts import GUARD, exit_code
    from altgrad.quant.layer_map import LayerMapError
    from altgrad.run_dir import EXIT_CODE, RunDirError
    from altgrad.sweep.resume import interrupted_run, skip_finished

    try:
        if skip_finished(cfg):  # +resume_sweep=true: this job finished in an earlier run of the same sweep
            return
        resume_dir = interrupted_run(cfg)  # +resume_sweep=true: this job was interrupted; continue it in place
        if resume_dir is not None:
            print(f"resume_sweep: {resume_dir} was interrupted; resuming it from its checkpoint", flush=True)
            cfg.ckpt_path = str(resume_dir)
        summary = train(cfg)
    except (ConfigError, DataUnavailableError, LayerMapError, RunDirError) as err:
        # Known, user-fixable problems: one line, no traceback. A multirun re-raises so the other jobs go on and
        # Hydra reports the failure at the end.
        print(f"error: {err}", file=sys.stderr, flush=True)
        if HydraConfig.get().mode == RunMode.RUN:
            raise SystemExit(EXIT_CODE if isinstance(err, RunDirError) else 1) from None
        raise
    _report(summary, Path(cfg.paths.output_dir))
    if summary["status"] == "interrupted":
        # A result, like a divergence, but the process ends as the signal asked (128 + signal): a scheduler can
        # requeue it and a sweep stops here.
        print(_interrupt_line(summary), file=sys.stderr, flush=True)
        forward = GUARD.handler_before(summary["signal"])
        if forward is not None:  # e.g. submitit's requeue on its timeout signal, now that the checkpoint is saved
            forward(summary["signal"], None)
        raise SystemExit(exit_code(summary["signal"]))


def _interrupt_line(summary: dict[str, Any]) -> str:
    head = f"interrupted by {summary['interrupted_by']} at step {summary['steps']}"
    if summary.get("checkpoint"):
        saved = ("checkpoint saved" if summary["checkpoint_step"] == summary["steps"]
                 else f"last checkpoint at step {summary['checkpoint_step']}")
        return f"{head}; {saved}; resume with: {summary['resume_command']}"
    return f"{head}; nothing trained yet, so no checkpoint: rerun the same command to start again"


def _check_run_dir(args: list[str]) -> None:
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


def cli(argv: list[str] | None = None) -> None:
    """Check the overrides (one readable line on error, exit 2), then hand over to Hydra."""
    from altgrad.interrupts import GUARD, RunInterrupted, exit_code, signal_name
    from altgrad.preflight import check_overrides

    GUARD.install()  # a signal during start-up ends with one line, not a traceback
    args = sys.argv[1:] if argv is None else argv
    try:
        message = check_overrides(args, CONF_DIR)
        if message:
            print(f"error: {message}", file=sys.stderr, flush=True)
            raise SystemExit(2)
        _check_run_dir(args)
        main()
    except RunInterrupted as err:
        name = signal_name(err.signum)
        if any(a in ("-m", "--multirun") for a in args):
            line = (f"interrupted by {name} outside a job's training: nothing to save there; resume the sweep with "
                    "hydra.sweep.dir=<its folder> +resume_sweep=true")
        else:
            line = f"interrupted by {name} during start-up, before training: nothing to save; rerun to start"
        print(line, file=sys.stderr, flush=True)
        raise SystemExit(exit_code(err.signum)) from None


if __name__ == "__main__":
    cli()

"""The run: `train(cfg) -> summary` (plain and testable) and `main`, the Hydra task of `python -m altgrad.train`.

train() validates the config, checks the checkpoint it resumes and claims its run dir, builds data, model, callbacks,
loggers and the Lightning Trainer, fits, and always ends by writing `summary.json` atomically in the run dir (status
completed | diverged | interrupted | failed). Everything it writes goes under `cfg.paths.output_dir` (Hydra's run dir
by default). Heavy libraries load inside the functions that need them, so a mistyped override is reported within a
second, before torch or Lightning is imported. The command line around it (pre-checks, console report, resume command,
log filters) is `altgrad.train_cli`. docs/faults.md: interrupts, shared folders, resumes, bad inputs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from altgrad import peak_flops
from altgrad.atomic import write_text
from altgrad.config import ConfigError, RunConfig, resolve_checkpoint, validate
from altgrad.errors import STORAGE_ERRNOS, StorageError
from altgrad.host_memory import keep_freed_memory

if TYPE_CHECKING:
    import lightning as L

    from altgrad.callbacks.fake_quant import FakeQuantCallback
    from altgrad.module import AltGradModule
    from altgrad.resume_check import ResumePlan

SUMMARY = "summary.json"
log = logging.getLogger(__name__)


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


PROFILE_ACTIVE = 20  # trainer.profiler=pytorch: the training steps it records, after two warm-up steps


def build_profiler(kind: str | None, run_dir: Path, max_steps: int = 0) -> Any:
    """Lightning's profiler of ``trainer.profiler`` (None: off), writing its report to ``run_dir/fit-profile.txt``.

    ``pytorch`` records PROFILE_ACTIVE training steps from the middle of the run (past the compiles), CPU and, on a
    GPU, CUDA activity, with no per-module hooks (they would split a compiled graph); its table is sorted by device
    time on a GPU (where a step's time goes: kernels or the host), CPU time elsewhere, with the self columns too."""
    if kind is None:
        return None
    from lightning.pytorch.profilers import AdvancedProfiler, PyTorchProfiler, SimpleProfiler

    if kind == "pytorch":
        import torch

        cuda = torch.cuda.is_available()
        activities = [torch.profiler.ProfilerActivity.CPU] + [torch.profiler.ProfilerActivity.CUDA] * cuda
        schedule = torch.profiler.schedule(skip_first=max(0, max_steps // 2 - 2), wait=0, warmup=2,
                                           active=PROFILE_ACTIVE, repeat=1)
        return PyTorchProfiler(dirpath=str(run_dir), filename="profile", export_to_chrome=False,
                               record_module_names=False, row_limit=60,
                               sort_by_key="cuda_time_total" if cuda else "cpu_time_total",
                               schedule=schedule, activities=activities, acc_events=True)
    profiler = {"simple": SimpleProfiler, "advanced": AdvancedProfiler}[kind]
    return profiler(dirpath=str(run_dir), filename="profile")


def _unprofile_after_fit(trainer: L.Trainer) -> None:
    """Leave the closing validation out of a ``pytorch`` profile: Lightning's PyTorchProfiler fails a second stage
    once its schedule has run (torch's profiler is gone by then), and the profile is of training steps anyway."""
    from lightning.pytorch.profilers import PassThroughProfiler, PyTorchProfiler

    if isinstance(trainer.profiler, PyTorchProfiler):
        trainer.profiler = PassThroughProfiler()


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
        profiler=build_profiler(t.profiler, run_dir, t.max_steps),
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
    peak, source = peak_flops.resolve(run.trainer.peak_flops, run.trainer.precision, cuda_device_name(run))
    if run.trainer.peak_flops is not None:
        log.info("MFU peak: %s", source)
    module = AltGradModule(gpt, optimizer, schedule, compile=run.trainer.compile, peak_flops=peak,
                           compile_mode=run.trainer.compile_mode)
    module.run_summary["peak_flops"] = {"flops": peak, "source": source}
    return module


def cuda_device_name(run: RunConfig) -> str | None:
    """The name of the CUDA GPU this run trains on, or None on the CPU."""
    import torch

    if run.trainer.accelerator == "cpu" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(torch.cuda.current_device())


# --- summary -----------------------------------------------------------------------------------------------------
def base_summary(run: RunConfig) -> dict[str, Any]:
    """The summary fields known before training; train() fills in the results. `format` names the grid the run
    trains on (`format=e4m3 format.mbits=20` runs e4m20: altgrad.quant.layer_map.custom_grid_name), else the
    format option's label (bf16_ref)."""
    from altgrad.quant.layer_map import custom_grid_name

    return {
        "status": "completed",
        "steps": 0,
        "final_val_loss": None,
        "best_val_loss": None,
        "initial_val_loss": None,
        "tokens_per_second": None,
        "wall_seconds": None,
        "seed": run.seed,
        "format": custom_grid_name(run.composed.format) or run.format_label,
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


def _sample(module: AltGradModule, tokenizer: Any, n_tokens: int, seed: int, device: Any) -> str:
    """A short continuation of <|endoftext|>, to see what the model learned, on the training ``device``.

    Lightning's teardown leaves the module on the CPU after fit; a GPU job samples on its GPU, not on the CPU (where
    a quantized 50 M model took 78 s for 200 tokens on an H200 machine's host)."""
    import torch

    model = module.model.to(device)
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
def check_device(run: RunConfig) -> None:
    """ConfigError (one line) when the trainer asks for a device this machine does not have."""
    import torch

    accelerator = str(run.trainer.accelerator).lower()
    if accelerator not in ("gpu", "cuda"):
        return
    if not torch.cuda.is_available():
        why = ("this torch is built without CUDA" if torch.version.cuda is None
               else "torch sees no CUDA device on this machine")
        raise ConfigError(f"trainer.accelerator={accelerator!r} needs a CUDA GPU, and {why}; valid here: trainer=cpu")
    devices = run.trainer.devices
    if isinstance(devices, int) and devices > torch.cuda.device_count():
        raise ConfigError(f"trainer.devices={devices} but this machine has {torch.cuda.device_count()} CUDA "
                          f"device(s); valid: an integer in 1..{torch.cuda.device_count()} or 'auto'")


def check_vocab(run: RunConfig, tokenizer_vocab: int) -> None:
    """ConfigError (one line) when model.vocab_size leaves token ids of the tokenizer without an embedding row."""
    size = run.model.vocab_size
    if size is not None and size < tokenizer_vocab:
        raise ConfigError(f"model.vocab_size={size} is smaller than the vocabulary of data.tokenizer="
                          f"{run.data.tokenizer} ({tokenizer_vocab} token ids): ids ≥ {size} would have no embedding; "
                          f"valid: null (the tokenizer's size) or an integer ≥ {tokenizer_vocab}")


def prepare(run: RunConfig, cfg: DictConfig) -> Any:
    """What a run needs before it writes anything: torch and Lightning set up, the data module built, and the checks
    that need them (device, vocabulary, memory). Returns the data module; a problem raises ConfigError or
    DataUnavailableError (one line) with nothing of the run written."""
    import lightning as L
    import torch

    from altgrad.preflight import check_step_memory
    from altgrad.train_cli import quiet_lightning

    quiet_lightning()
    check_device(run)
    L.seed_everything(run.seed, workers=True, verbose=False)
    torch.set_float32_matmul_precision(run.trainer.matmul_precision)
    if run.trainer.keep_freed_memory:
        keep_freed_memory()
    datamodule = hydra.utils.instantiate(cfg.data, _convert_="all")
    if hasattr(datamodule, "prepare_data"):
        datamodule.prepare_data()  # tokens cached (or a data problem said) before the run writes anything
    check_vocab(run, datamodule.vocab_size)
    check_step_memory(run, datamodule.vocab_size)
    return datamodule


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train one run as configured and return its summary (also written to `<paths.output_dir>/summary.json`).

    Every check comes before the first write: a bad config, checkpoint or data (ConfigError, DataUnavailableError) or
    a taken run dir (RunDirError) leaves every existing file as it was. A signal (SIGTERM, SIGINT, SIGUSR1/2) ends the
    run as status "interrupted" with a checkpoint at the step reached; a file that cannot be written (a full disk)
    is recorded as status "failed" and raised as StorageError (one line); any other failure is recorded as "failed"
    with its error in summary.json, then re-raised.
    """
    from altgrad.interrupts import GUARD, RunInterrupted, signal_name
    from altgrad.provenance import code_state
    from altgrad.resume_check import plan_resume
    from altgrad.run_dir import claim, record_job, resumes_here
    from altgrad.train_cli import resume_command

    run = validate(cfg)
    run_dir = run.run_dir
    ckpt_path = str(resolve_checkpoint(run.ckpt_path)) if run.ckpt_path else None
    config = OmegaConf.to_container(cfg, resolve=True)
    plan = plan_resume(ckpt_path, config, run.trainer.max_steps) if ckpt_path else None
    code = code_state()
    GUARD.reset()
    installed = GUARD.install()
    run_claim = None
    try:
        run_claim = claim(run_dir, ckpt_path)
        if run_claim.fresh:
            record_job(run_dir, cfg)  # a new folder says at once what it is for, even if a check below refuses it
        datamodule = prepare(run, cfg)
    except BaseException as err:
        if run_claim is not None:
            if run_claim.fresh:  # the folder is this run's own: say what stopped it (a report lists it as such)
                _record_start_failure(run, run_dir, code, err)
            run_claim.release()
        if installed:
            GUARD.uninstall()
        if isinstance(err, OSError) and err.errno in STORAGE_ERRNOS:  # e.g. the token cache on a full disk
            where = f" {err.filename}" if err.filename else " a file"
            raise StorageError(f"cannot write{where} ({err.strerror}) while preparing the run; nothing of the run "
                               "was written: free the disk (or make the folder writable) and rerun") from None
        raise
    # From here the folder is this run's: its record is written, whatever happens.
    run_claim.commit()
    if not run_claim.fresh:
        record_job(run_dir, cfg)
    in_place = resumes_here(run_dir, ckpt_path)
    previous = _previous_summary(run_dir) if in_place else {}
    summary = base_summary(run)
    summary["code"] = code
    data_files = getattr(datamodule, "data_files", None)  # sha256 of each data file (None: generated or hub data)
    summary["data_files"] = dict(data_files) if isinstance(data_files, dict) else None
    if plan is not None:
        summary.update(resumed_from=ckpt_path, resumed_at_step=plan.step, resumed_in_place=in_place)
        if plan.differences:
            summary.update(resumed_with_new_config=plan.differences, resumed_from_config=plan.stored_config,
                           diagnostics_from_step=plan.step)  # the instruments start afresh (adapt_checkpoint)
    started = time.perf_counter()
    trainer = module = None
    failure: BaseException | None = None
    try:
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
        validated = module.run_summary.get("final_val_step") == trainer.global_step
        if GUARD.requested and not validated:
            # A signal during the last step: stop before what is left (the final validation), with the checkpoint
            # of that step; the resume command runs just that.
            raise RunInterrupted(GUARD.signum)
        if not validated:
            _unprofile_after_fit(trainer)
            trainer.validate(module, datamodule=datamodule, verbose=False)
        summary["steps"] = int(trainer.global_step)
        summary["n_params"] = module.model.num_params()
        summary.update(module.run_summary)
        _finish_status(summary)
        if run.trainer.sample_tokens and summary["status"] == "completed" and not GUARD.requested:
            try:
                summary["sample"] = _sample(module, datamodule.tokenizer, run.trainer.sample_tokens, run.seed,
                                            trainer.strategy.root_device)
            except RunInterrupted:
                pass  # the run is complete: a signal only cut its sample short
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
        if trainer is not None:
            summary["steps"] = int(trainer.global_step)
        failure = err
    GUARD.deferring = False
    _finish_wandb(failed=summary["status"] in ("failed", "interrupted"))
    summary["wall_seconds"] = time.perf_counter() - started
    try:
        write_summary(run_dir, summary)
        unwritten = None
    except OSError as err:
        unwritten = err
    finally:
        run_claim.release()
        if installed:
            GUARD.uninstall()
    if isinstance(failure, OSError) and failure.errno in STORAGE_ERRNOS:
        raise StorageError(_storage_line(failure, summary["steps"], run_dir, unwritten)) from None
    if failure is not None:
        raise failure
    if unwritten is not None:
        raise StorageError(f"run dir {run_dir}: summary.json cannot be written ({unwritten.strerror}): the run "
                           f"{summary['status']} at step {summary['steps']} but its record is lost; free the disk "
                           "(or make the folder writable) and resume or rerun it") from None
    return _plain(summary)  # exactly what summary.json holds


def _record_start_failure(run: RunConfig, run_dir: Path, code: dict[str, Any], err: BaseException) -> None:
    """summary.json of a run stopped before training in a folder of its own: failed with its error, or interrupted
    with nothing trained (so the same command starts it again)."""
    from altgrad.interrupts import RunInterrupted, signal_name

    try:
        summary = base_summary(run)
        summary["code"] = code
        if isinstance(err, RunInterrupted):
            summary.update(status="interrupted", interrupted_by=signal_name(err.signum), signal=int(err.signum),
                           interrupted_at_step=0, checkpoint=None, checkpoint_step=None, resume_command=None)
        else:
            summary.update(status="failed", error=f"{type(err).__name__}: {err}")
        write_summary(run_dir, summary)
    except Exception:  # noqa: BLE001 (a full disk, say: the error being raised still says what stopped the run)
        pass


def _storage_line(err: OSError, step: int, run_dir: Path, unwritten: OSError | None) -> str:
    """One line for a file the run could not write, and what its record says."""
    target = f" {err.filename}" if err.filename else " a file"
    record = ("summary.json records the failure" if unwritten is None
              else f"summary.json could not be written either ({unwritten.strerror})")
    if (run_dir / "checkpoints" / "last.ckpt").is_file():
        then = ("the last checkpoint written before is intact: free the disk (or make the folder writable) and resume "
                f"with ckpt_path={run_dir} hydra.run.dir={run_dir}")
    else:
        then = "no checkpoint was written yet: free the disk (or make the folder writable) and rerun"
    return f"run dir {run_dir}: cannot write{target} at step {step} ({err.strerror}); {record}; {then}"


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


def _finish_wandb(failed: bool) -> None:
    """Close the W&B run, so the next job of a multirun starts its own."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish(exit_code=1 if failed else 0)


# --- the Hydra task ----------------------------------------------------------------------------------------------
@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> None:
    """Hydra task: one job of `python -m altgrad.train` (or of a `-m` multirun)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from altgrad.data.sources import DataUnavailableError
    from altgrad.interrupts import GUARD, RunInterrupted, exit_code, signal_name
    from altgrad.quant.layer_map import LayerMapError
    from altgrad.run_dir import EXIT_CODE, RunDirError
    from altgrad.sweep import stop
    from altgrad.sweep.resume import ResumeRefused, skip_finished, unfinished_run
    from altgrad.train_cli import console_report, interrupt_line

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    # Under a parallel launcher this job runs in a worker process: it must return, never raise SystemExit (the
    # pool would stop every other job), and it stops when the launcher's process is signalled (altgrad.sweep.stop).
    worker = multirun and stop.parallel_launcher(hc.launcher.get("_target_"))
    sweep_dir = Path(str(hc.sweep.dir))
    if worker and not stop.enter_worker(sweep_dir):
        print(f"{hc.runtime.output_dir}: not started: the sweep is stopping", file=sys.stderr, flush=True)
        return
    try:
        if skip_finished(cfg):  # +resume_sweep=true: this job finished in an earlier run of the same sweep
            return
        point = unfinished_run(cfg)  # +resume_sweep=true: this job stopped short with a checkpoint: continue it
        if point is not None:
            print(f"resume_sweep: {point.job_dir} {point.how}; resuming it from its checkpoint", flush=True)
            cfg.ckpt_path = str(point.job_dir)
        summary = train(cfg)
    except ResumeRefused as err:
        # This job's folder holds another configuration's run: it stays as it was, and no further job starts.
        print(f"error: {err}", file=sys.stderr, flush=True)
        if worker:
            stop.refuse_in_worker(sweep_dir)
            return
        stop.note_refused()
        raise SystemExit(EXIT_CODE) from None
    except (ConfigError, DataUnavailableError, LayerMapError, RunDirError, StorageError) as err:
        # Known, user-fixable problems: one line, no traceback. A multirun re-raises so the other jobs go on and
        # Hydra reports the failure at the end.
        print(f"error: {err}", file=sys.stderr, flush=True)
        if not multirun:
            raise SystemExit(EXIT_CODE if isinstance(err, RunDirError) else 1) from None
        raise
    except RunInterrupted as err:
        if not worker:
            raise  # the command line says it (altgrad.train_cli)
        print(f"{hc.runtime.output_dir}: interrupted by {signal_name(err.signum)} before training; nothing to save",
              file=sys.stderr, flush=True)
        return
    console_report(summary, Path(cfg.paths.output_dir))
    if summary["status"] == "interrupted":
        # A result, like a divergence, but the process ends as the signal asked (128 + signal): a scheduler can
        # requeue it and a sweep stops here.
        print(interrupt_line(summary), file=sys.stderr, flush=True)
        forward = GUARD.handler_before(summary["signal"])
        if forward is not None:  # e.g. submitit's requeue on its timeout signal, now that the checkpoint is saved
            forward(summary["signal"], None)
        if worker:
            return  # the launcher's process ends the sweep, once every worker has stopped
        raise SystemExit(exit_code(summary["signal"]))


if __name__ == "__main__":
    from altgrad.train_cli import cli

    cli(main)

"""Structured-config schemas for `conf/train.yaml` and a start-up check that names the bad key, value and valid choices.

Hydra composes plain YAML; `validate(cfg)` merges each section into its dataclass schema (types, unknown keys),
builds the dataclass (ranges and choices in `__post_init__`) and returns them as one `RunConfig`, what `train()`
reads. The schemas hold types and checks, not a second set of defaults: a key every option of a group states is
`???` here (required); only keys some options leave out (the data sources' own keys, optimizer.label) have a value
here, the one that applies when they are absent.
Any problem becomes one `ConfigError` line, e.g. ``trainer.max_steps='abc' is invalid: expected an integer``.
Sections other workers extend (format, layer_map, optimizer, quant) check the keys they rely on and accept extra
ones; what is built from them by `_target_` is built from the composed config (`RunConfig.composed`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigKeyError,
    InterpolationResolutionError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from altgrad.errors import ConfigError


def _choice(key: str, value: Any, valid: typing.Iterable[Any]) -> None:
    valid = list(valid)
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not valid; valid: {', '.join(map(str, valid))}")


def _check(ok: bool, key: str, value: Any, expected: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is invalid: expected {expected}")


def valid_formats() -> list[str]:
    """Preset names `format.name` may take: the quantization presets plus `fp32` (no quantization). Any other name
    is a format of its own, defined by format.ebits, mbits, bias and policy (see FormatSchema)."""
    from altgrad.quant import list_formats

    return sorted(set(list_formats()) | {"fp32"})


def valid_tokenizers() -> list[str]:
    """`bytes` (the built-in byte-level encoding) and every encoding tiktoken knows by name."""
    import tiktoken

    return ["bytes", *sorted(tiktoken.list_encoding_names())]


# --- schemas ---------------------------------------------------------------------------------------------------
@dataclass
class ModelSchema:
    """`model=` group: GPT shape (altgrad.model.GPTConfig's fields); vocab_size null takes the tokenizer's."""

    name: str = MISSING
    block_size: int = MISSING
    vocab_size: Optional[int] = MISSING
    n_layer: int = MISSING
    n_head: int = MISSING
    n_embd: int = MISSING
    dropout: float = MISSING
    bias: bool = MISSING

    def __post_init__(self) -> None:
        for key in ("block_size", "n_layer", "n_head", "n_embd"):
            _check(getattr(self, key) >= 1, f"model.{key}", getattr(self, key), "an integer >= 1")
        _check(self.vocab_size is None or self.vocab_size >= 2, "model.vocab_size", self.vocab_size,
               "null (the tokenizer's vocabulary) or an integer >= 2")
        _check(0.0 <= self.dropout < 1.0, "model.dropout", self.dropout, "a float in [0, 1)")
        _check(self.n_embd % self.n_head == 0, "model.n_embd", self.n_embd,
               f"a multiple of model.n_head={self.n_head}")


@dataclass
class DataSchema:
    """`data=` group: where text comes from, how it is tokenized and cached, and how batches are drawn.

    Every option states the keys up to num_workers. The keys after it belong to some sources only (val_fraction:
    all but folder; embedded: corpus_*; hub: hub_path, config_name, split, text_field; local: path, text_field;
    folder: dir, train_file, val_file, checksums): an option leaves out those it does not use, and the values here
    are altgrad.data.TextDataModule's defaults, which it then runs with, so the checks see what the run uses."""

    _target_: str = MISSING
    name: str = MISSING
    source: str = MISSING
    tokenizer: str = MISSING
    block_size: int = MISSING
    batch_size: int = MISSING
    seed: int = MISSING
    val_batches: int = MISSING
    cache_dir: str = MISSING
    num_workers: int = MISSING
    val_fraction: float = 0.05
    corpus_seed: int = 0
    corpus_chars: int = 5_000_000
    hub_path: Optional[str] = None
    config_name: Optional[str] = None
    split: str = "train"
    text_field: str = "text"
    path: Optional[str] = None
    dir: Optional[str] = None
    train_file: str = "train.txt"
    val_file: str = "val.txt"
    checksums: Optional[str] = "SHA256SUMS"

    def __post_init__(self) -> None:
        from altgrad.data.folder import resolve_split_files
        from altgrad.data.sources import DATA_SOURCES, resolve_local_files

        _choice("data.source", self.source, DATA_SOURCES)
        _choice("data.tokenizer", self.tokenizer, valid_tokenizers())
        for key in ("block_size", "batch_size", "val_batches", "corpus_chars"):
            _check(getattr(self, key) >= 1, f"data.{key}", getattr(self, key), "an integer >= 1")
        _check(self.num_workers >= 0, "data.num_workers", self.num_workers, "an integer >= 0")
        for key in ("seed", "corpus_seed"):
            _check(0 <= getattr(self, key) <= 2**32 - 1, f"data.{key}", getattr(self, key),
                   "an integer in [0, 4294967295]")
        _check(0.0 < self.val_fraction < 1.0, "data.val_fraction", self.val_fraction, "a float in (0, 1)")
        if self.source == "hub":
            _check(bool(self.hub_path), "data.hub_path", self.hub_path, "a Hugging Face dataset path or folder")
        if self.source == "local":
            resolve_local_files(self.path)  # raises ConfigError naming data.path when nothing matches
        if self.source == "folder":
            resolve_split_files(self.dir, self.train_file, self.val_file, self.checksums)  # names the missing part


ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "auto")
PRECISIONS = ("32-true", "32", "bf16-mixed", "bf16-true", "16-mixed", "16-true", "64-true")
MATMUL_PRECISIONS = ("highest", "high", "medium")


# Measured by the job bench (docs/benchmarks/job.md): a compiled CPU job paid more in compiles than its steps won back.
CPU_COMPILE_REFUSED = ("trainer.compile=true is off on the CPU (trainer.accelerator=cpu): torch.compile made CPU jobs "
                       "slower, not faster (docs/benchmarks/job.md); valid: trainer.compile=false, or trainer=gpu; "
                       "trainer.compile=force compiles on the CPU anyway")
COMPILE_CHOICES = (False, True, "force")
"""`trainer.compile`: false, true (refused on the CPU), force (compile on any accelerator)."""
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""`trainer.compile_mode`: torch.compile's ``mode``. reduce-overhead replays each compiled graph's kernels as one CUDA
graph (a host-bound GPU step's launches), so it needs a CUDA GPU; max-autotune also benchmarks kernel choices."""


# Lightning's SimpleProfiler (wall time per hook), AdvancedProfiler (cProfile) and PyTorchProfiler (torch.profiler's
# operator and CUDA-kernel table over PROFILE_ACTIVE steady steps from the middle of the run)
PROFILERS = ("simple", "advanced", "pytorch")


@dataclass
class TrainerSchema:
    """`trainer=` group: Lightning Trainer settings plus the bench's own (checkpoint interval, compile, MFU peak);
    conf/trainer/default.yaml states each one's default."""

    name: str = MISSING
    accelerator: str = MISSING
    devices: Any = MISSING
    precision: str = MISSING
    max_steps: int = MISSING
    val_check_interval: int = MISSING
    log_every_n_steps: int = MISSING
    gradient_clip_val: Optional[float] = MISSING
    accumulate_grad_batches: int = MISSING
    checkpoint_every_n_steps: int = MISSING
    initial_validation: bool = MISSING
    deterministic: bool = MISSING
    compile: Any = MISSING  # false | true | force (COMPILE_CHOICES)
    compile_mode: str = MISSING  # COMPILE_MODES
    matmul_precision: str = MISSING
    keep_freed_memory: bool = MISSING
    peak_flops: Any = MISSING  # null | auto | FLOP/s > 0 (altgrad.peak_flops)
    sample_tokens: int = MISSING
    progress_refresh: int = MISSING
    profiler: Optional[str] = MISSING  # null | simple | advanced | pytorch (PROFILERS)

    def __post_init__(self) -> None:
        _choice("trainer.accelerator", self.accelerator, ACCELERATORS)
        if self.profiler is not None:
            _choice("trainer.profiler", self.profiler, PROFILERS)
        _choice("trainer.precision", str(self.precision), PRECISIONS)
        _choice("trainer.matmul_precision", self.matmul_precision, MATMUL_PRECISIONS)
        _check(self.devices == "auto" or (isinstance(self.devices, int) and self.devices >= 1), "trainer.devices",
               self.devices, "an integer >= 1 or 'auto'")
        for key in ("max_steps", "val_check_interval", "log_every_n_steps", "accumulate_grad_batches",
                    "checkpoint_every_n_steps", "progress_refresh"):
            _check(getattr(self, key) >= 1, f"trainer.{key}", getattr(self, key), "an integer >= 1")
        _check(self.sample_tokens >= 0, "trainer.sample_tokens", self.sample_tokens, "an integer >= 0")
        _check(self.gradient_clip_val is None or self.gradient_clip_val > 0, "trainer.gradient_clip_val",
               self.gradient_clip_val, "null or a float > 0")
        peak = self.peak_flops
        _check(peak is None or peak == "auto" or (isinstance(peak, (int, float)) and not isinstance(peak, bool)
                                                  and peak > 0),
               "trainer.peak_flops", peak, "null, auto (the GPU's dense 16-bit peak) or the peak FLOP/s > 0")
        if not any(self.compile is c or self.compile == c for c in COMPILE_CHOICES):
            raise ConfigError(f"trainer.compile={self.compile!r} is not valid; valid: false, true, force")
        if self.compile is True and self.accelerator == "cpu":
            raise ConfigError(CPU_COMPILE_REFUSED)
        _choice("trainer.compile_mode", self.compile_mode, COMPILE_MODES)
        if self.compile_mode != "default" and self.compile is False:
            raise ConfigError(f"trainer.compile_mode={self.compile_mode} needs a compiled model; valid with "
                              "trainer.compile=false: default (or set trainer.compile=true / force)")
        if self.compile_mode == "reduce-overhead" and self.accelerator == "cpu":
            raise ConfigError("trainer.compile_mode=reduce-overhead needs a CUDA GPU (CUDA graphs); valid on the CPU: "
                              "default, max-autotune, max-autotune-no-cudagraphs")


@dataclass
class ScheduleSchema:
    """nanoGPT's learning-rate schedule: linear warm-up, cosine decay to min_lr_ratio·lr by decay_steps."""

    warmup_steps: int = MISSING
    decay_steps: Optional[int] = MISSING
    min_lr_ratio: float = MISSING

    def __post_init__(self) -> None:
        _check(self.warmup_steps >= 0, "schedule.warmup_steps", self.warmup_steps, "an integer >= 0")
        _check(self.decay_steps is None or self.decay_steps >= 1, "schedule.decay_steps", self.decay_steps,
               "null (= trainer.max_steps) or an integer >= 1")
        _check(0.0 <= self.min_lr_ratio <= 1.0, "schedule.min_lr_ratio", self.min_lr_ratio, "a float in [0, 1]")


OPTIM_KERNELS = ("auto", "native", "compiled", "eager")
"""`optimizer.kernel` of ManifoldAdamW, RelativeAdamW and GridOptim: their fused per-tensor step through
torch.compile, eager torch ops (see each optimizer for what its eager step is), and for ManifoldAdamW and
RelativeAdamW also ``native`` (one C++ pass, the compiled step's bits) and ``auto`` (native where it serves, else
compiled: `make train`'s)."""
NATIVE_STEP_OPTIMIZERS = ("ManifoldAdamW", "RelativeAdamW")
"""The optimizers (`_target_`'s last part) whose step has a native twin (altgrad.optim.native_step)."""


@dataclass
class OptimizerSchema:
    """`optimizer=` group: a `_partial_` Hydra target plus `name` and hyper-parameters (extra keys allowed)."""

    _target_: str = MISSING
    _partial_: bool = MISSING
    name: str = MISSING
    lr: float = MISSING
    weight_decay: float = MISSING
    label: Optional[str] = None  # how reports name the arm (absent or null: name)
    kernel: Optional[str] = None  # the step's implementation, for the optimizers that have several (OPTIM_KERNELS)

    def __post_init__(self) -> None:
        if self.kernel is not None:
            _choice("optimizer.kernel", self.kernel, OPTIM_KERNELS)
            if self.kernel in ("auto", "native") and self._target_.rsplit(".", 1)[-1] not in NATIVE_STEP_OPTIMIZERS:
                _check(False, "optimizer.kernel", self.kernel,
                       f"compiled or eager for optimizer={self.name} (auto and native: "
                       f"{', '.join(NATIVE_STEP_OPTIMIZERS)})")
        _check(self._partial_ is True, "optimizer._partial_", self._partial_,
               "true (the module supplies the parameter groups)")
        _check(self.lr > 0 and math.isfinite(self.lr), "optimizer.lr", self.lr, "a finite float > 0")
        _check(self.weight_decay >= 0, "optimizer.weight_decay", self.weight_decay, "a float >= 0")


@dataclass
class FormatSchema:
    """`format=` group (owned by the quantization layer): the keys the bench checks; extra keys are allowed.

    `name` is a preset (altgrad.quant.list_formats, or fp32) whose fields ebits/mbits/bias/policy may be overridden,
    or a name of its own when all four are given: a format defined in its YAML file (docs/extending.md). `label` is
    how runs and reports name the option (conf/format/_base: the name; bf16_ref: its own)."""

    name: str = MISSING
    label: str = MISSING
    grad: Optional[str] = MISSING
    rounding: str = MISSING
    overflow: str = MISSING
    scaling: dict[str, Any] = MISSING  # checked by altgrad.quant.ScalingSpec
    ebits: Optional[int] = MISSING
    mbits: Optional[int] = MISSING
    bias: Optional[int] = MISSING
    policy: Optional[str] = MISSING

    def __post_init__(self) -> None:
        from altgrad.quant import OVERFLOWS, ROUNDINGS, ScalingSpec
        from altgrad.quant.layer_map import FORMAT_FIELDS, UNQUANTIZED, resolve_format

        formats = valid_formats()
        fields = {k: getattr(self, k) for k in FORMAT_FIELDS}
        if self.name not in formats and any(v is None for v in fields.values()):
            raise ConfigError(f"format.name={self.name!r} is not valid; valid: {', '.join(formats)}, or a name of its "
                              f"own with format.{', format.'.join(FORMAT_FIELDS)} all set")
        if self.name not in UNQUANTIZED:
            try:
                resolve_format(self.name, fields)
            except ValueError as err:  # FloatFormat's one line names the field, the value and what is valid
                raise ConfigError(str(err).replace("FloatFormat.", "format.")) from None
        if self.grad is not None:
            _choice("format.grad", self.grad, formats)
        _choice("format.rounding", self.rounding, ROUNDINGS)
        _choice("format.overflow", self.overflow, OVERFLOWS)
        try:
            ScalingSpec(**self.scaling)
        except TypeError:
            keys = [f.name for f in dataclasses.fields(ScalingSpec)]
            unknown = ", ".join(sorted(set(self.scaling) - set(keys)))
            raise ConfigError(f"format.scaling.{unknown} is not a known key of format.scaling; valid: "
                              f"{', '.join(keys)}") from None
        except ValueError as err:  # ScalingSpec's one line names scaling.<key>, the value and what is valid
            raise ConfigError(f"format.{err}") from None


@dataclass
class LayerMapSchema:
    """`layer_map=` group (owned by the quantization layer): a named rule list; its keys are checked there."""

    name: str = MISSING


MASTER_POLICIES = ("fp32", "none")
"""`quant.master`: fp32 master weights quantized in the forward pass, or none (weights stored on the grid)."""
STORAGE_ROUNDINGS = ("nearest", "stochastic")
"""`quant.storage_rounding`: how weights are put back on their grid after each step when quant.master=none."""
STATS_POLICIES = ("demand", "always")
"""`quant.stats`: quantizer statistics only on the steps a diagnostic reads them, or on every call."""
QUANT_KERNELS = ("auto", "native", "compiled", "eager")
"""`quant.kernel`: how quantizer calls run (altgrad.quant.compiled.KERNELS; the same bits on every road)."""


@dataclass
class QuantSchema:
    """`quant:` section: the weight-storage policy and when quantizers record statistics (FakeQuantCallback's)."""

    master: str = MISSING
    storage_rounding: str = MISSING
    stats: str = MISSING
    kernel: str = MISSING

    def __post_init__(self) -> None:
        _choice("quant.master", self.master, MASTER_POLICIES)
        _choice("quant.storage_rounding", self.storage_rounding, STORAGE_ROUNDINGS)
        _choice("quant.stats", self.stats, STATS_POLICIES)
        _choice("quant.kernel", self.kernel, QUANT_KERNELS)


@dataclass
class PathsSchema:
    output_dir: str = MISSING


@dataclass(frozen=True)
class RunConfig:
    """A checked run configuration: one typed object per section (as composed from conf/) and the scalars.

    `composed` is the DictConfig it was checked from: the parts built by `_target_` (data, optimizer, loggers,
    callbacks, the layer map) are built from it, since their owners' keys beyond the schema's are kept there, and
    it is what a run records (summary.json, checkpoints).
    """

    composed: DictConfig
    seed: int
    run_name: str
    ckpt_path: Optional[str]
    experiment_name: Optional[str]
    model: ModelSchema
    data: DataSchema
    trainer: TrainerSchema
    schedule: ScheduleSchema
    optimizer: OptimizerSchema
    format: FormatSchema
    layer_map: LayerMapSchema
    quant: QuantSchema
    paths: Optional[PathsSchema]  # None when validated with paths=False (outside a Hydra job)

    @property
    def run_dir(self) -> Path:
        """`paths.output_dir`, where every file of the run goes (only known when validated with paths=True)."""
        if self.paths is None:
            raise ConfigError("paths.output_dir is not set: validate(cfg, paths=True) inside a Hydra job, or set it")
        return Path(self.paths.output_dir)

    @property
    def optimizer_label(self) -> str:
        """How reports name the arm: optimizer.label, else optimizer.name."""
        return self.optimizer.label or self.optimizer.name

    @property
    def format_label(self) -> str:
        """How runs and reports name the format option: format.label (e.g. bf16_ref for bf16 with unquantized
        gradients), else format.name."""
        return self.format.label or self.format.name

    @property
    def decay_steps(self) -> int:
        """The cosine decay length: schedule.decay_steps, or trainer.max_steps when that is null."""
        return self.schedule.decay_steps or self.trainer.max_steps


@dataclass
class Section:
    """One top-level key: its schema, and whether keys beyond the schema's are allowed."""

    schema: type
    open: bool = False


SECTIONS: dict[str, Section] = {
    "model": Section(ModelSchema),
    "data": Section(DataSchema),
    "trainer": Section(TrainerSchema),
    "schedule": Section(ScheduleSchema),
    "optimizer": Section(OptimizerSchema, open=True),
    "format": Section(FormatSchema, open=True),
    "layer_map": Section(LayerMapSchema, open=True),
    "quant": Section(QuantSchema, open=True),
    "paths": Section(PathsSchema),
}
# Top-level keys that are not sections: mappings of `_target_` configs, and scalars.
TARGET_MAPPINGS = ("logger", "callbacks")
# Mappings of plain values that sections interpolate (checked where used): the AdamW baseline's hyper-parameters
# (conf/train.yaml) and a study's tuned learning rates (conf/experiment/optim/tuned/, written by sweep.lr_pick).
VALUE_MAPPINGS = ("baseline", "tuned_lr")
# A study's primary endpoint, declared in its experiment file (altgrad/report/endpoint.py): checked before any run.
ENDPOINT = "endpoint"
SCALARS: dict[str, tuple[type, ...]] = {
    "seed": (int,),
    "ckpt_path": (str, type(None)),
    "run_name": (str,),
    "experiment_name": (str, type(None)),
    "arm": (str, type(None)),  # +arm=NAME: a study arm (conf/arm/NAME.yaml), the label reports compare it by
    "resume_sweep": (bool, type(None)),  # +resume_sweep=true: skip the jobs of a rerun sweep that finished before
    # +resume_with_new_config=true: resume ckpt_path under another configuration on purpose (altgrad/resume_check.py)
    "resume_with_new_config": (bool, type(None)),
}
SEED_RANGE = (0, 2**32 - 1)  # what numpy, torch and Lightning's seed_everything all accept


def _section_error(section: str, err: OmegaConfBaseException) -> ConfigError:
    key = f"{section}.{err.full_key}" if err.full_key else section
    if isinstance(err, ValidationError):
        return ConfigError(f"{key}={err.value!r} is invalid: expected {_expected(section, str(err.full_key))}")
    if isinstance(err, ConfigKeyError):
        schema = SECTIONS[section].schema
        valid = ", ".join(f.name for f in dataclasses.fields(schema))
        return ConfigError(f"{key} is not a known key of {section}; valid: {valid}")
    if isinstance(err, MissingMandatoryValue):
        return ConfigError(f"{key} is required but not set (???); set it on the command line, e.g. {key}=...")
    return ConfigError(f"{section}: {str(err).splitlines()[0]}")


def _expected(section: str, dotted: str) -> str:
    schema: Any = SECTIONS[section].schema
    hint: Any = None
    for part in dotted.split("."):
        hints = typing.get_type_hints(schema)
        hint = hints.get(part)
        schema = hint
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    expected = names.get(base, getattr(base, "__name__", str(base)))
    return expected + (" or null" if type(None) in typing.get_args(hint) else "")


def _resolved(cfg: DictConfig, key: str) -> Any:
    try:
        return OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_config(cfg[key]) else cfg[key]
    except MissingMandatoryValue as err:
        raise ConfigError(f"{key}.{err.full_key} is required but not set (???); set it, e.g. "
                          f"{key}.{err.full_key}=...") from None
    except InterpolationResolutionError as err:
        raise ConfigError(f"{key}: cannot resolve {str(err).splitlines()[0]}") from None


def validate(cfg: DictConfig, *, paths: bool = True) -> RunConfig:
    """Check every section of a composed train config; return it typed, as train() uses it.

    paths=False skips `paths`, whose `${hydra:...}` interpolation only resolves inside a Hydra job.
    Raises ConfigError (one line) on the first problem.
    """
    known = set(SECTIONS) | set(TARGET_MAPPINGS) | set(VALUE_MAPPINGS) | set(SCALARS) | {ENDPOINT, "hydra"}
    for key in cfg:
        if key not in known:
            raise ConfigError(f"{key} is not a known top-level key; valid: {', '.join(sorted(known - {'hydra'}))}")
    if cfg.get(ENDPOINT) is not None:
        from altgrad.report.endpoint import parse_endpoint

        try:
            parse_endpoint(_resolved(cfg, ENDPOINT))
        except ValueError as err:
            raise ConfigError(str(err)) from None
    for key, types in SCALARS.items():
        value = _resolved(cfg, key) if key in cfg else None
        if key == "seed" and isinstance(value, bool):
            value = None
        _check(isinstance(value, types), key, value, " or ".join(
            {int: "an integer", str: "a string", bool: "true or false", type(None): "null"}[t] for t in types))
    scalars = {key: _resolved(cfg, key) if key in cfg else None for key in SCALARS}
    seed = scalars["seed"]
    _check(SEED_RANGE[0] <= seed <= SEED_RANGE[1], "seed", seed,
           f"an integer in [{SEED_RANGE[0]}, {SEED_RANGE[1]}] (2**32 - 1)")
    for key in TARGET_MAPPINGS:
        # Not resolved: their entries may point at ${paths.output_dir}, which only resolves inside a Hydra job.
        node = cfg.get(key)
        node = OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else (node or {})
        _check(isinstance(node, dict), key, node, "a mapping of name -> {_target_: ...}")
        for name, entry in node.items():
            _check(entry is None or (isinstance(entry, dict) and "_target_" in entry), f"{key}.{name}", entry,
                   "null or a mapping with _target_")
    out: dict[str, Any] = {"paths": None}
    for key, section in SECTIONS.items():
        if key == "paths" and not paths:
            continue
        if key not in cfg:
            raise ConfigError(f"{key} is missing from the config; add the {key} section or group")
        plain = _resolved(cfg, key)
        _check(isinstance(plain, dict), key, plain, f"a mapping (the {key} group)")
        schema = OmegaConf.structured(section.schema)
        OmegaConf.set_struct(schema, not section.open)
        try:
            out[key] = OmegaConf.to_object(OmegaConf.merge(schema, plain))
        except OmegaConfBaseException as err:
            raise _section_error(key, err) from None
    _check_combinations(out)
    _check_layer_map(_resolved(cfg, "layer_map"), _resolved(cfg, "format"))
    if scalars["ckpt_path"] is not None:
        resolve_checkpoint(scalars["ckpt_path"])
    return RunConfig(composed=cfg, seed=seed, run_name=scalars["run_name"], ckpt_path=scalars["ckpt_path"],
                     experiment_name=scalars["experiment_name"], **out)


def _check_combinations(sections: dict[str, Any]) -> None:
    """Settings valid alone that cannot work together."""
    optimizer, quant = sections.get("optimizer"), sections.get("quant")
    target = str(getattr(optimizer, "_target_", ""))
    if target.rsplit(".", 1)[-1] == "GridOptim" and quant is not None and quant.master != "none":
        raise ConfigError(f"optimizer={optimizer.name} moves weights between grid points and needs them stored on "
                          f"the grid; quant.master={quant.master!r} is not valid with it; valid: quant.master=none")


def _check_layer_map(layer_map: dict[str, Any], format_cfg: dict[str, Any]) -> None:
    """The layer map's rules and their role values, as FakeQuantCallback reads them: refused here, before torch and
    Lightning set anything up, rather than when the rules meet the model."""
    from altgrad.quant.layer_map import LayerMap, LayerMapError

    try:
        LayerMap.from_config(layer_map, format_cfg).check_values()
    except LayerMapError as err:
        raise ConfigError(str(err)) from None


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """`ckpt_path` as given: a checkpoint file, or a run dir holding checkpoints/last.ckpt."""
    p = Path(os.path.expanduser(str(path)))
    candidates = [p] if p.is_file() else [p / "checkpoints" / "last.ckpt", p / "last.ckpt"]
    for c in candidates:
        if c.is_file():
            return c
    raise ConfigError(f"ckpt_path={str(path)!r} is not a checkpoint file or a run dir with checkpoints/last.ckpt")


"""Structured-config schemas for `conf/train.yaml` and a start-up check that names the bad key, value and valid choices.

Hydra composes plain YAML; `validate(cfg)` merges each section into its dataclass schema (types, unknown keys),
builds the dataclass (ranges and choices in `__post_init__`) and returns them as one `RunConfig`, what `train()`
reads. Any problem becomes one `ConfigError` line, e.g. ``trainer.max_steps='abc' is invalid: expected an integer``.
Sections other workers extend (format, layer_map, optimizer, quant) check the keys they rely on and accept extra
ones; what is built from them by `_target_` is built from the composed config (`RunConfig.composed`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field
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
    """Format names `format.name` may take: the quantization presets plus `fp32` (no quantization)."""
    try:
        from altgrad.quant import list_formats
    except ImportError:  # the quantization core is optional for the plain fp32 bench
        return ["fp32"]
    return sorted(set(list_formats()) | {"fp32"})


def valid_tokenizers() -> list[str]:
    """`bytes` (the built-in byte-level encoding) and every encoding tiktoken knows by name."""
    import tiktoken

    return ["bytes", *sorted(tiktoken.list_encoding_names())]


# --- schemas ---------------------------------------------------------------------------------------------------
@dataclass
class ModelSchema:
    """`model=` group: GPT shape; vocab_size null takes the tokenizer's vocabulary."""

    name: str = MISSING
    block_size: int = 128
    vocab_size: Optional[int] = None
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False

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
    """`data=` group: where text comes from, how it is tokenized and cached, and how batches are drawn."""

    _target_: str = "altgrad.data.TextDataModule"
    name: str = MISSING
    source: str = "embedded"
    tokenizer: str = "bytes"
    block_size: int = 128
    batch_size: int = 16
    seed: int = 0
    val_fraction: float = 0.05
    val_batches: int = 8
    cache_dir: str = "~/.cache/altgrad"
    num_workers: int = 0
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
                       "ALTGRAD_CPU_COMPILE=1 compiles on the CPU anyway")


@dataclass
class TrainerSchema:
    """`trainer=` group: Lightning Trainer settings plus the bench's own (checkpoint interval, compile, MFU peak)."""

    name: str = MISSING
    accelerator: str = "cpu"
    devices: Any = 1
    precision: str = "32-true"
    max_steps: int = 300
    val_check_interval: int = 100
    log_every_n_steps: int = 10
    gradient_clip_val: Optional[float] = 1.0
    accumulate_grad_batches: int = 1
    checkpoint_every_n_steps: int = 100
    initial_validation: bool = True
    deterministic: bool = False
    compile: bool = False
    matmul_precision: str = "highest"
    keep_freed_memory: bool = True
    peak_flops: Optional[float] = None
    sample_tokens: int = 0
    progress_refresh: int = 10

    def __post_init__(self) -> None:
        _choice("trainer.accelerator", self.accelerator, ACCELERATORS)
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
        _check(self.peak_flops is None or self.peak_flops > 0, "trainer.peak_flops", self.peak_flops,
               "null or the hardware's peak FLOP/s > 0")
        if self.compile and self.accelerator == "cpu" and os.environ.get("ALTGRAD_CPU_COMPILE") != "1":
            raise ConfigError(CPU_COMPILE_REFUSED)


@dataclass
class ScheduleSchema:
    """nanoGPT's learning-rate schedule: linear warm-up, cosine decay to min_lr_ratio·lr by decay_steps."""

    warmup_steps: int = 30
    decay_steps: Optional[int] = None
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        _check(self.warmup_steps >= 0, "schedule.warmup_steps", self.warmup_steps, "an integer >= 0")
        _check(self.decay_steps is None or self.decay_steps >= 1, "schedule.decay_steps", self.decay_steps,
               "null (= trainer.max_steps) or an integer >= 1")
        _check(0.0 <= self.min_lr_ratio <= 1.0, "schedule.min_lr_ratio", self.min_lr_ratio, "a float in [0, 1]")


@dataclass
class OptimizerSchema:
    """`optimizer=` group: a `_partial_` Hydra target plus `name` and hyper-parameters (extra keys allowed)."""

    _target_: str = MISSING
    _partial_: bool = True
    name: str = MISSING
    lr: float = MISSING
    weight_decay: float = 0.0
    label: Optional[str] = None  # how reports name the arm (default: name)

    def __post_init__(self) -> None:
        _check(self._partial_ is True, "optimizer._partial_", self._partial_,
               "true (the module supplies the parameter groups)")
        _check(self.lr > 0 and math.isfinite(self.lr), "optimizer.lr", self.lr, "a finite float > 0")
        _check(self.weight_decay >= 0, "optimizer.weight_decay", self.weight_decay, "a float >= 0")


@dataclass
class FormatSchema:
    """`format=` group (owned by the quantization layer): the keys the bench checks; extra keys are allowed."""

    name: str = MISSING
    grad: Optional[str] = None
    rounding: str = "nearest"
    overflow: str = "saturate"
    scaling: dict[str, Any] = field(default_factory=dict)  # checked by altgrad.quant.ScalingSpec
    ebits: Optional[int] = None
    mbits: Optional[int] = None
    bias: Optional[int] = None
    policy: Optional[str] = None

    def __post_init__(self) -> None:
        formats = valid_formats()
        _choice("format.name", self.name, formats)
        if self.grad is not None:
            _choice("format.grad", self.grad, formats)
        try:  # the quantization core defines the choices; the plain fp32 bench may run without it
            from altgrad.quant import OVERFLOWS, ROUNDINGS, ScalingSpec
        except ImportError:
            return
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


@dataclass
class QuantSchema:
    """`quant:` section: the weight-storage policy and when quantizers record statistics (FakeQuantCallback's)."""

    master: str = "fp32"
    storage_rounding: str = "nearest"
    stats: str = "demand"

    def __post_init__(self) -> None:
        _choice("quant.master", self.master, MASTER_POLICIES)
        _choice("quant.storage_rounding", self.storage_rounding, STORAGE_ROUNDINGS)
        _choice("quant.stats", self.stats, STATS_POLICIES)


@dataclass
class PathsSchema:
    output_dir: str = MISSING


@dataclass(frozen=True)
class RunConfig:
    """A checked run configuration: one typed object per section (defaults from the schemas above) and the scalars.

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


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """`ckpt_path` as given: a checkpoint file, or a run dir holding checkpoints/last.ckpt."""
    p = Path(os.path.expanduser(str(path)))
    candidates = [p] if p.is_file() else [p / "checkpoints" / "last.ckpt", p / "last.ckpt"]
    for c in candidates:
        if c.is_file():
            return c
    raise ConfigError(f"ckpt_path={str(path)!r} is not a checkpoint file or a run dir with checkpoints/last.ckpt")


"""Check command-line overrides before Hydra runs, so a typo costs one readable line instead of a stack of them.

Checks, in order: the overrides parse; every `group=option` names an existing option (sweeps included); and, for
each combination of a small sweep (or the single run), the composed config passes `altgrad.config.validate`.
Anything this does not catch is still caught by train() and by Hydra itself. `check_step_memory` runs in train(),
once the vocabulary is known: a block size no machine here could train stops before the sanity check.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from altgrad.config import ConfigError, validate

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override

HYDRA_ONLY_FLAGS = ("-h", "--help", "--hydra-help", "--info", "-i", "--cfg", "-c", "--resolve", "--package", "-p",
                    "--shell-completion", "-sc", "--config-path", "-cp", "--config-name", "-cn", "--config-dir",
                    "-cd", "--experimental-rerun", "--version")
MAX_COMBINATIONS = 32


def _one_line(err: BaseException) -> str:
    """An exception's message and its causes' as one line, without OmegaConf's full_key/object_type trailer."""
    parts: list[str] = []
    seen: BaseException | None = err
    while seen is not None and len(parts) < 4:
        for line in str(seen).splitlines():
            line = line.strip()
            if line and not line.startswith(("full_key:", "object_type", "reference_type")) and line not in parts:
                parts.append(line)
        seen = seen.__cause__
    return " ".join(parts) or type(err).__name__


def sweep_combinations(overrides: list[Override]) -> list[list[str]]:
    """The override lines of each job a multirun of `overrides` would launch, in Hydra's basic sweeper's order:
    the cartesian product of every discrete sweep's values (a key given twice: its last value, first place).
    Interval sweeps (only other sweepers run them) give no combinations: Hydra itself checks those."""
    choices: dict[str, list[str]] = {}
    for o in overrides:
        key = o.get_key_element()
        if not o.is_sweep_override():
            choices[key] = [f"{key}={o.get_value_element_as_str()}"]
        elif o.is_discrete_sweep():
            choices[key] = [f"{key}={value}" for value in o.sweep_string_iterator()]
        else:
            return []
    return [list(combo) for combo in itertools.product(*choices.values())]


def _multirun_by_config(config_name: str, overrides: list[str]) -> bool:
    """Whether the composed config asks for a multirun itself (`hydra.mode: MULTIRUN`, as experiment= recipes do)."""
    from hydra import compose
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException):
        return False  # reported below, by the composition check
    return cfg.hydra.mode == RunMode.MULTIRUN


def check_overrides(argv: list[str], conf_dir: Path, config_name: str = "train") -> str | None:
    """None when the command line looks runnable, else one line saying what is wrong and what is valid."""
    if any(a.split("=", 1)[0] in HYDRA_ONLY_FLAGS for a in argv):
        return None  # help, --cfg, alternative config dirs...: Hydra's own business
    multirun = any(a in ("-m", "--multirun") for a in argv)
    overrides = [a for a in argv if a not in ("-m", "--multirun")]

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as err:
        return f"cannot parse the overrides: {_one_line(err)}"
    sweeps = [o.input_line for o in parsed if o.is_sweep_override()]

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
        if sweeps and not multirun and not _multirun_by_config(config_name, fixed):
            return f"{sweeps[0]} is a sweep; add -m (multirun) to run one job per value"
        loader = GlobalHydra.instance().config_loader()
        for o in parsed:
            if o.is_delete() or o.is_hydra_override() and "/" not in o.key_or_group:
                continue
            options = loader.get_group_options(o.key_or_group)
            if not options or (o.is_sweep_override() and (o.is_interval_sweep() or o.is_range_sweep())):
                continue
            if o.is_sweep_override():
                values = list(o.sweep_string_iterator())
            else:
                values = [] if o.value() is None else [o.get_value_element_as_str()]
            for value in values:
                if "*" in value or "?" in value:  # glob sweeps are expanded by Hydra
                    continue
                if value not in options:
                    return (f"{o.key_or_group}={value} is not an option of the {o.key_or_group} group; "
                            f"valid: {', '.join(options)}")
        combos = sweep_combinations(parsed)[:MAX_COMBINATIONS]
        for combo in combos or [[]]:
            try:
                cfg = compose(config_name=config_name, overrides=combo, return_hydra_config=True)
                # an experiment's own sweep (hydra.sweeper.params) also sets keys: take its first job's values
                params = cfg.hydra.sweeper.get("params") or {}
                given = {c.split("=", 1)[0].lstrip("+~") for c in combo}
                first = [f"{k}={str(v).split(',')[0].strip()}" for k, v in params.items()
                         if k.lstrip("+~") not in given]
                if first:  # otherwise the config composed above is the job's (validate ignores its hydra node)
                    cfg = compose(config_name=config_name, overrides=[*combo, *first])
                validate(cfg, paths=False)
            except ConfigError as err:
                return str(err)
            except (HydraException, OmegaConfBaseException) as err:
                return f"cannot compose the config: {_one_line(err)}"
    GlobalHydra.instance().clear()
    return None


# Float32 values a training step keeps per token: about 12 per channel per block (inputs of the attention and MLP
# GEMMs, their outputs, the GELU, the residual stream) and about 4 per vocabulary entry (logits, softmax, gradient).
# A lower bound on purpose: a run refused by it could never have fit.
PER_CHANNEL_PER_BLOCK = 12
PER_VOCAB = 4


def step_memory_bytes(batch_size: int, block_size: int, n_layer: int, n_embd: int, vocab_size: int,
                      bytes_per_value: int = 4) -> int:
    """A lower bound on the activation memory one training step of the GPT needs (bytes)."""
    tokens = batch_size * block_size
    return tokens * (n_layer * PER_CHANNEL_PER_BLOCK * n_embd + PER_VOCAB * vocab_size) * bytes_per_value


def available_memory(accelerator: str) -> int | None:
    """Bytes a run can use: the GPU's total memory for gpu/cuda, else the host's MemAvailable (None: unknown)."""
    if accelerator in ("gpu", "cuda"):
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.mem_get_info()[1])
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_step_memory(cfg: Any, vocab_size: int, available: int | None = None) -> None:
    """ConfigError (one line) when one training step cannot fit in memory: before the sanity check would sit in a
    kernel for minutes (and ignore Ctrl-C) or the kernel's OOM killer would end the run without a summary."""
    m, batch = cfg.model, int(cfg.data.batch_size)
    half = str(cfg.trainer.precision).startswith(("bf16", "16"))
    need = step_memory_bytes(batch, int(m.block_size), int(m.n_layer), int(m.n_embd), int(m.vocab_size or vocab_size),
                             2 if half else 4)
    available = available_memory(str(cfg.trainer.accelerator)) if available is None else available
    if available is not None and need > available:
        raise ConfigError(f"model.block_size={m.block_size} with data.batch_size={batch} needs at least "
                          f"{need / 2**30:.1f} GiB of activations per training step, more than the "
                          f"{available / 2**30:.1f} GiB available; valid: a smaller model.block_size or "
                          "data.batch_size (or a larger machine)")

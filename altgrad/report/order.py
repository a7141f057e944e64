"""The order the report lists formats, optimizers, storages and failure stages in, derived from what is registered.

Formats and optimizers are the options of the `format` and `optimizer` config groups (conf/format/*.yaml,
conf/optimizer/*.yaml), named by their labels as runs record them (format.label: bf16_ref beside bf16;
optimizer.label: manifold[update]); storages come from the `quant` choices. A value the registry does not know (a
format defined elsewhere, an old label) sorts after the known ones, by name.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from altgrad.config import MASTER_POLICIES, STORAGE_ROUNDINGS
from altgrad.quant import get_format, list_formats

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
UNQUANTIZED = "fp32"


@dataclass(frozen=True)
class FormatOption:
    """One option of the `format` group: its label, the format it names and the gradients' format."""

    label: str
    name: str
    grad: str | None
    mbits: int | None
    bits: int | None  # storage width; None for fp32 (not quantized) or a format that cannot be built


def _group_files(group: str, conf_dir: Path) -> list[Path]:
    return sorted((conf_dir / group).glob("*.yaml"))


def _format_option(path: Path, base: Any) -> FormatOption:
    own = OmegaConf.load(path)
    own.pop("defaults", None)
    cfg = OmegaConf.to_container(OmegaConf.merge(base, own), resolve=True)
    name = str(cfg["name"])
    fields = {k: cfg.get(k) for k in ("ebits", "mbits", "bias", "policy")}
    mbits = bits = None
    if name != UNQUANTIZED:
        from altgrad.quant.layer_map import resolve_format

        try:
            fmt = resolve_format(name, fields)
        except ValueError:  # an option that cannot run (its run stops with one line); the report still reads
            pass
        else:
            mbits, bits = fmt.mbits, fmt.bits
    return FormatOption(str(cfg.get("label") or name), name, cfg.get("grad"), mbits, bits)


@functools.lru_cache(maxsize=None)
def format_options(conf_dir: Path = CONF_DIR) -> tuple[FormatOption, ...]:
    """The `format` group's options in report order: fp32, then wider formats first, each in the quantization
    core's preset order, a preset's option with unquantized gradients (a reference) before the others. Without a
    conf/ folder (an installed package): fp32 and the presets."""
    base_path = conf_dir / "_base" / "format.yaml"
    if base_path.is_file():
        base = OmegaConf.load(base_path)
        options = [_format_option(p, base) for p in _group_files("format", conf_dir)]
    else:
        options = [FormatOption(UNQUANTIZED, UNQUANTIZED, None, None, None)]
        options += [FormatOption(n, n, "e5m2", get_format(n).mbits, get_format(n).bits) for n in list_formats()]
    presets = list_formats()

    def key(o: FormatOption) -> tuple:
        preset = presets.index(o.name) if o.name in presets else len(presets)
        return (o.name != UNQUANTIZED, -(o.bits or 0), preset, o.grad is not None, o.label)

    return tuple(sorted(options, key=key))


def _optimizer_label(path: Path) -> str:
    """optimizer.label of one option file (following its `defaults` within the group), else its name."""
    data = yaml.safe_load(path.read_text()) or {}
    if data.get("label"):
        return str(data["label"])
    for parent in data.get("defaults") or []:
        if isinstance(parent, str) and parent != "_self_" and (path.parent / f"{parent}.yaml").is_file():
            return _optimizer_label(path.parent / f"{parent}.yaml")
    return str(data.get("name") or path.stem)


@functools.lru_cache(maxsize=None)
def optimizer_labels(conf_dir: Path = CONF_DIR) -> tuple[str, ...]:
    """The `optimizer` group's labels: the default of train.yaml (the baseline) first, then by option name."""
    files = _group_files("optimizer", conf_dir)
    if not files:
        return ()
    defaults = (yaml.safe_load((conf_dir / "train.yaml").read_text()) or {}).get("defaults") or []
    baseline = next((d["optimizer"] for d in defaults if isinstance(d, dict) and "optimizer" in d), None)
    files.sort(key=lambda p: (p.stem != baseline, p.stem))
    return tuple(dict.fromkeys(_optimizer_label(p) for p in files))


FORMAT_ORDER = tuple(o.label for o in format_options())
REFERENCE_FORMATS = tuple(o.label for o in format_options() if o.name == UNQUANTIZED or (o.bits or 0) > 8)
"""Unquantized and wide (more than 8-bit) formats run as references; the question is about the 8-bit ones."""
OPTIMIZER_ORDER = optimizer_labels()
STORAGE_ORDER = (*(f"{m} master" for m in MASTER_POLICIES if m != "none"),
                 *(f"on-grid {r}" for r in STORAGE_ROUNDINGS))
"""As altgrad.report.load.Job.storage names them: fp32 master weights, or weights stored on the grid."""
STAGE_ORDER = ("fp32", "forward", "forward+grad", "forward+storage", "forward+grad+storage")


def rank(order: Sequence[str], value: Any) -> tuple[int, str]:
    """Sort key: position in ``order`` when listed there, else after all listed values, by name."""
    text = "" if value is None else str(value)
    return (order.index(text), "") if text in order else (len(order), text)


def preset_of(label: str) -> str | None:
    """The format name a registered format label stands for (bf16_ref → bf16); None when not registered."""
    return next((o.name for o in format_options() if o.label == label), None)


def mantissa_bits(fmt: str) -> int | None:
    """M of a format label: the registered option's, else the preset's of that name, else parsed from ``eXmY``."""
    option = next((o for o in format_options() if o.label == fmt), None)
    if option is not None:
        return option.mbits
    if fmt in list_formats():
        return get_format(fmt).mbits
    head, _, tail = fmt.partition("m")
    return int(tail) if head.startswith("e") and head[1:].isdigit() and tail.isdigit() else None


def exponent_bits(fmt: str) -> int | None:
    """E of a format label: the registered option's format, else the preset of that name, else parsed from
    ``eXmY``; None for fp32 or a name it cannot read."""
    option = next((o for o in format_options() if o.label == fmt), None)
    name = option.name if option is not None else fmt
    if name in list_formats():
        return get_format(name).ebits
    head, _, tail = name.partition("m")
    return int(head[1:]) if head.startswith("e") and head[1:].isdigit() and tail.isdigit() else None


def recorded_format_label(recorded: Any, config_format: Mapping[str, Any] | None) -> Any:
    """The format label of a run recorded before runs kept one: the registered option with the run's format name
    and gradient format (bf16 with unquantized gradients is bf16_ref), else what the run recorded."""
    if not isinstance(config_format, Mapping) or "label" in config_format or "name" not in config_format:
        return recorded
    matches = [o.label for o in format_options()
               if o.name == config_format["name"] and o.grad == config_format.get("grad")]
    return matches[0] if len(matches) == 1 else recorded

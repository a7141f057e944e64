"""LayerMap: ordered glob rules that give each nn.Linear its weight / input / grad QuantSpec.

A rule is a mapping ``{match: GLOB, weight: ROLE, input: ROLE, grad: ROLE}``; a role left out keeps what earlier rules
(or the format defaults) gave it, so later rules override earlier ones role by role. A ROLE is

- ``null`` / ``none`` / ``fp32``: the tensor is not quantized;
- ``default``: the format group's default for that role (``format=X`` → weight and input X, grad ``format.grad``);
- a preset name (``e7m0``, ``bf16``, ...): that format with the default rounding, overflow and scaling;
- a mapping ``{format: NAME | {ebits, mbits, bias, policy}, rounding, overflow, scaling: {...}}`` for anything finer.

``GLOB`` is an fnmatch pattern on the Linear's qualified name inside the GPT (``transformer.h.*.attn.*``,
``*.mlp.c_fc``, ``lm_head``); ``{last}`` stands for the index of the last transformer block.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from torch import nn

from altgrad.quant.format import FloatFormat, get_format, list_formats
from altgrad.quant.spec import QuantSpec, ScalingSpec

ROLES = ("weight", "input", "grad")


class LayerMapError(ValueError):
    """A format or layer-map setting that cannot work; the message names the rule/key and what is valid."""

RULE_KEYS = ("match", *ROLES)
UNQUANTIZED = ("none", "null", "fp32", "off")
SPEC_KEYS = ("format", "rounding", "overflow", "scaling")
FORMAT_FIELDS = ("ebits", "mbits", "bias", "policy")


def _plain(obj: Any) -> Any:
    """OmegaConf containers → plain dicts/lists (without importing omegaconf here)."""
    if hasattr(obj, "_content") and hasattr(obj, "_get_node"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(obj, resolve=True)
    return obj


def resolve_format(name_or_fields: str | Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> FloatFormat:
    """A FloatFormat from a preset name or explicit fields, with optional field overrides (e.g. ``bias=3``).

    A name that is no preset is a format of its own when the fields (given or in ``overrides``) are complete: e.g.
    ``resolve_format("e3m2", dict(ebits=3, mbits=2, bias=3, policy="finite"))`` keeps the name as its label."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    if isinstance(name_or_fields, FloatFormat):
        fmt = name_or_fields
    elif isinstance(name_or_fields, str):
        if name_or_fields not in list_formats() and set(given) >= set(FORMAT_FIELDS):
            return _from_fields(given, name_or_fields)
        fmt = get_format(name_or_fields)
    elif isinstance(name_or_fields, Mapping):
        unknown = set(name_or_fields) - set(FORMAT_FIELDS) - {"name"}
        if unknown:
            raise ValueError(f"format fields {sorted(unknown)} are unknown; valid fields: {', '.join(FORMAT_FIELDS)}")
        name = name_or_fields.get("name")
        own = bool(name) and name not in list_formats()  # a format of its own: the fields define it
        base = get_format(name) if name and not own else None
        fields = {k: name_or_fields.get(k, getattr(base, k, None)) for k in FORMAT_FIELDS}
        missing = [k for k, v in fields.items() if v is None]
        if missing:
            if own:
                get_format(name)  # an unknown name without its fields: the error lists the presets
            raise ValueError(f"custom format {dict(name_or_fields)} lacks {missing}; give a preset name or all of "
                             f"{', '.join(FORMAT_FIELDS)}")
        fmt = _from_fields(fields, name if own else None)
    else:
        raise ValueError(f"format {name_or_fields!r} is neither a preset name nor a mapping of "
                         f"{', '.join(FORMAT_FIELDS)}; presets: {', '.join(list_formats())}")
    if given:
        kw = {k: getattr(fmt, k) for k in FORMAT_FIELDS}
        kw.update({k: (str(v) if k == "policy" else int(v)) for k, v in given.items()})
        custom = FloatFormat(**kw)
        fmt = FloatFormat(**kw, name=fmt.name if custom == fmt else custom_format_name(fmt, custom))
    return fmt


def custom_format_name(preset: FloatFormat, custom: FloatFormat) -> str:
    """How a preset with overridden fields is named wherever it is recorded (summary.json, the layer table, the
    report): a preset with exactly these fields by its name, else by the fields, ``e4m20`` for e4m3 with mbits=20,
    with the bias (``b3``) and the policy (``-ieee``) where they differ from the preset's, or always where the short
    name is a preset's with other fields."""
    presets = {name: get_format(name) for name in list_formats()}
    same = next((name for name, f in presets.items() if f == custom), None)
    if same is not None:
        return same
    short = f"e{custom.ebits}m{custom.mbits}"
    bias = f"b{custom.bias}" if custom.bias != preset.bias or short in presets else ""
    policy = f"-{custom.policy}" if custom.policy != preset.policy or short in presets else ""
    return short + bias + policy


def custom_grid_name(format_cfg: Mapping[str, Any]) -> str | None:
    """The name of the grid a ``format`` config section runs when it overrides fields of its preset
    (``format=e4m3 format.mbits=20`` runs e4m20, not e4m3: `custom_format_name`); None when it overrides none."""
    cfg = dict(_plain(format_cfg))
    name = cfg.get("name")
    overrides = {k: cfg.get(k) for k in FORMAT_FIELDS if cfg.get(k) is not None}
    if name is None or str(name).lower() in UNQUANTIZED or not overrides:
        return None
    return resolve_format(str(name), overrides).name


def _from_fields(fields: Mapping[str, Any], name: str | None) -> FloatFormat:
    return FloatFormat(int(fields["ebits"]), int(fields["mbits"]), int(fields["bias"]), str(fields["policy"]),
                       name=name)


@dataclasses.dataclass(frozen=True)
class FormatDefaults:
    """What ``format=X`` means for every role before any rule applies."""

    weight: QuantSpec | None
    input: QuantSpec | None
    grad: QuantSpec | None
    rounding: str = "nearest"
    overflow: str = "saturate"
    scaling: ScalingSpec = dataclasses.field(default_factory=ScalingSpec)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "FormatDefaults":
        """Build from the ``format`` config group (name, grad, rounding, overflow, scaling, field overrides)."""
        cfg = dict(_plain(cfg))
        rounding = cfg.get("rounding") or "nearest"
        overflow = cfg.get("overflow") or "saturate"
        scaling = ScalingSpec(**dict(cfg.get("scaling") or {}))
        name = cfg.get("name")
        overrides = {k: cfg.get(k) for k in FORMAT_FIELDS}

        def spec(fmt_name: Any, field_overrides: Mapping[str, Any] | None = None) -> QuantSpec | None:
            if fmt_name is None or str(fmt_name).lower() in UNQUANTIZED:
                return None
            return QuantSpec(resolve_format(fmt_name, field_overrides), rounding, overflow, scaling)

        weight = spec(name, overrides)
        grad = spec(cfg.get("grad")) if weight is not None else None
        return cls(weight=weight, input=weight, grad=grad, rounding=rounding, overflow=overflow, scaling=scaling)

    def role_spec(self, role: str, value: Any, where: str) -> QuantSpec | None:
        """Resolve one rule's role value against these defaults."""
        value = _plain(value)
        if value is None or (isinstance(value, str) and value.lower() in UNQUANTIZED):
            return None
        if isinstance(value, str) and value.lower() == "default":
            return getattr(self, role)
        if isinstance(value, str):
            return QuantSpec(resolve_format(value), self.rounding, self.overflow, self.scaling)
        if isinstance(value, Mapping):
            unknown = set(value) - set(SPEC_KEYS) - set(FORMAT_FIELDS)
            if unknown:
                raise ValueError(f"{where}: unknown keys {sorted(unknown)} in role {role!r}; valid: "
                                 f"{', '.join(SPEC_KEYS + FORMAT_FIELDS)}")
            base = getattr(self, role)
            fmt_value = value.get("format", base.format if base is not None else None)
            if fmt_value is None:
                raise ValueError(f"{where}: role {role!r} gives no format and the default for it is unquantized")
            fmt = resolve_format(fmt_value, {k: value.get(k) for k in FORMAT_FIELDS})
            scaling = dataclasses.asdict(base.scaling if base is not None else self.scaling)
            scaling.update(dict(value.get("scaling") or {}))
            return QuantSpec(
                fmt,
                value.get("rounding", base.rounding if base is not None else self.rounding),
                value.get("overflow", base.overflow if base is not None else self.overflow),
                ScalingSpec(**scaling),
            )
        raise ValueError(f"{where}: role {role!r} has value {value!r}; valid: null, default, a format name "
                         f"({', '.join(list_formats())}) or a mapping with keys {', '.join(SPEC_KEYS)}")


@dataclasses.dataclass(frozen=True)
class ResolvedLayer:
    """The specs one Linear ends up with, and whether its weight is shared with another module."""

    weight: QuantSpec | None
    input: QuantSpec | None
    grad: QuantSpec | None
    tied: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {r: (s.to_dict() if s is not None else None) for r, s in
                               (("weight", self.weight), ("input", self.input), ("grad", self.grad))}
        out["tied"] = self.tied
        return out


def linear_names(model: nn.Module) -> list[str]:
    """Qualified names of every nn.Linear (or already-wrapped QuantLinear) in the model, in module order."""
    from altgrad.quant.layers import QuantLinear

    return [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, QuantLinear)) and n]


def tied_weight_names(model: nn.Module) -> set[str]:
    """Linears whose weight Parameter also belongs to another module (nanoGPT's lm_head ↔ wte)."""
    owners: dict[int, list[str]] = {}
    for mod_name, mod in model.named_modules():
        for p_name, p in mod.named_parameters(recurse=False):
            owners.setdefault(id(p), []).append(f"{mod_name}.{p_name}" if mod_name else p_name)
    tied = set()
    for name in linear_names(model):
        weight = model.get_submodule(name).weight
        if len(owners.get(id(weight), [])) > 1:
            tied.add(name)
    return tied


def _expand_last(pattern: str, names: Sequence[str]) -> str:
    if "{last}" not in pattern:
        return pattern
    indices = [int(m.group(1)) for n in names if (m := re.match(r"transformer\.h\.(\d+)\.", n))]
    if not indices:
        raise ValueError(f"rule match {pattern!r} uses {{last}} but the model has no transformer.h.N blocks")
    return pattern.replace("{last}", str(max(indices)))


def collect_rules(layer_map_cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The effective rule list of a ``layer_map`` config: preset ``base_rules`` + ``rules`` + ``extra``."""
    cfg = dict(_plain(layer_map_cfg) or {})
    rules: list[Any] = []
    for key in ("base_rules", "rules", "extra"):
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, Mapping):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"layer_map.{key} must be a list of rules like "
                             f"[{{match: '*.mlp.*', weight: e7m0}}], got {value!r}")
        rules.extend(value)
    return rules


class LayerMap:
    """Ordered rules → a resolved spec per Linear; later rules override earlier ones, role by role."""

    def __init__(self, rules: Iterable[Mapping[str, Any]], defaults: FormatDefaults) -> None:
        self.rules = [self._check_rule(i, r) for i, r in enumerate(rules)]
        self.defaults = defaults

    @classmethod
    def from_config(cls, layer_map_cfg: Mapping[str, Any], format_cfg: Mapping[str, Any]) -> "LayerMap":
        """From the ``layer_map`` and ``format`` config groups; any bad value raises LayerMapError."""
        try:
            return cls(collect_rules(layer_map_cfg), FormatDefaults.from_config(format_cfg))
        except LayerMapError:
            raise
        except (ValueError, TypeError) as err:
            raise LayerMapError(f"format/layer_map: {err}") from None

    @staticmethod
    def _check_rule(index: int, rule: Any) -> dict[str, Any]:
        rule = _plain(rule)
        if not isinstance(rule, Mapping):
            raise ValueError(f"layer_map rule {index} is {rule!r}; a rule is a mapping like "
                             f"{{match: 'transformer.h.*.attn.*', weight: bf16, input: bf16, grad: e5m2}}")
        unknown = set(rule) - set(RULE_KEYS)
        if unknown:
            raise ValueError(f"layer_map rule {index} has unknown keys {sorted(unknown)}; valid keys: "
                             f"{', '.join(RULE_KEYS)}")
        if not isinstance(rule.get("match"), str) or not rule["match"]:
            raise ValueError(f"layer_map rule {index} needs a 'match' glob string (e.g. '*.mlp.c_fc'), "
                             f"got {rule.get('match')!r}")
        return dict(rule)

    def resolve(self, model: nn.Module) -> dict[str, ResolvedLayer]:
        """Resolved specs for every Linear of ``model``, in module order; errors name unmatched rules."""
        names = linear_names(model)
        tied = tied_weight_names(model)
        specs: dict[str, dict[str, QuantSpec | None]] = {
            n: {r: getattr(self.defaults, r) for r in ROLES} for n in names
        }
        for i, rule in enumerate(self.rules):
            pattern = _expand_last(rule["match"], names)
            hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
            if not hits:
                raise LayerMapError(f"layer_map rule {i} match {rule['match']!r} matches no Linear; "
                                 f"Linear modules are: {', '.join(names)}")
            for role in ROLES:
                if role in rule:
                    value = self._role_spec(i, rule, role)
                    for n in hits:
                        specs[n][role] = value
        return {n: ResolvedLayer(**specs[n], tied=n in tied) for n in names}

    def check_values(self) -> None:
        """Every rule's role values resolve (LayerMapError, one line, if not): what resolve() checks without a
        model, so a config can be refused before anything is built."""
        for i, rule in enumerate(self.rules):
            for role in ROLES:
                if role in rule:
                    self._role_spec(i, rule, role)

    def _role_spec(self, index: int, rule: Mapping[str, Any], role: str) -> QuantSpec | None:
        where = f"layer_map rule {index} ({rule['match']!r})"
        try:
            return self.defaults.role_spec(role, rule[role], where)
        except (ValueError, TypeError) as err:  # a bad role value: one line, not a traceback
            message = str(err)
            raise LayerMapError(message if message.startswith(where) else f"{where}: role {role!r}: "
                                f"{message}") from None

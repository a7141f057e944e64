"""A study's plan, read from its YAML file (conf/study/NAME.yaml): where it writes, what every job gets, and its
stages in order. The plan is data; altgrad.study.driver carries it out.

    name: ongrid                      # folders: multirun/<slug>, docs/results/study-<slug>/runs (slug: _ → -)
    records: docs/results/study-ongrid/runs   # optional: where each job's record is copied (repository-relative)
    table: conf/experiment/optim/tuned/ongrid.yaml   # the tuned-lr table the tune stages write (null: a scratch
                                      # table under the study's sweep root, for debug twins)
    required: [data.dir]              # settings every job needs from the command line (--set KEY=VALUE)
    overrides: [format=e4m3]          # given to every sweep (narrows the grids)
    formats_from: {reference: bf16_ref, records: docs/results/study-cpu/runs/eval}   # optional: formats are the
                                      # reference + the best and worst formats of another study's primary contrast
    stages:
      - {name: pilot, kind: sweep, sweeps: [[experiment=ongrid_pilot]]}
      - {name: horizon, kind: horizon, pilot: pilot, experiment: ongrid, factor: 4, min_horizon: 400, every: 100,
         tolerance: 0.03, waiver: null}
      - {name: tune_ref, kind: tune, min_lrs: 5, plain_arm: adamw_sr, sweeps: [[experiment=ongrid_tune_ref, ...]]}
      - {name: power, kind: power, stages: [tune_ref], contrasts: [[manifold_sr, adamw_sr]], margin: 0.03, ...}
      - {name: eval, kind: sweep, seeds: power, sweeps: [[experiment=ongrid, "format=e4m3,e7m0", ...]]}
      - {name: report, kind: report}

Stage kinds: ``sweep`` runs its sweeps (each a `python -m altgrad.train -m` command line; ``seeds`` appends
``seed=…``: a list, or ``power`` for the seeds the power stage chose); ``tune`` runs them too, then picks each
(format, arm) cell's lr into the table, extending edge picks; ``horizon`` checks the evaluation's H against the
pilot; ``power`` chooses the evaluation's number of seeds; ``report`` writes the report from the records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
STUDY_DIR = REPO / "conf" / "study"
KINDS = ("sweep", "tune", "horizon", "power", "report")
_PLAN_KEYS = ("name", "description", "records", "table", "required", "overrides", "formats_from", "stages")
_STAGE_KEYS = {
    "sweep": ("name", "kind", "sweeps", "seeds"),
    "tune": ("name", "kind", "sweeps", "min_lrs", "plain_arm", "eval_seeds"),
    "horizon": ("name", "kind", "pilot", "experiment", "factor", "min_horizon", "every", "tolerance", "waiver"),
    "power": ("name", "kind", "stages", "contrasts", "margin", "power", "alpha", "family", "min_seeds", "max_seeds"),
    "report": ("name", "kind"),
}


class PlanError(ValueError):
    """A plan file that cannot be carried out; the message names the key, its value and what is valid."""


@dataclass(frozen=True)
class Stage:
    """One stage of a plan: its name, kind and the settings of that kind (see the module docstring)."""

    name: str
    kind: str
    sweeps: tuple[tuple[str, ...], ...] = ()
    seeds: tuple[int, ...] | str | None = None  # sweep: a list, "power", or None (the experiments' own seeds)
    min_lrs: int = 5
    plain_arm: str = "adamw"
    eval_seeds: tuple[int, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)  # horizon / power settings

    def get(self, key: str, default: Any = None) -> Any:
        return self.settings.get(key, default)


@dataclass(frozen=True)
class StudyPlan:
    """A study's plan (see the module docstring)."""

    name: str
    stages: tuple[Stage, ...]
    description: str = ""
    records: str | None = None
    table: str | None = None
    required: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    formats_from: Mapping[str, str] | None = None
    source: Path | None = None

    @property
    def slug(self) -> str:
        return self.name.replace("_", "-")

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise PlanError(f"{self.name}: no stage named {name!r}; stages: {', '.join(s.name for s in self.stages)}")

    def stage_names(self) -> list[str]:
        return [s.name for s in self.stages]


def _fail(where: str, value: Any, valid: str) -> PlanError:
    return PlanError(f"{where}={value!r} is invalid; valid: {valid}")


def _strings(where: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(where, value, "a list of non-empty strings")
    return tuple(value)


def _seeds(where: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, int) and not isinstance(v, bool)
                                                           and v >= 0 for v in value):
        raise _fail(where, value, "a non-empty list of seeds (integers ≥ 0)")
    if len(set(value)) != len(value):
        raise _fail(where, value, "distinct seeds")
    return tuple(value)


def _stage(raw: Any, index: int, names: set[str]) -> Stage:
    where = f"stages[{index}]"
    if not isinstance(raw, dict):
        raise _fail(where, raw, "a mapping with name and kind")
    name, kind = raw.get("name"), raw.get("kind")
    if not isinstance(name, str) or not name.isidentifier():
        raise _fail(f"{where}.name", name, "an identifier (letters, digits, _)")
    if name in names:
        raise _fail(f"{where}.name", name, "a name no other stage has")
    if kind not in KINDS:
        raise _fail(f"{name}.kind", kind, ", ".join(KINDS))
    unknown = sorted(set(raw) - set(_STAGE_KEYS[kind]))
    if unknown:
        raise PlanError(f"{name}.{unknown[0]} is not a key of a {kind} stage; valid: "
                        f"{', '.join(_STAGE_KEYS[kind])}")
    if kind in ("sweep", "tune"):
        sweeps = raw.get("sweeps")
        if not isinstance(sweeps, list) or not sweeps:
            raise _fail(f"{name}.sweeps", sweeps, "a non-empty list of override lists (one per sweep)")
        parsed = tuple(_strings(f"{name}.sweeps[{i}]", s) for i, s in enumerate(sweeps))
        if any(not s for s in parsed):
            raise _fail(f"{name}.sweeps", sweeps, "override lists with at least one override each")
        seeds: tuple[int, ...] | str | None = None
        if kind == "sweep" and raw.get("seeds") is not None:
            seeds = "power" if raw["seeds"] == "power" else _seeds(f"{name}.seeds", raw["seeds"])
        min_lrs = raw.get("min_lrs", 5)
        if kind == "tune" and (not isinstance(min_lrs, int) or isinstance(min_lrs, bool) or min_lrs < 1):
            raise _fail(f"{name}.min_lrs", min_lrs, "an integer ≥ 1")
        eval_seeds = _seeds(f"{name}.eval_seeds", raw["eval_seeds"]) if raw.get("eval_seeds") else ()
        plain = raw.get("plain_arm", "adamw")
        if not isinstance(plain, str) or not plain:
            raise _fail(f"{name}.plain_arm", plain, "the arm whose pick is each format's plain lr")
        return Stage(name, kind, parsed, seeds, min_lrs, plain, eval_seeds)
    settings = {k: v for k, v in raw.items() if k not in ("name", "kind")}
    if kind == "horizon":
        if raw.get("pilot") not in names:
            raise _fail(f"{name}.pilot", raw.get("pilot"), f"an earlier stage ({', '.join(sorted(names))})")
        if not isinstance(raw.get("experiment"), str):
            raise _fail(f"{name}.experiment", raw.get("experiment"), "the experiment whose trainer.max_steps is H")
    if kind == "power":
        used = _strings(f"{name}.stages", raw.get("stages"))
        if not used or any(s not in names for s in used):
            raise _fail(f"{name}.stages", raw.get("stages"), f"earlier stages ({', '.join(sorted(names))})")
        contrasts = raw.get("contrasts")
        if (not isinstance(contrasts, list) or not contrasts or
                not all(isinstance(c, list) and len(c) == 2 and all(isinstance(a, str) for a in c) for c in contrasts)):
            raise _fail(f"{name}.contrasts", contrasts, "a list of [treatment arm, reference arm] pairs")
        for key, low, high in (("margin", 0.0, None), ("power", 0.5, 1.0), ("alpha", 0.0, 0.5)):
            value = raw.get(key)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > low or (
                    high is not None and not value < high):
                raise _fail(f"{name}.{key}", value, f"a number in ({low:g}, {high:g})" if high else "a number > 0")
        for key in ("family", "min_seeds", "max_seeds"):
            value = raw.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise _fail(f"{name}.{key}", value, "an integer ≥ 1")
        if raw["max_seeds"] < raw["min_seeds"]:
            raise _fail(f"{name}.max_seeds", raw["max_seeds"], f"≥ min_seeds ({raw['min_seeds']})")
    return Stage(name, kind, settings=settings)


def parse_plan(raw: Any, source: Path | None = None) -> StudyPlan:
    """Check a plan mapping; raises PlanError (one line) on the first problem."""
    if not isinstance(raw, dict):
        raise _fail("plan", raw, "a mapping with name and stages")
    unknown = sorted(set(raw) - set(_PLAN_KEYS))
    if unknown:
        raise PlanError(f"{unknown[0]} is not a key of a study plan; valid: {', '.join(_PLAN_KEYS)}")
    name = raw.get("name")
    if not isinstance(name, str) or not name.isidentifier():
        raise _fail("name", name, "an identifier (letters, digits, _)")
    stages_raw = raw.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise _fail("stages", stages_raw, "a non-empty list of stages")
    stages: list[Stage] = []
    for i, item in enumerate(stages_raw):
        stages.append(_stage(item, i, {s.name for s in stages}))
    if any(s.seeds == "power" for s in stages):
        first_power = next((i for i, s in enumerate(stages) if s.kind == "power"), None)
        first_use = next(i for i, s in enumerate(stages) if s.seeds == "power")
        if first_power is None or first_power > first_use:
            raise PlanError(f"{stages[first_use].name}.seeds='power' needs a power stage before it")
    formats_from = raw.get("formats_from")
    if formats_from is not None and (not isinstance(formats_from, dict) or
                                     set(formats_from) != {"reference", "records"}):
        raise _fail("formats_from", formats_from, "null or {reference: FORMAT, records: FOLDER}")
    for key in ("records", "table", "description"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise _fail(key, raw[key], "a string or null")
    return StudyPlan(name=name, stages=tuple(stages), description=raw.get("description") or "",
                     records=raw.get("records"), table=raw.get("table"),
                     required=_strings("required", raw.get("required")),
                     overrides=_strings("overrides", raw.get("overrides")), formats_from=formats_from,
                     source=source)


def available_plans(folder: Path = STUDY_DIR) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml"))


def load_plan(name_or_path: str, folder: Path = STUDY_DIR) -> StudyPlan:
    """The plan conf/study/NAME.yaml (or a path to a plan file)."""
    path = Path(name_or_path)
    if not path.suffix:
        path = folder / f"{name_or_path}.yaml"
    if not path.is_file():
        raise PlanError(f"study {name_or_path!r} has no plan file ({path}); valid: "
                        f"{', '.join(available_plans(folder)) or 'none'}")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise PlanError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    return parse_plan(raw, path)


def sweep_seed_list(seeds: Sequence[int]) -> str:
    return ",".join(str(s) for s in seeds)

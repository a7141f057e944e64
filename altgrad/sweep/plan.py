"""The jobs a sweep will run, without running them: each job's overrides and its job dir, as Hydra will name it.

``python -m altgrad.sweep.plan experiment=format_ablation [overrides]`` prints the count and the job dirs (a dry run);
the tests use it to check each experiment's job count and that its job dirs are unique and carry the seed.
The expansion is Hydra's own (BasicSweeper's cartesian product of ``hydra.sweeper.params`` and the command line's
sweeps); a job dir is ``hydra.sweep.subdir`` resolved with that job's ``override_dirname`` and group choices.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf

import altgrad.sweep.naming  # noqa: F401  (registers the job-dir resolver the sweep configs use)

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


@dataclass(frozen=True)
class PlannedJob:
    """One job of a sweep: its overrides (as the launcher passes them) and its dir below the sweep dir."""

    overrides: tuple[str, ...]
    subdir: str


def expand(params: dict[str, str] | None, arguments: Sequence[str]) -> list[list[str]]:
    """Every job's override list: the cartesian product of sweep params then command-line arguments (later wins)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = [f"{k}={v}" for k, v in (params or {}).items()] + list(arguments)
    parsed = OverridesParser.create().parse_overrides(lines)
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


@lru_cache(maxsize=4096)
def _parse(line: str) -> Override:
    """One override line, parsed (grids repeat the same lines across many jobs)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(line)


def job_subdir(cfg: DictConfig, overrides: Sequence[str]) -> str:
    """``hydra.sweep.subdir`` of the job with these overrides, given the sweep's composed config (with hydra).

    The template may use the job's ``hydra.job.override_dirname`` and ``hydra.runtime.choices`` (what the named
    experiments use); anything else in it is an error here.
    """
    return _SubdirNamer(cfg)(overrides)


class _SubdirNamer:
    """job_subdir for many jobs of one sweep: the sweep's template, naming rules and group choices read once."""

    def __init__(self, cfg: DictConfig) -> None:
        self.template = OmegaConf.to_container(cfg.hydra.sweep, resolve=False)["subdir"]
        naming = cfg.hydra.job.config.override_dirname
        self.naming = {"exclude_keys": list(naming.exclude_keys), "item_sep": naming.item_sep,
                       "kv_sep": naming.kv_sep}
        self.choices = dict(OmegaConf.to_container(cfg.hydra.runtime.choices))

    def __call__(self, overrides: Sequence[str]) -> str:
        from hydra._internal.config_loader_impl import get_overrides_dirname

        parsed = [_parse(line) for line in overrides]
        choices = self.choices | {o.key_or_group: o.value() for o in parsed if isinstance(o.value(), str)}
        job = OmegaConf.create({"hydra": {
            "job": {"override_dirname": get_overrides_dirname(overrides=parsed, **self.naming)},
            "runtime": {"choices": choices}, "sweep": {"subdir": self.template}}})
        return str(OmegaConf.select(job, "hydra.sweep.subdir", throw_on_missing=True))


def plan(overrides: Sequence[str], conf_dir: Path = CONF_DIR, config_name: str = "train") -> list[PlannedJob]:
    """The jobs of ``python -m altgrad.train OVERRIDES`` run as a multirun (``experiment=NAME`` makes it one)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    task = [o.input_line for o in parsed if not o.is_hydra_override()]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=fixed, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    return plan_config(cfg, task)


def plan_config(cfg: DictConfig, task_overrides: Sequence[str]) -> list[PlannedJob]:
    """The jobs of a sweep from its composed config (with hydra) and the command line's task overrides."""
    params = OmegaConf.to_container(cfg.hydra.sweeper.params, resolve=True) if cfg.hydra.sweeper.get("params") else {}
    jobs = expand({str(k): str(v) for k, v in params.items()}, task_overrides)
    namer = _SubdirNamer(cfg)
    return [PlannedJob(tuple(job), namer(job)) for job in jobs]


def main(argv: list[str]) -> int:
    """Print the number of jobs and each job dir; exit 1 when two jobs would share a dir."""
    jobs = plan(argv)
    for job in jobs:
        print(job.subdir)
    dirs = [j.subdir for j in jobs]
    clashes = sorted({d for d in dirs if dirs.count(d) > 1})
    print(f"{len(jobs)} jobs" + (f"; {len(clashes)} job dirs shared by several jobs: {clashes[:3]}" if clashes else ""))
    return 1 if clashes else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

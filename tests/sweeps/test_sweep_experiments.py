"""Every named experiment composes, its grid expands to the documented jobs, each job gets its own dir."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from altgrad.config import validate
from altgrad.sweep.plan import expand, plan_config
from sweep_helpers import CONF_DIR, EXPERIMENTS, FULL

# jobs = product of the grid's lengths: formats × (families) × seeds
JOBS = {"format_ablation": 15 * 3, "layer_sensitivity": 3 * 6 * 3}
GROUP_KEYS = {"format": "format"}
EIGHT_BIT = ["e0m7", "e1m6", "e3m4", "e4m3", "e5m2", "e7m0"]


@pytest.fixture(scope="module")
def hydra_conf() -> Iterator[None]:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()


_COMPOSED: dict[tuple[str, ...], DictConfig] = {}


def compose_with_hydra(*overrides: str) -> DictConfig:
    """The composed config with its hydra node, as `python -m altgrad.train OVERRIDES` would see it (cached)."""
    if overrides not in _COMPOSED:
        _COMPOSED[overrides] = compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
    return _COMPOSED[overrides]


def sweep_values(cfg: DictConfig) -> dict[str, list[str]]:
    """Each grid key's values, as the sweeper expands them."""
    params = OmegaConf.to_container(cfg.hydra.sweeper.params, resolve=True)
    return {k: [job[0].split("=", 1)[1] for job in expand({k: str(v)}, [])] for k, v in params.items()}


@pytest.mark.parametrize("name", FULL)  # debug variants: the same grid (test_debug_variant_runs_the_same_grid_tiny)
def test_experiment_is_a_multirun_whose_jobs_have_unique_dirs_with_the_seed(hydra_conf: None, name: str) -> None:
    jobs = plan_config(compose_with_hydra(f"experiment={name}"), [f"experiment={name}"])
    assert len(jobs) == JOBS[name]
    dirs = [j.subdir for j in jobs]
    assert len(set(dirs)) == len(dirs), "two jobs would write into the same dir"
    assert all("seed=" in d and "/" not in d and "experiment=" not in d for d in dirs)
    assert all(f"experiment={name}" in j.overrides for j in jobs)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_validates(hydra_conf: None, name: str) -> None:
    cfg = compose_with_hydra(f"experiment={name}")
    assert cfg.hydra.mode == RunMode.MULTIRUN  # `python -m altgrad.train experiment=NAME` needs no -m
    assert cfg.hydra.sweeper.max_batch_size is None  # one batch: a failure cannot stop later jobs
    assert cfg.experiment_name == name
    assert cfg.hydra.sweep.dir.endswith(f"_{name}")  # multirun/DATE/TIME_NAME
    assert {"experiment", "resume_sweep"} <= set(cfg.hydra.job.config.override_dirname.exclude_keys)
    validate(cfg, paths=False)


@pytest.mark.parametrize("name", FULL)
def test_grid_values_are_valid_choices(hydra_conf: None, name: str) -> None:
    cfg = compose_with_hydra(f"experiment={name}")
    loader = GlobalHydra.instance().config_loader()
    values = sweep_values(cfg)
    assert values["seed"] and all(int(s) >= 0 for s in values["seed"])
    for key, vals in values.items():
        if key in GROUP_KEYS:
            options = loader.get_group_options(GROUP_KEYS[key])
            assert set(vals) <= set(options), f"{key}: {sorted(set(vals) - set(options))} are not options"
        elif key == "layer_map.family":
            assert set(vals) <= set(cfg.layer_map.families)
        else:
            assert key == "seed", f"no check for grid key {key}"


def test_experiments_sweep_the_documented_formats(hydra_conf: None) -> None:
    formats = {name: sweep_values(compose_with_hydra(f"experiment={name}"))["format"] for name in FULL}
    presets = ["fp32", "bf16", *EIGHT_BIT, *(f"p3109_p{p}" for p in range(1, 8))]
    assert formats["format_ablation"] == presets
    assert formats["layer_sensitivity"] == EIGHT_BIT


@pytest.mark.parametrize("name", FULL)
def test_debug_variant_runs_the_same_grid_tiny(hydra_conf: None, name: str) -> None:
    full, debug = compose_with_hydra(f"experiment={name}"), compose_with_hydra(f"experiment={name}_debug")
    full_grid, debug_grid = sweep_values(full), sweep_values(debug)
    assert {k: v for k, v in debug_grid.items() if k != "seed"} == {k: v for k, v in full_grid.items() if k != "seed"}
    assert 1 <= len(debug_grid["seed"]) <= 2
    assert debug.trainer.max_steps == 5 and debug.model.n_layer == 1 and list(debug.logger) == ["csv"]
    assert OmegaConf.to_container(debug.optimizer) == OmegaConf.to_container(full.optimizer)
    assert OmegaConf.to_container(debug.quant) == OmegaConf.to_container(full.quant)


def test_experiments_run_the_baseline_adamw_with_fp32_master_weights(hydra_conf: None) -> None:
    default = compose_with_hydra()
    for name in FULL:
        cfg = compose_with_hydra(f"experiment={name}")
        assert OmegaConf.to_container(cfg.optimizer) == OmegaConf.to_container(default.optimizer)
        assert cfg.optimizer.lr == cfg.baseline.lr == default.baseline.lr and cfg.quant.master == "fp32"


def test_layer_sensitivity_quantizes_one_family(hydra_conf: None) -> None:
    cfg = compose_with_hydra("experiment=layer_sensitivity", "layer_map.family=head", "format=e7m0")
    rules = OmegaConf.to_container(cfg.layer_map.base_rules, resolve=True)
    assert rules == [{"match": "*", "weight": None, "input": None, "grad": None},
                     {"match": "lm_head", "weight": "default", "input": "default", "grad": "default"}]
    assert cfg.layer_map.name == "only_head" and cfg.optimizer.name == "adamw" and cfg.quant.master == "fp32"


def test_command_line_sweeps_need_no_dash_m_under_an_experiment() -> None:
    from altgrad.preflight import check_overrides

    assert check_overrides(["experiment=format_ablation_debug", "seed=1,2"], CONF_DIR) is None
    assert "add -m" in check_overrides(["seed=1,2"], CONF_DIR)  # a plain run still asks for -m

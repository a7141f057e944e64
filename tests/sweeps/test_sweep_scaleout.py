"""Scale-out configs: the SLURM example launcher (via -cd conf/local), joblib, and trainer=ddp's devices."""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from altgrad.config import validate
from sweep_helpers import CONF_DIR

LOCAL = f"hydra.searchpath=[file://{CONF_DIR / 'local'}]"  # what `-cd conf/local` does on the command line


@pytest.fixture(scope="module")
def hydra_conf() -> Iterator[None]:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()


def launcher(cfg: DictConfig) -> object:
    """The launcher object Hydra would build (its class, from the composed params; nothing is submitted)."""
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    module, name = params.pop("_target_").rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(**params)


def test_slurm_example_gives_every_job_one_gpu(hydra_conf: None) -> None:
    cfg = compose("train", overrides=[LOCAL, "hydra/launcher=slurm_example", "trainer=gpu",
                                      "experiment=format_ablation"], return_hydra_config=True)
    slurm = cfg.hydra.launcher
    assert slurm._target_.endswith("SlurmLauncher")
    assert (slurm.gpus_per_node, slurm.tasks_per_node, slurm.nodes) == (1, 1, 1)
    assert slurm.submitit_folder.endswith("_format_ablation/.submitit/%j")  # SLURM logs inside the sweep folder
    assert type(launcher(cfg)).__name__ == "SlurmLauncher"
    validate(cfg, paths=False)


def test_slurm_example_is_not_picked_without_the_config_dir(hydra_conf: None) -> None:
    with pytest.raises(Exception, match="slurm_example"):
        compose("train", overrides=["hydra/launcher=slurm_example"], return_hydra_config=True)


def test_joblib_runs_n_jobs_in_parallel(hydra_conf: None) -> None:
    cfg = compose("train", overrides=["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "experiment=format_ablation"],
                  return_hydra_config=True)
    assert cfg.hydra.launcher.n_jobs == 2 and type(launcher(cfg)).__name__ == "JoblibLauncher"


def test_ddp_takes_one_rank_per_slurm_task(hydra_conf: None, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = compose("train", overrides=["trainer=ddp"])
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    assert cfg.trainer.devices == 1  # outside SLURM: never Lightning's own multi-process launcher
    validate(cfg, paths=False)
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4")
    assert cfg.trainer.devices == 4
    assert validate(cfg, paths=False).trainer.devices == 4
    assert (cfg.trainer.accelerator, cfg.trainer.precision, cfg.trainer.compile) == ("gpu", "bf16-mixed", True)

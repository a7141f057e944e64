"""Shared set-up: an offline environment with tmp caches for the tests that run `python -m altgrad.train` in a
subprocess. Nothing in it chooses an implementation: the jobs take the path `make train` takes (quant.kernel=auto,
the native CPU kernel; the optimizers' compiled steps)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def offline_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for `python -m altgrad.train` subprocesses: no network, caches under pytest's tmp."""
    root = tmp_path_factory.mktemp("offline_env")
    return {
        **os.environ,
        "ALTGRAD_CACHE": str(root / "altgrad_cache"),
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(root / "wandb"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(root / "hf_home"),
        "HYDRA_FULL_ERROR": "0",
    }


# Test files whose tests are long, separate processes that share no fixture: `make test` (xdist, `--dist loadscope`,
# which keeps a file's tests on one worker so its module fixtures are built once) sends each of their tests to any
# worker instead. (`--dist loadgroup` with xdist_group marks would say this per file, but xdist 3.8 under pytest 9.2
# no longer groups: pytest-dev/pytest-xdist#1386.)
SPREAD_OVER_WORKERS = frozenset({"tests/study/test_record_rerun.py"})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """loadscope, but a test of a SPREAD_OVER_WORKERS file is a scope of its own."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SpreadingLoadScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.split("::", 1)[0] in SPREAD_OVER_WORKERS:
                return nodeid
            return super()._split_scope(nodeid)

    return SpreadingLoadScope(config, log)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--eurlex", default=None, metavar="DIR",
                     help="the eurlex-en folder (docs/data.md): rerun committed study-2 records and match them "
                          "(make test EURLEX=DIR)")


@pytest.fixture(scope="session")
def eurlex(request: pytest.FixtureRequest) -> str:
    """The eurlex-en folder given with --eurlex; tests that need the real text skip without it."""
    folder = request.config.getoption("--eurlex")
    if not folder:
        pytest.skip("needs the eurlex-en files: run with --eurlex DIR (make test EURLEX=DIR)")
    return str(folder)

"""The committed study records still describe what today's code would run: a study resumed with `+resume_sweep=true`
skips a finished job only when its stored config equals the one composed now (key for key, see sweep.resume), so a
change of a default (a new key, a renamed group) must not silently turn every finished job into "another
configuration". One record per stage is composed again from its own overrides and compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from altgrad.sweep.resume import config_differences

REPO = Path(__file__).resolve().parents[2]
STUDIES = [REPO / "docs" / "results" / study / "runs" for study in ("study-cpu", "study-ongrid")]


def _one_record_per_stage() -> list[Path]:
    """The last record of each stage of each committed study (a tuned stage's last is at its highest lr, an
    evaluation's at a picked lr: both read the tuned-lr tables as committed)."""
    picks = []
    for runs in (r for r in STUDIES if r.is_dir()):
        for stage in sorted(p for p in runs.iterdir() if p.is_dir()):
            jobs = sorted(j for j in stage.iterdir() if (j / "summary.json").is_file())
            if jobs:
                picks.append(jobs[-1])
    return picks


RECORDS = _one_record_per_stage()


@pytest.mark.skipif(not RECORDS, reason="no committed study records")
@pytest.mark.parametrize("record", RECORDS, ids=[f"{r.parents[2].name}/{r.parent.name}/{r.name}" for r in RECORDS])
def test_a_committed_record_composes_to_its_stored_config(record: Path, tmp_path: Path) -> None:
    overrides = [o for o in yaml.safe_load((record / ".hydra" / "overrides.yaml").read_text())
                 if not o.startswith("+resume_sweep")]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[f"paths.output_dir={tmp_path}", *overrides])
    stored = json.loads((record / "summary.json").read_text())["config"]
    current = OmegaConf.to_container(cfg, resolve=True)
    assert config_differences(stored, current) == []

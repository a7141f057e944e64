"""The report's orders and labels come from the registered options (conf/format, conf/optimizer), so every label a
run can record is known and none that cannot occur is listed; records from before format labels are named right."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from altgrad.quant import list_formats
from altgrad.report.load import load_job
from altgrad.report.order import (
    FORMAT_ORDER,
    OPTIMIZER_ORDER,
    REFERENCE_FORMATS,
    STORAGE_ORDER,
    mantissa_bits,
    preset_of,
    recorded_format_label,
)

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"


def composed(group: str) -> dict[str, dict]:
    """Each option of a config group, composed as a run composes it (label as recorded)."""
    options = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
    overrides = {"optimizer": ["quant.master=none"]}.get(group, [])
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return {o: compose("train", overrides=[f"{group}={o}", *overrides])[group] for o in options}


def test_format_order_is_every_registered_label_once_references_first() -> None:
    labels = {o: cfg.label for o, cfg in composed("format").items()}
    assert sorted(FORMAT_ORDER) == sorted(labels.values()) and len(set(FORMAT_ORDER)) == len(FORMAT_ORDER)
    assert labels["bf16_ref"] == "bf16_ref" and labels["bf16"] == "bf16"
    assert FORMAT_ORDER[:4] == ("fp32", "bf16_ref", "bf16", "fp16") == REFERENCE_FORMATS
    eight_bit = [f for f in FORMAT_ORDER if f not in REFERENCE_FORMATS]
    assert eight_bit == [f for f in list_formats() if f in eight_bit]  # the quantization core's preset order
    assert preset_of("bf16_ref") == "bf16" and mantissa_bits("bf16_ref") == 7 and mantissa_bits("fp32") is None


def test_optimizer_order_is_the_labels_runs_record_baseline_first() -> None:
    labels = {o: cfg.get("label") or cfg.name for o, cfg in composed("optimizer").items()}
    assert sorted(OPTIMIZER_ORDER) == sorted(labels.values())
    assert OPTIMIZER_ORDER[0] == "adamw" and "relative" in OPTIMIZER_ORDER and "manifold" not in OPTIMIZER_ORDER


def test_storage_order_names_storages_as_jobs_do() -> None:
    assert STORAGE_ORDER == ("fp32 master", "on-grid nearest", "on-grid stochastic")


@pytest.mark.parametrize(("recorded", "config", "label"), [
    ("bf16", {"name": "bf16", "grad": None}, "bf16_ref"),        # the wide reference, recorded before labels
    ("bf16", {"name": "bf16", "grad": "e5m2"}, "bf16"),
    ("e4m3", {"name": "e4m3", "grad": None}, "e4m3"),            # no registered option: as recorded
    ("bf16_ref", {"name": "bf16", "label": "bf16_ref", "grad": None}, "bf16_ref"),  # today's records
    ("e4m3", None, "e4m3"),
])
def test_records_from_before_format_labels_get_their_option_label(recorded: str, config, label: str) -> None:
    assert recorded_format_label(recorded, config) == label


def test_a_committed_wide_reference_record_reads_as_bf16_ref() -> None:
    job_dir = REPO / "docs" / "results" / "study-cpu" / "runs" / "eval" / "format=bf16_ref,optimizer=adamw,seed=1"
    if not job_dir.is_dir():
        pytest.skip("no committed study records")
    job = load_job(job_dir, job_dir.name)
    assert job.summary["format"] == "bf16" and job.format == "bf16_ref"

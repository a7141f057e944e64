"""`trainer.peak_flops=auto`: the dense 16-bit peak of the GPU by its CUDA name (the `trainer=gpu` preset's MFU), a
number as given, and no MFU with a reason wherever auto cannot know the peak."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_helpers import REPO
from hydra import compose, initialize_config_dir

from altgrad import peak_flops, train
from altgrad.config import RunConfig, validate
from altgrad.peak_flops import dense_16bit_peak, resolve


def composed(tmp_path: Path, *overrides: str) -> RunConfig:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return validate(compose("train", overrides=[f"paths.output_dir={tmp_path}", *overrides]), paths=False)


@pytest.mark.parametrize("name,flops", [
    ("NVIDIA H200", 989e12),
    ("NVIDIA H200 NVL", 835e12),
    ("NVIDIA H100 80GB HBM3", 989e12),  # SXM
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100 80GB PCIe", 312e12),
    ("NVIDIA L40S", 362e12),
    ("NVIDIA L4", 121e12),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_a_gpu_is_looked_up_by_its_cuda_name_at_its_dense_peak(name: str, flops: float | None) -> None:
    assert dense_16bit_peak(name) == flops


def test_auto_leaves_mfu_unlogged_with_the_reason_where_it_cannot_know_the_peak() -> None:
    assert resolve(None, "bf16-mixed", "NVIDIA H200") == (None, "trainer.peak_flops=null: MFU not logged")
    assert resolve(2e14, "32-true", None) == (2e14, "trainer.peak_flops=2e+14")
    assert resolve("auto", "bf16-mixed", "NVIDIA H200")[0] == 989e12
    assert resolve("auto", "16-mixed", "NVIDIA A100-SXM4-40GB")[0] == 312e12
    for precision, name, reason in (("bf16-mixed", None, "on no GPU"),
                                    ("32-true", "NVIDIA H200", "precision 32-true"),
                                    ("bf16-mixed", "NVIDIA GeForce RTX 4090", "does not know 'NVIDIA GeForce")):
        flops, source = resolve("auto", precision, name)
        assert flops is None and reason in source and "MFU not logged" in source and "\n" not in source


def test_the_gpu_preset_reaches_the_module_and_the_summary_at_the_devices_peak(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """trainer=gpu on an H200 divides MFU by 989 TFLOP/s (not an A100's 312) and says so in summary.json."""
    run = composed(tmp_path, "trainer=gpu")
    assert run.trainer.peak_flops == "auto"
    monkeypatch.setattr(train, "cuda_device_name", lambda run: "NVIDIA H200")
    module = train.build_module(run, vocab_size=256)
    assert module.peak_flops == 989e12
    assert module.run_summary["peak_flops"] == {"flops": 989e12, "source": peak_flops.resolve(
        "auto", "bf16-mixed", "NVIDIA H200")[1]}
    monkeypatch.setattr(train, "cuda_device_name", lambda run: None)  # the CPU default: no MFU
    assert train.build_module(composed(tmp_path), vocab_size=256).peak_flops is None

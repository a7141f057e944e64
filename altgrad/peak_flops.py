"""The hardware peak an MFU estimate divides by: `trainer.peak_flops` as a number, null (no MFU), or `auto`, the
dense 16-bit tensor-core peak of the CUDA GPU the run sees, from its name.

Dense figures only: NVIDIA's datasheets list the 16-bit peak "with sparsity" (2:4 structured), twice the dense one, and
a dense model can reach only the dense one (Lightning's `get_available_flops` mixes the two: its H200 entry is the
sparse 2.0e15). bf16 and fp16 share the figure on these chips."""

from __future__ import annotations

from typing import Any

# (lower-case name fragment, dense bf16/fp16 tensor-core FLOP/s), most specific first: `torch.cuda.get_device_name()`
# gives e.g. "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA A100-SXM4-80GB".
DENSE_16BIT: tuple[tuple[str, float], ...] = (
    ("h200 nvl", 835e12),   # H200 NVL datasheet: 1,671 TFLOPS with sparsity
    ("h200", 989e12),       # H200 SXM: 1,979 with sparsity
    ("h100 nvl", 835e12),   # H100 NVL: 1,671 with sparsity
    ("h100 pcie", 756e12),  # H100 PCIe: 1,513 with sparsity
    ("h100", 989e12),       # H100 SXM: 1,979 with sparsity
    ("a100", 312e12),       # A100 SXM and PCIe: 312 dense
    ("l40s", 362e12),       # L40S: 733 with sparsity
    ("l4", 121e12),         # L4: 242 with sparsity
)


def dense_16bit_peak(device_name: str) -> float | None:
    """The table's figure for a GPU by its name, or None when the table does not know it."""
    name = device_name.lower()
    return next((flops for fragment, flops in DENSE_16BIT if fragment in name), None)


def resolve(peak_flops: Any, precision: str, device_name: str | None) -> tuple[float | None, str]:
    """(the peak to use or None, where it came from): a number is used as given; `auto` looks the GPU up when the run
    computes in 16 bits on one (device_name None: no GPU), else leaves MFU unlogged and says why."""
    if peak_flops is None:
        return None, "trainer.peak_flops=null: MFU not logged"
    if peak_flops != "auto":
        return float(peak_flops), f"trainer.peak_flops={float(peak_flops):.4g}"
    if device_name is None:
        return None, "trainer.peak_flops=auto on no GPU: MFU not logged (set trainer.peak_flops to the CPU's peak)"
    if not str(precision).startswith(("bf16-", "16-")):  # trainer.precision's 16-bit choices
        return None, (f"trainer.peak_flops=auto knows 16-bit peaks only, not precision {precision}: MFU not logged "
                      "(set trainer.peak_flops)")
    flops = dense_16bit_peak(device_name)
    if flops is None:
        known = ", ".join(fragment for fragment, _ in DENSE_16BIT)
        return None, (f"trainer.peak_flops=auto does not know {device_name!r} (known: {known}): MFU not logged "
                      "(set trainer.peak_flops to its dense 16-bit peak)")
    return flops, f"trainer.peak_flops=auto: {device_name}'s dense 16-bit peak, {flops:.4g} FLOP/s"

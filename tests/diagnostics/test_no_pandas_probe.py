"""W&B's DataFrame check imports pandas (0.5–1.4 s, once per process, in a training step) the first time a
histogram is logged; the instruments log theirs under ``no_pandas_probe``, which gives the check the same answer
without the import. Run in a fresh interpreter: pandas may already be loaded in the test process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import sys
    import wandb
    from altgrad.callbacks.wandb_values import no_pandas_probe

    run = wandb.init(mode="offline", dir=sys.argv[1], project="probe")
    hist = wandb.Histogram(np_histogram=([1, 2], [0.0, 1.0, 2.0]))
    with no_pandas_probe():
        run.log({"h_probe": hist}, step=1)
    print("probe", "pandas" in sys.modules, wandb.util.pd_available)
    run.log({"h_plain": hist}, step=2)   # W&B alone: the import the probe avoids
    print("plain", "pandas" in sys.modules)
    import pandas
    with no_pandas_probe():        # pandas loaded: the probe steps aside and W&B still finds a DataFrame
        print("frame", wandb.util.pd_available, wandb.util.is_pandas_data_frame(pandas.DataFrame({"a": [1]})))
    run.finish()
""")


def test_a_histogram_logs_without_importing_pandas(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120,
                         env={"WANDB_SILENT": "true", "WANDB_MODE": "offline", "PATH": "/usr/bin:/bin",
                              "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.split(" ", 1)[0] in
                 ("probe", "plain", "frame"))
    assert lines["probe"] == "False True"             # no pandas, and W&B's flag restored
    (record,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    data = record.read_bytes()
    assert b"h_probe" in data and b"histogram" in data  # the histogram was logged
    assert lines["plain"] == "True"                   # without the probe W&B imports it
    assert lines["frame"] == "True True"

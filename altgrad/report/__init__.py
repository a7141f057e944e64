"""Turn sweep folders into evidence: report.md with loss tables, the ULP-aware benefit, failure stages and plots.

``python -m altgrad.report multirun/DATE/TIME [more sweep dirs] [--out DIR]``; see docs/report.md for how to read it.
``write_report`` is imported on first use, so ``altgrad.report.endpoint`` (read by the config check before every
run) loads without matplotlib.
"""

from typing import Any

__all__ = ["write_report"]


def __getattr__(name: str) -> Any:
    if name == "write_report":
        from altgrad.report.document import write_report

        return write_report
    raise AttributeError(f"module 'altgrad.report' has no attribute {name!r}")

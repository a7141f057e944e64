"""Turn sweep folders into evidence: report.md with loss tables, the ULP-aware benefit, failure stages and plots.

``python -m altgrad.report multirun/DATE/TIME [more sweep dirs] [--out DIR]``; see docs/report.md for how to read it.
"""

from altgrad.report.document import write_report

__all__ = ["write_report"]

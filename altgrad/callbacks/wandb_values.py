"""How the instruments hand W&B its non-scalar values (histograms, tables) without W&B's per-process pandas import.

Kept free of torch and Lightning so it imports in a fraction of a second.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_pandas_probe() -> Iterator[None]:
    """W&B checks every non-scalar value it logs for a pandas DataFrame by importing pandas (0.5–1.4 s, once per
    process, in the middle of a training step). No DataFrame can exist before pandas is imported, and W&B's fallback
    recognises one by its type name, so while pandas is not loaded the check is told so: the same answer, no import."""
    util = sys.modules.get("wandb.util")
    if util is None or not hasattr(util, "pd_available") or "pandas" in sys.modules:
        yield
        return
    kept = util.pd_available
    util.pd_available = False
    try:
        yield
    finally:
        util.pd_available = kept

"""Divergence detector: a non-finite loss, or a loss above k × its running minimum for P consecutive steps."""

from __future__ import annotations

import math


class DivergenceDetector:
    """State machine fed one loss per step; ``update`` returns the reason once the run has diverged.

    States: *healthy* (counter 0) → *suspect* (loss > factor × running min; counter counts consecutive steps) →
    *diverged* (non-finite loss, or counter reaches ``patience``). A suspect run that comes back below the
    threshold is healthy again. Once diverged it stays diverged.
    """

    def __init__(self, factor: float = 3.0, patience: int = 20) -> None:
        if not factor > 1.0:
            raise ValueError(f"divergence factor={factor} is not valid; valid: > 1 (loss > factor × running min)")
        if patience < 1:
            raise ValueError(f"divergence patience={patience} is not valid; valid: integer >= 1")
        self.factor = float(factor)
        self.patience = int(patience)
        self.running_min = math.inf
        self.over = 0
        self.reason: str | None = None

    @property
    def diverged(self) -> bool:
        return self.reason is not None

    def would_diverge(self, loss: float) -> bool:
        """Whether ``update(loss)`` would report divergence now (nothing changes)."""
        if self.reason is not None or not math.isfinite(loss):
            return True
        return loss > self.factor * self.running_min and self.over + 1 >= self.patience

    def update(self, loss: float) -> str | None:
        """Feed this step's loss; returns the divergence reason (also kept in ``reason``) or None."""
        if self.reason is not None:
            return self.reason
        if not math.isfinite(loss):
            self.reason = f"non-finite loss ({loss})"
            return self.reason
        if loss > self.factor * self.running_min:
            self.over += 1
            if self.over >= self.patience:
                self.reason = (f"loss {loss:.4g} > {self.factor:g} x running min {self.running_min:.4g} "
                               f"for {self.over} steps")
                return self.reason
        else:
            self.over = 0
        self.running_min = min(self.running_min, loss)
        return None

    def state_dict(self) -> dict:
        return {"running_min": self.running_min, "over": self.over, "reason": self.reason}

    def load_state_dict(self, state: dict) -> None:
        self.running_min = float(state["running_min"])
        self.over = int(state["over"])
        self.reason = state["reason"]

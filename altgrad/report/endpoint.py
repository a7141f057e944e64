"""The primary endpoint a study declares in its experiment file before anything runs, and how the report reads it.

An experiment sets a top-level ``endpoint:`` mapping; every job saves it in summary.json["config"], so the report
analyses exactly what was declared, not what looks best afterwards:

    endpoint:
      metric: final_val_loss        # final_val_loss | best_val_loss
      horizon: 600                  # the step the metric is read at: a completed job that ran fewer steps is flagged
      contrasts:                    # treatment − reference in every format of the family, paired by seed
        - {treatment: "manifold[update]", reference: adamw}
        - {treatment: "manifold[update]", reference: relative}
      primary: 0                    # the contrast that ranks formats ("which format benefits most")
      formats: [e3m4, e4m3, e5m2]   # the family's formats (null: every 8-bit format the sweep ran)
      storage: fp32 master          # the weight storage of both arms
      correction: holm              # holm | bh | none, over contrasts × formats
      alpha: 0.05
      tie_margin: 0.02              # |Δ| below this is a tie, and only an equivalence test (TOST) may say so
      pooled_variance: false        # pool each contrast's seed variance across formats (more df)
      failure_value: initial_val_loss   # the loss a diverged (or never-learning) run enters Δ with

This module only parses and checks (no heavy imports): ``altgrad.config.validate`` calls ``parse_endpoint`` so a
bad declaration stops a run before it starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

METRICS = ("final_val_loss", "best_val_loss")
CORRECTIONS = ("holm", "bh", "none")
FAILURE_VALUES = ("initial_val_loss", "exclude")
"""initial_val_loss: a failed run counts as having learned nothing (its own initial validation loss, else the
largest initial loss in the format); exclude: left out of Δ (survivorship; only for comparison)."""
_KEYS = ("metric", "horizon", "contrasts", "primary", "formats", "storage", "correction", "alpha", "tie_margin",
         "pooled_variance", "failure_value")


@dataclass(frozen=True)
class Contrast:
    """Δ = metric(treatment) − metric(reference), per format, paired by seed (negative: the treatment helps)."""

    treatment: str
    reference: str

    @property
    def name(self) -> str:
        return f"{self.treatment} − {self.reference}"


@dataclass(frozen=True)
class Endpoint:
    """A parsed ``endpoint:`` declaration (see the module docstring for each field)."""

    metric: str
    horizon: int | None
    contrasts: tuple[Contrast, ...]
    primary: int = 0
    formats: tuple[str, ...] | None = None
    storage: str = "fp32 master"
    correction: str = "holm"
    alpha: float = 0.05
    tie_margin: float = 0.01
    pooled_variance: bool = False
    failure_value: str = "initial_val_loss"

    @property
    def primary_contrast(self) -> Contrast:
        return self.contrasts[self.primary]

    def describe(self) -> str:
        """One line naming everything that was declared."""
        fams = "every 8-bit format run" if self.formats is None else ", ".join(self.formats)
        return (f"metric {self.metric} at step {self.horizon if self.horizon is not None else 'end'}; contrasts "
                + "; ".join(f"({i + 1}) {c.name}" + (" [primary]" if i == self.primary else "")
                            for i, c in enumerate(self.contrasts))
                + f"; formats: {fams}; storage {self.storage}; {self.correction} correction at α = {self.alpha:g}; "
                f"tie margin ±{self.tie_margin:g}; "
                + ("pooled" if self.pooled_variance else "per-format") + " variance; failed runs enter as "
                + ("their initial loss" if self.failure_value == "initial_val_loss" else "missing (excluded)"))


def _fail(key: str, value: Any, valid: str) -> ValueError:
    return ValueError(f"endpoint.{key}={value!r} is invalid; valid: {valid}")


def parse_endpoint(raw: Mapping[str, Any]) -> Endpoint:
    """Check a declaration; raises ValueError with one line naming the key, its value and what is valid."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"endpoint={raw!r} is invalid; valid: a mapping with metric, horizon, contrasts, ...")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise ValueError(f"endpoint.{unknown[0]} is not a known key; valid: {', '.join(_KEYS)}")
    metric = raw.get("metric", "final_val_loss")
    if metric not in METRICS:
        raise _fail("metric", metric, ", ".join(METRICS))
    horizon = raw.get("horizon")
    if horizon is not None and (isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1):
        raise _fail("horizon", horizon, "a step count >= 1, or null (the run's last step)")
    items = raw.get("contrasts")
    if not isinstance(items, (list, tuple)) or not items:
        raise _fail("contrasts", items, "a non-empty list of {treatment: LABEL, reference: LABEL}")
    contrasts = []
    for i, item in enumerate(items):
        if (not isinstance(item, Mapping) or set(item) != {"treatment", "reference"}
                or not all(isinstance(item[k], str) and item[k] for k in item)
                or item["treatment"] == item["reference"]):
            raise _fail(f"contrasts[{i}]", item, "{treatment: LABEL, reference: LABEL} with two different "
                        "optimizer labels, e.g. {treatment: 'manifold[update]', reference: adamw}")
        contrasts.append(Contrast(str(item["treatment"]), str(item["reference"])))
    if len(set(contrasts)) != len(contrasts):
        raise _fail("contrasts", items, "distinct contrasts (one appears twice)")
    primary = raw.get("primary", 0)
    if isinstance(primary, bool) or not isinstance(primary, int) or not 0 <= primary < len(contrasts):
        raise _fail("primary", primary, f"an index into contrasts, 0 … {len(contrasts) - 1}")
    formats = raw.get("formats")
    if formats is not None:
        if (not isinstance(formats, (list, tuple)) or not formats
                or not all(isinstance(f, str) and f for f in formats) or len(set(formats)) != len(formats)):
            raise _fail("formats", formats, "null or a non-empty list of distinct format names")
        formats = tuple(formats)
    storage = raw.get("storage", "fp32 master")
    if not isinstance(storage, str) or not (storage == "fp32 master" or storage.startswith("on-grid ")):
        raise _fail("storage", storage, "'fp32 master', 'on-grid nearest' or 'on-grid stochastic'")
    correction = raw.get("correction", "holm")
    if correction not in CORRECTIONS:
        raise _fail("correction", correction, ", ".join(CORRECTIONS))
    alpha = raw.get("alpha", 0.05)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha < 0.5:
        raise _fail("alpha", alpha, "a number in (0, 0.5)")
    margin = raw.get("tie_margin", 0.01)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin > 0:
        raise _fail("tie_margin", margin, "a loss difference > 0")
    pooled = raw.get("pooled_variance", False)
    if not isinstance(pooled, bool):
        raise _fail("pooled_variance", pooled, "true or false")
    failure = raw.get("failure_value", "initial_val_loss")
    if failure not in FAILURE_VALUES:
        raise _fail("failure_value", failure, ", ".join(FAILURE_VALUES))
    return Endpoint(metric, horizon, tuple(contrasts), primary, formats, storage, correction, float(alpha),
                    float(margin), pooled, failure)

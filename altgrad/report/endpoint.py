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

A study whose arms are named (``+arm=NAME``, conf/arm/) declares more, all before its evaluation runs:

      label: arm                    # cells are named by their arm (default: optimizer, the optimizer label)
      contrasts:                    # a contrast may be named, carry its expected sign and its own formats
        - {name: P1, treatment: manifold_sr, reference: relative_sr, expect: negative}
      secondary:                    # a second family (its own correction): the "why" by intervention
        - {name: I1, treatment: adamw_rn, reference: adamw_sr, expect: positive}
      interactions:                 # a difference of two contrasts' Δ, paired by seed: Δ(first) − Δ(second)
        - {name: X1, of: [I1, I2], expect: positive}
      controls:                     # expected ≈ 0: judged by equivalence (TOST at tie_margin) only
        - {name: C1, treatment: manifold_fm, reference: relative_fm, formats: [e4m3]}
      stages:                       # where each format fails: each ladder arm − the reference, paired by seed
        reference: {format: fp32, arm: stage_w}
        ladder: [stage_w, stage_wa, stage_wag, stage_wag_rn, stage_wag_sr]
      recovery:                     # does an arm on the grid recover the update stage: arm − reference, per format
        reference: adamw_fm
        arms: [adamw_rn, adamw_sr, manifold_sr]

``expect`` is ``negative`` (the treatment lowers the loss), ``positive`` or ``none`` (no direction declared).

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
LABELS = ("optimizer", "arm")
EXPECTS = ("negative", "positive", "none")
_KEYS = ("metric", "horizon", "contrasts", "primary", "formats", "storage", "correction", "alpha", "tie_margin",
         "pooled_variance", "failure_value", "label", "secondary", "interactions", "controls", "stages", "recovery")
_CONTRAST_KEYS = {"treatment", "reference", "name", "expect", "formats"}


@dataclass(frozen=True)
class Contrast:
    """Δ = metric(treatment) − metric(reference), per format, paired by seed (negative: the treatment helps)."""

    treatment: str
    reference: str
    label: str | None = None  # a short name declared for it (P1, I2, ...)
    expect: str = "none"  # the sign declared before the runs: negative | positive | none
    formats: tuple[str, ...] | None = None  # its own formats (None: the endpoint's)

    @property
    def name(self) -> str:
        return f"{self.treatment} − {self.reference}"


@dataclass(frozen=True)
class Interaction:
    """Δ(first) − Δ(second) of two named contrasts, paired by seed within each format."""

    label: str
    first: str
    second: str
    expect: str = "none"


@dataclass(frozen=True)
class Ladder:
    """Failure stages: each ladder arm (in ``format``) − the reference cell, paired by seed."""

    reference_format: str
    reference_arm: str
    arms: tuple[str, ...]


@dataclass(frozen=True)
class Recovery:
    """Whether arms on the grid recover what storage costs: each arm − ``reference`` in the same format."""

    reference: str
    arms: tuple[str, ...]


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
    label: str = "optimizer"
    secondary: tuple[Contrast, ...] = ()
    interactions: tuple[Interaction, ...] = ()
    controls: tuple[Contrast, ...] = ()
    stages: Ladder | None = None
    recovery: Recovery | None = None

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
                + ("their initial loss" if self.failure_value == "initial_val_loss" else "missing (excluded)")
                + (self._arm_parts() if self.label == "arm" else ""))

    def _arm_parts(self) -> str:
        """What an arm-labelled declaration adds: its named contrasts' signs and formats, the secondary family, its
        interactions, controls, the failure-stage ladder and recovery."""
        def named(c: Contrast) -> str:
            sign = f" (expect {c.expect})" if c.expect != "none" else ""
            return (f"{c.label} " if c.label else "") + c.name + sign + (f" in {', '.join(c.formats)}" if c.formats
                                                                          else "")

        parts = ["; cells named by arm (compared whatever their storage)",
                 "; named: " + ", ".join(named(c) for c in self.contrasts if c.label) if any(
                     c.label for c in self.contrasts) else ""]
        if self.secondary:
            parts.append("; secondary family: " + ", ".join(named(c) for c in self.secondary))
        if self.interactions:
            parts.append("; interactions: " + ", ".join(
                f"{x.label} = Δ({x.first}) − Δ({x.second})" + (f" (expect {x.expect})" if x.expect != "none" else "")
                for x in self.interactions))
        if self.controls:
            parts.append("; controls (TOST only): " + ", ".join(named(c) for c in self.controls))
        if self.stages is not None:
            parts.append(f"; failure stages {' → '.join(self.stages.arms)} against {self.stages.reference_format} "
                         f"{self.stages.reference_arm}")
        if self.recovery is not None:
            parts.append(f"; recovery of {', '.join(self.recovery.arms)} against {self.recovery.reference}")
        return "".join(parts)


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
    contrasts = _contrasts("contrasts", items)
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
    label = raw.get("label", "optimizer")
    if label not in LABELS:
        raise _fail("label", label, ", ".join(LABELS))
    secondary = _contrasts("secondary", raw.get("secondary") or [])
    controls = _contrasts("controls", raw.get("controls") or [])
    named = {c.label: c for c in (*contrasts, *secondary, *controls) if c.label}
    if len(named) != sum(1 for c in (*contrasts, *secondary, *controls) if c.label):
        raise _fail("contrasts", [c.label for c in (*contrasts, *secondary, *controls)], "distinct contrast names")
    interactions = []
    for i, item in enumerate(raw.get("interactions") or []):
        of = item.get("of") if isinstance(item, Mapping) else None
        if (not isinstance(item, Mapping) or not set(item) <= {"name", "of", "expect"} or not isinstance(
                item.get("name"), str) or not isinstance(of, (list, tuple)) or len(of) != 2
                or any(x not in named for x in of) or item.get("expect", "none") not in EXPECTS):
            raise _fail(f"interactions[{i}]", item, "{name: X, of: [NAMED_CONTRAST, NAMED_CONTRAST], expect: "
                        f"{'|'.join(EXPECTS)}}} naming two declared contrasts ({', '.join(named) or 'none named'})")
        interactions.append(Interaction(item["name"], str(of[0]), str(of[1]), item.get("expect", "none")))
    stages = raw.get("stages")
    ladder = None
    if stages is not None:
        ref = stages.get("reference") if isinstance(stages, Mapping) else None
        arms = stages.get("ladder") if isinstance(stages, Mapping) else None
        if (not isinstance(ref, Mapping) or set(ref) != {"format", "arm"} or not isinstance(arms, (list, tuple))
                or not arms or not all(isinstance(a, str) and a for a in arms)):
            raise _fail("stages", stages, "{reference: {format: F, arm: A}, ladder: [ARM, ...]}")
        ladder = Ladder(str(ref["format"]), str(ref["arm"]), tuple(arms))
    recovery = raw.get("recovery")
    recover = None
    if recovery is not None:
        arms = recovery.get("arms") if isinstance(recovery, Mapping) else None
        if (not isinstance(recovery, Mapping) or set(recovery) != {"reference", "arms"}
                or not isinstance(recovery["reference"], str) or not isinstance(arms, (list, tuple)) or not arms):
            raise _fail("recovery", recovery, "{reference: ARM, arms: [ARM, ...]}")
        recover = Recovery(recovery["reference"], tuple(str(a) for a in arms))
    return Endpoint(metric, horizon, tuple(contrasts), primary, formats, storage, correction, float(alpha),
                    float(margin), pooled, failure, label, secondary, tuple(interactions), controls, ladder, recover)


def _contrasts(key: str, items: Any) -> tuple[Contrast, ...]:
    if not isinstance(items, (list, tuple)):
        raise _fail(key, items, "a list of {treatment: LABEL, reference: LABEL}")
    out = []
    for i, item in enumerate(items):
        if (not isinstance(item, Mapping) or not {"treatment", "reference"} <= set(item) <= _CONTRAST_KEYS
                or not all(isinstance(item[k], str) and item[k] for k in ("treatment", "reference"))
                or item["treatment"] == item["reference"]):
            raise _fail(f"{key}[{i}]", item, "{treatment: LABEL, reference: LABEL} with two different "
                        "labels, e.g. {treatment: 'manifold[update]', reference: adamw}, optionally with name, "
                        "expect and formats")
        expect = item.get("expect", "none")
        if expect not in EXPECTS:
            raise _fail(f"{key}[{i}].expect", expect, ", ".join(EXPECTS))
        formats = item.get("formats")
        if formats is not None and (not isinstance(formats, (list, tuple)) or not formats
                                    or not all(isinstance(f, str) and f for f in formats)):
            raise _fail(f"{key}[{i}].formats", formats, "null or a non-empty list of format names")
        out.append(Contrast(str(item["treatment"]), str(item["reference"]), item.get("name"), expect,
                            tuple(formats) if formats else None))
    if len({(c.treatment, c.reference, c.formats) for c in out}) != len(out):
        raise _fail(key, items, "distinct contrasts (one appears twice)")
    return tuple(out)

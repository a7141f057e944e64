"""The declared analysis: each contrast of the endpoint in each format, paired by seed, corrected over the family.

What a job contributes (its *value*): a completed job its endpoint metric; a diverged job (non-finite or exploding
loss, or the divergence rule's "never learned") counts as a failure and enters with ``failure_value`` — by default its
initial validation loss, i.e. it learned nothing — so failures weigh against their arm instead of dropping out;
a crashed (``failed``) or missing job is no result and leaves its seed unpaired. A completed job that stopped short
of the declared horizon is not comparable and is left out, with a note.

Per (contrast, format): Δ per seed = value(treatment) − value(reference); a t-test of the mean Δ (per-format
variance, or pooled across the family's formats when declared); the family's p-values adjusted by the declared
correction; a verdict that is only ever one of

- ``benefit`` / ``harm``: adjusted p < α and the sign of the mean;
- ``tie``: the equivalence test (TOST, margin ±tie_margin) rejects at the adjusted level;
- ``not established``: neither. Where the equivalence test could not reach its level with the seeds run, the
  comparison says how many seed pairs it would need (``equivalence_seeds``): "not established" is then a
  statement about the evidence, never evidence that there is no difference.

Which format benefits most (primary contrast): a format A with a ``benefit`` verdict whose paired (1 − α) CI of
Δ(A) − Δ(B) lies below 0 against every other format B of the family (an intersection–union test: no further
correction). The seed-bootstrap probability of being the top format is given for every format, as a description.
Formats that give the same grid under the runs' scaling are one arm: the first in report order stands for them.

An arm is one learning rate: the one its experiment resolved by itself. Jobs of the declaration that set their lr
by hand (a Hydra ``optimizer.lr=`` override, e.g. a rerun of the reference at a neighbouring lr) are kept out of the
family as ``off_lr`` runs, for the lr sensitivity (altgrad/report/sensitivity.py); when that does not single out
one lr, the arm is left out with a note.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from altgrad.report.cells import mixed_configurations, setup_differences
from altgrad.report.endpoint import Contrast, Endpoint, parse_endpoint
from altgrad.report.load import Job
from altgrad.report.order import FORMAT_ORDER, REFERENCE_FORMATS, rank
from altgrad.report.stats import (CORRECTIONS, TTest, bootstrap_top_rank, pooled_sd, single_test_level, t_test,
                                  tost_seeds_needed)

SameGrid = Callable[[str, str], bool]
VERDICTS = ("benefit", "harm", "tie", "not established")


def declared_endpoints(jobs: Sequence[Job]) -> list[tuple[Endpoint, list[Job]]]:
    """The distinct declarations found in the jobs' saved configs, each with its jobs (report order kept).

    A declaration that does not parse (an old or hand-edited config) is skipped; ``endpoint_problems`` says why."""
    groups: list[tuple[Endpoint, list[Job]]] = []
    for job in jobs:
        raw = job.config.get("endpoint")
        if raw is None:
            continue
        try:
            ep = parse_endpoint(raw)
        except ValueError:
            continue
        for known, members in groups:
            if known == ep:
                members.append(job)
                break
        else:
            groups.append((ep, [job]))
    return groups


def endpoint_problems(jobs: Sequence[Job]) -> list[str]:
    """One line per job whose saved endpoint declaration is invalid."""
    out = []
    for job in jobs:
        raw = job.config.get("endpoint")
        if raw is None:
            continue
        try:
            parse_endpoint(raw)
        except ValueError as exc:
            out.append(f"{job.name}: {exc}")
    return out


@dataclass(frozen=True)
class Arm:
    """One format × optimizer label in the endpoint's storage: its jobs, per-seed values and failure counts."""

    format: str
    label: str
    jobs: tuple[Job, ...]
    values: dict[int, float]
    n_failures: int          # diverged (including never learned) among its jobs
    n_no_result: int         # crashed, missing, or short of the horizon
    lrs: tuple[float, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Comparison:
    """One contrast in one format."""

    contrast: Contrast
    format: str
    treatment: Arm | None
    reference: Arm | None
    deltas: dict[int, float]
    test: TTest
    confidence: float
    p_adjusted: float = 1.0
    tost_adjusted: float = 1.0
    verdict: str = "not established"
    why_missing: str | None = None
    equivalence_seeds: int | None = None     # seed pairs the TOST needs for 80 % power at a true Δ of 0

    @property
    def ci(self) -> tuple[float, float] | None:
        return self.test.ci(self.confidence)

    @property
    def paired_sd(self) -> float | None:
        """The SD of Δ the test used (its own, or the pooled one)."""
        t = self.test
        return None if t.se is None or t.n < 1 else t.se * math.sqrt(t.n)

    @property
    def underpowered(self) -> bool:
        """Not established, and the equivalence test had fewer seed pairs than it needs: no verdict either way."""
        return (self.verdict == "not established" and self.equivalence_seeds is not None
                and len(self.deltas) < self.equivalence_seeds)


@dataclass(frozen=True)
class Ranking:
    """Which format benefits most on the primary contrast, or that this is not established."""

    winner: str | None
    leader: str | None                           # lowest mean Δ (a point estimate, whatever its evidence)
    versus: dict[str, TTest]                     # leader's Δ − other's Δ, paired by seed
    top_probability: dict[str, float]            # seed bootstrap: P(format has the lowest mean Δ)
    confidence: float
    leads: bool = False                          # the lowest Δ lies below zero: a lead, not only the lowest harm


@dataclass(frozen=True)
class StudyResult:
    endpoint: Endpoint
    jobs: tuple[Job, ...]
    formats: tuple[str, ...]                     # the family's formats, one per distinct grid
    merged: dict[str, tuple[str, ...]]           # representative → formats that share its grid
    missing_formats: tuple[str, ...]             # declared but not run
    comparisons: tuple[Comparison, ...]
    ranking: Ranking
    arms: dict[tuple[str, str], Arm] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    outside: tuple[Comparison, ...] = ()         # formats run but not declared (e.g. a wide reference): descriptive
    off_lr: tuple[Job, ...] = ()                 # the declaration's runs at an lr set by hand: out of the family
    secondary: tuple[Comparison, ...] = ()       # the second family (its own correction): contrasts, interactions
    controls: tuple[Comparison, ...] = ()        # expected ≈ 0: judged by TOST only (their own correction)
    ladder_jobs: tuple[Job, ...] = ()            # the failure-stage ladder's runs (arm-labelled declarations)

    @property
    def single_test_level(self) -> float:
        """The level each test of the family is sure to be held to under the declared correction."""
        ep = self.endpoint
        return single_test_level(ep.correction, ep.alpha, len(self.comparisons))

    @property
    def declared_jobs(self) -> tuple[Job, ...]:
        """The declaration's jobs without its off-lr runs: the evaluation as declared."""
        off = {id(j) for j in self.off_lr}
        return tuple(j for j in self.jobs if id(j) not in off)

    def of(self, contrast: Contrast) -> list[Comparison]:
        return [c for c in (*self.comparisons, *self.secondary, *self.controls) if c.contrast == contrast]

    def family_level(self, family: Sequence[Comparison]) -> float:
        """The level each test of one family (primary, secondary or controls) is sure to be held to."""
        ep = self.endpoint
        return single_test_level(ep.correction, ep.alpha, len(family))


def label_of(job: Job, ep: Endpoint) -> str:
    """The name a declaration compares a job by: its arm (``label: arm``) or its optimizer label."""
    return job.arm if ep.label == "arm" else job.optimizer_label


def declared_arms(ep: Endpoint) -> tuple[str, ...]:
    """Every arm the declaration's contrasts, secondary contrasts, controls and recovery name (not the ladder)."""
    names = [lab for c in (*ep.contrasts, *ep.secondary, *ep.controls) for lab in (c.treatment, c.reference)]
    if ep.recovery is not None:
        names += [ep.recovery.reference, *ep.recovery.arms]
    return tuple(dict.fromkeys(names))


def ladder_arms(ep: Endpoint) -> tuple[str, ...]:
    """The failure-stage ladder's arms, its reference first (none when no ladder is declared)."""
    if ep.stages is None:
        return ()
    return tuple(dict.fromkeys((ep.stages.reference_arm, *ep.stages.arms)))


def run_value(job: Job, ep: Endpoint) -> tuple[float | None, str]:
    """What a job contributes to Δ, (value, kind): kind is completed, failure, short or none."""
    if job.state == "completed":
        steps = job.summary.get("steps")
        if ep.horizon is not None and isinstance(steps, int) and steps < ep.horizon:
            return None, "short"
        v = job.final_loss if ep.metric == "final_val_loss" else job.best_loss
        return v, "completed" if v is not None else "none"
    if job.state == "diverged":
        if ep.failure_value == "exclude":
            return None, "failure"
        v = job.summary.get("initial_val_loss")
        return (float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None), "failure"
    return None, "none"


def lr_set_by_hand(job: Job) -> bool:
    """Whether the job's Hydra overrides set its learning rate (``optimizer.lr=…``) instead of its experiment."""
    return any(o.lstrip("+~").partition("=")[0] == "optimizer.lr" for o in job.overrides)


def split_off_lr(jobs: Sequence[Job]) -> tuple[list[Job], list[Job]]:
    """(the arm's jobs, runs at a hand-set lr kept out): when an arm's jobs ran several lrs and those whose lr the
    experiment resolved itself share one lr, the others are off-lr runs; otherwise nothing is split off."""
    if len({j.lr for j in jobs}) < 2:
        return list(jobs), []
    own = [j for j in jobs if not lr_set_by_hand(j)]
    if own and len({j.lr for j in own}) == 1:
        lr = own[0].lr
        return [j for j in jobs if j.lr == lr], [j for j in jobs if j.lr != lr]
    return list(jobs), []


def build_arm(fmt: str, label: str, jobs: Sequence[Job], ep: Endpoint, fallback_failure: float | None) -> Arm:
    """Per-seed values of one arm; a failure without its own initial loss takes ``fallback_failure``."""
    per_seed: dict[int, list[float]] = {}
    failures = no_result = 0
    notes = []
    for job in jobs:
        v, kind = run_value(job, ep)
        if kind == "failure":
            failures += 1
            if v is None and ep.failure_value != "exclude":
                v = fallback_failure
        elif kind == "short":
            no_result += 1
            notes.append(f"{job.name} stopped at step {job.summary.get('steps')} < horizon {ep.horizon}")
        elif kind == "none":
            no_result += 1
        if v is not None and job.seed is not None:
            per_seed.setdefault(job.seed, []).append(v)
    lrs = tuple(sorted({j.lr for j in jobs if j.lr is not None}))
    mixed = mixed_configurations([j for j in jobs if j.config])
    if len(lrs) > 1:
        notes.append(f"{fmt} {label} ran {len(lrs)} learning rates ({', '.join(f'{x:g}' for x in lrs)}); the "
                     "declared analysis needs one per arm (tune on separate seeds), so this arm is left out")
        per_seed = {}
    elif mixed:
        shown = ", ".join(mixed[:4]) + (f", … ({len(mixed)} keys)" if len(mixed) > 4 else "")
        notes.append(f"{fmt} {label} pools runs of different configurations (they differ in {shown}); the declared "
                     "analysis needs one configuration per arm, so this arm is left out")
        per_seed = {}
    return Arm(fmt, label, tuple(jobs), {s: math.fsum(v) / len(v) for s, v in per_seed.items()}, failures,
               no_result, lrs, tuple(notes))


def optimizer_of_arm(arm: Arm | None) -> dict:
    """The optimizer config an arm's runs share (empty when they ran none or several)."""
    configs = [j.config.get("optimizer") for j in (arm.jobs if arm is not None else ())]
    first = configs[0] if configs else None
    return first if isinstance(first, dict) and all(c == first for c in configs) else {}


def lr_of_arm(arm: Arm) -> float | None:
    """The arm's one learning rate (None when it ran none or several)."""
    return arm.lrs[0] if len(arm.lrs) == 1 else None


def grid_classes(formats: Sequence[str], same_grid: SameGrid | None) -> dict[str, tuple[str, ...]]:
    """Representative (first in report order) → every format sharing its grid."""
    ordered = sorted(set(formats), key=lambda f: rank(FORMAT_ORDER, f))
    classes: dict[str, list[str]] = {}
    for f in ordered:
        rep = next((r for r in classes if same_grid is not None and same_grid(r, f)), None)
        if rep is None:
            classes[f] = [f]
        else:
            classes[rep].append(f)
    return {r: tuple(m) for r, m in classes.items()}


def analyse(ep: Endpoint, jobs: Sequence[Job], same_grid: SameGrid | None = None) -> StudyResult:
    """The declared analysis of one endpoint over its jobs.

    An optimizer-labelled declaration reads the jobs of its declared storage; an arm-labelled one (``label: arm``)
    compares arms whatever their storage, and keeps its failure-stage ladder's runs apart (``ladder_jobs``)."""
    ladder_jobs: tuple[Job, ...] = ()
    if ep.label == "arm":
        named, ladder = set(declared_arms(ep)), set(ladder_arms(ep))
        ladder_jobs = tuple(j for j in jobs if j.arm in ladder and j.arm not in named)
        jobs = tuple(j for j in jobs if j.arm in named)
    else:
        jobs = tuple(j for j in jobs if j.storage == ep.storage)
    ran = sorted({j.format for j in jobs if j.format not in REFERENCE_FORMATS}, key=lambda f: rank(FORMAT_ORDER, f))
    declared = list(ep.formats) if ep.formats is not None else ran
    own = [f for c in (*ep.contrasts, *ep.secondary, *ep.controls) for f in (c.formats or ()) if f not in declared]
    every = grid_classes([*declared, *own], same_grid)   # the family's formats and those only a contrast names
    rep_of = {m: r for r, ms in every.items() for m in ms}
    classes = {r: ms for r, ms in every.items() if any(m in declared for m in ms)}
    formats = tuple(classes)
    merged = {r: m for r, m in classes.items() if len(m) > 1}
    missing = tuple(r for r, m in classes.items() if not any(f in ran for f in m))  # a grid no declared format ran
    notes: list[str] = []
    # a merged class is analysed through its representative's runs, or the first member that ran
    source = {r: next((f for f in m if f in ran), r) for r, m in every.items()}

    labels = sorted({lab for c in (*ep.contrasts, *ep.secondary, *ep.controls) for lab in (c.treatment, c.reference)})
    arms: dict[tuple[str, str], Arm] = {}
    off_lr: list[Job] = []
    for rep in every:
        fmt = source[rep]
        fjobs = [j for j in jobs if j.format == fmt]
        initials = [v for v in (j.summary.get("initial_val_loss") for j in fjobs)
                    if isinstance(v, (int, float)) and math.isfinite(v)]
        fallback = max(initials) if initials else None
        for label in labels:
            mine, off = split_off_lr([j for j in fjobs if label_of(j, ep) == label])
            if rep not in classes and not mine and not off:
                continue  # a format only some contrast names, without runs of this arm
            off_lr += off
            arm = build_arm(rep, label, mine, ep, fallback)
            arms[(rep, label)] = arm
            notes.extend(arm.notes)

    def contrast_formats(contrast: Contrast) -> tuple[str, ...]:
        if contrast.formats is None:
            return formats
        return tuple(dict.fromkeys(rep_of.get(f, f) for f in contrast.formats))

    confidence = 1.0 - ep.alpha
    comparisons = _family(ep, ep.contrasts, contrast_formats, arms, confidence, pooled=ep.pooled_variance)
    secondary = _family(ep, ep.secondary, contrast_formats, arms, confidence, pooled=False,
                        interactions=_interaction_rows(ep, ep.secondary, contrast_formats, arms))
    controls = _family(ep, ep.controls, contrast_formats, arms, confidence, pooled=False, equivalence_only=True)

    ranking = rank_formats([c for c in comparisons if c.contrast == ep.primary_contrast], ep.alpha)
    covered = {f for m in every.values() for f in m}
    outside = []
    contrast = ep.primary_contrast
    for fmt in sorted({j.format for j in jobs} - covered, key=lambda f: rank(FORMAT_ORDER, f)):
        fjobs = [j for j in jobs if j.format == fmt]
        split = {lab: split_off_lr([j for j in fjobs if label_of(j, ep) == lab])
                 for lab in (contrast.treatment, contrast.reference)}
        if ep.label == "arm" and not any(runs for runs, _ in split.values()):
            continue  # another family's arm ran here; the primary contrast has nothing in this format
        off_lr += [j for _, off in split.values() for j in off]
        t, r = (build_arm(fmt, lab, split[lab][0], ep, None) for lab in (contrast.treatment, contrast.reference))
        deltas = {s: t.values[s] - r.values[s] for s in t.values if s in r.values}
        test = t_test(list(deltas.values()))
        outside.append(Comparison(contrast, fmt, t, r, deltas, test, confidence, test.p_value or 1.0, 1.0,
                                  "outside the family"))
    if off_lr:
        notes.append(_off_lr_note(off_lr, ep))
    return StudyResult(ep, jobs, formats, merged, missing, tuple(comparisons), ranking, arms, tuple(notes),
                       tuple(outside), tuple(off_lr), tuple(secondary), tuple(controls), ladder_jobs)


_Row = tuple[Contrast, str, Arm | None, Arm | None, dict[int, float], str | None]


def _contrast_rows(contrasts: Sequence[Contrast], formats_of: Callable[[Contrast], tuple[str, ...]],
                   arms: dict[tuple[str, str], Arm]) -> list[_Row]:
    """Per contrast and format: the two arms, Δ per seed (paired) and why there is no test, if there is none."""
    rows: list[_Row] = []
    for contrast in contrasts:
        for rep in formats_of(contrast):
            t, r = arms.get((rep, contrast.treatment)), arms.get((rep, contrast.reference))
            why = None
            if t is None or not t.jobs:
                why = f"no {contrast.treatment} runs"
            elif r is None or not r.jobs:
                why = f"no {contrast.reference} runs"
            else:
                apart = setup_differences([*t.jobs, *r.jobs])
                if apart:
                    why = "the arms ran different setups (" + ", ".join(apart[:4]) + ")"
            deltas = {} if why else {s: t.values[s] - r.values[s] for s in t.values if s in r.values}
            if why is None and len(deltas) < 2:
                why = f"{len(deltas)} seed pair(s)"
            rows.append((contrast, rep, t, r, deltas, why))
    return rows


def interaction_contrast(first: str, second: str, label: str, expect: str) -> Contrast:
    """An interaction as a contrast of two contrasts: Δ(first) − Δ(second), named by its declared name."""
    return Contrast(f"Δ({first})", f"Δ({second})", label, expect)


def _interaction_rows(ep: Endpoint, contrasts: Sequence[Contrast],
                      formats_of: Callable[[Contrast], tuple[str, ...]],
                      arms: dict[tuple[str, str], Arm]) -> list[_Row]:
    """Per interaction and format both its contrasts cover: the per-seed double difference Δ(first) − Δ(second)."""
    named = {c.label: c for c in (*ep.contrasts, *ep.secondary, *ep.controls) if c.label}
    rows: list[_Row] = []
    for x in ep.interactions:
        a, b = named[x.first], named[x.second]
        da = {rep: (d, why) for _, rep, _, _, d, why in _contrast_rows([a], formats_of, arms)}
        db = {rep: (d, why) for _, rep, _, _, d, why in _contrast_rows([b], formats_of, arms)}
        contrast = interaction_contrast(x.first, x.second, x.label, x.expect)
        for rep in (f for f in da if f in db):
            (d1, w1), (d2, w2) = da[rep], db[rep]
            why = next((f"{n}: {w}" for n, w in ((x.first, w1), (x.second, w2)) if w and not w.endswith("pair(s)")),
                       None)
            deltas = {} if why else {s: d1[s] - d2[s] for s in d1 if s in d2}
            if why is None and len(deltas) < 2:
                why = f"{len(deltas)} seed pair(s)"
            rows.append((contrast, rep, None, None, deltas, why))
    return rows


def _family(ep: Endpoint, contrasts: Sequence[Contrast], formats_of: Callable[[Contrast], tuple[str, ...]],
            arms: dict[tuple[str, str], Arm], confidence: float, *, pooled: bool,
            interactions: Sequence[_Row] = (), equivalence_only: bool = False) -> list[Comparison]:
    """One family's tests, corrected together: contrasts × their formats (and interactions × formats).

    ``equivalence_only`` (controls): the verdict is ``tie`` when the corrected TOST rejects, else ``not
    established``; a difference is never claimed from a control."""
    raw = _contrast_rows(contrasts, formats_of, arms) + list(interactions)
    if not raw:
        return []
    pooled_by: dict[Contrast, tuple[float, float] | None] = {}
    if pooled:
        for contrast in contrasts:
            pooled_by[contrast] = pooled_sd([list(d.values()) for c, _, _, _, d, _ in raw if c == contrast])
    tests = [t_test(list(d.values()), pooled_by.get(c)) for c, _, _, _, d, _ in raw]
    adjust = CORRECTIONS[ep.correction]
    p_adj = adjust([t.p_value for t in tests])
    tost_adj = adjust([t.tost_p(ep.tie_margin) for t in tests])
    level = single_test_level(ep.correction, ep.alpha, len(tests))
    out = []
    for (contrast, rep, t, r, deltas, why), test, pa, ta in zip(raw, tests, p_adj, tost_adj):
        if not equivalence_only and test.mean is not None and pa < ep.alpha:
            verdict = "benefit" if test.mean < 0 else "harm"
        elif ta < ep.alpha:
            verdict = "tie"
        else:
            verdict = "not established"
        sd = None if test.se is None else test.se * math.sqrt(test.n)
        seeds = tost_seeds_needed(sd, ep.tie_margin, level) if sd is not None else None
        out.append(Comparison(contrast, rep, t, r, deltas, test, confidence, pa, ta, verdict, why, seeds))
    return out


def missing_parts(result: StudyResult) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """What the declaration asks for that no record holds yet: (arm, formats, the parts that need it), in the
    declaration's order. Contrasts (primary, secondary, controls) need both arms in each of their formats; the
    failure-stage ladder its every arm in each family format and its reference cell; recovery its reference in each
    family format and each listed arm somewhere (an arm the plan runs in one format only is not missing elsewhere)."""
    ep = result.endpoint
    ran = {(j.format, j.arm if ep.label == "arm" else j.optimizer_label) for j in (*result.jobs, *result.ladder_jobs)}
    family = [f for fs in ((result.merged.get(r) or (r,)) for r in result.formats) for f in fs]

    def has(fmt: str, arm: str) -> bool:
        members = next((m for r, m in result.merged.items() if fmt in m or fmt == r), (fmt,))
        return any((f, arm) in ran for f in members)

    wanted: dict[tuple[str, str], list[str]] = {}
    for c in (*ep.contrasts, *ep.secondary, *ep.controls):
        for fmt in (c.formats or tuple(family)):
            for arm in (c.treatment, c.reference):
                wanted.setdefault((arm, fmt), []).append(c.label or c.name)
    if ep.stages is not None:
        wanted.setdefault((ep.stages.reference_arm, ep.stages.reference_format), []).append("failure stages")
        for arm in ep.stages.arms:
            for fmt in family:
                wanted.setdefault((arm, fmt), []).append("failure stages")
    if ep.recovery is not None:
        for fmt in family:
            wanted.setdefault((ep.recovery.reference, fmt), []).append("recovery")
        for arm in ep.recovery.arms:
            if not any(a == arm for _, a in ran):
                for fmt in family:
                    wanted.setdefault((arm, fmt), []).append("recovery")
    by_arm: dict[str, tuple[list[str], list[str]]] = {}
    for (arm, fmt), parts in wanted.items():
        if has(fmt, arm):
            continue
        fmts, needs = by_arm.setdefault(arm, ([], []))
        if fmt not in fmts:
            fmts.append(fmt)
        needs += [p for p in parts if p not in needs]
    return [(arm, tuple(sorted(f, key=lambda x: rank(FORMAT_ORDER, x))), tuple(n)) for arm, (f, n) in by_arm.items()]


def sign_check(c: Comparison) -> str:
    """The observed sign beside the declared one: ``as declared``, ``against the declaration`` (a corrected
    difference of the other sign), ``not established`` (no corrected difference) or ``none declared``."""
    expect = c.contrast.expect
    if expect == "none":
        return "none declared"
    if c.verdict not in ("benefit", "harm"):
        return "not established"
    observed = "negative" if c.verdict == "benefit" else "positive"
    return "as declared" if observed == expect else "against the declaration"


def _off_lr_note(jobs: Sequence[Job], ep: Endpoint) -> str:
    groups: dict[tuple[str, float | None], list[str]] = {}
    for job in jobs:
        fmts = groups.setdefault((label_of(job, ep), job.lr), [])
        if job.format not in fmts:
            fmts.append(job.format)
    return (f"{len(jobs)} run(s) of the declaration set their lr by hand and are kept out of the declared analysis "
            "(lr sensitivity): " + "; ".join(f"{label} at lr {lr:g} in {', '.join(fmts)}"
                                             for (label, lr), fmts in groups.items()))


def rank_formats(primary: Sequence[Comparison], alpha: float) -> Ranking:
    """The format that benefits most on the primary contrast, if the evidence says so (see the module docstring)."""
    confidence = 1.0 - alpha
    usable = [c for c in primary if c.test.mean is not None and len(c.deltas) >= 2]
    if not usable:
        return Ranking(None, None, {}, {}, confidence)
    leader = min(usable, key=lambda c: c.test.mean)
    versus = {}
    for other in usable:
        if other is leader:
            continue
        seeds = [s for s in leader.deltas if s in other.deltas]
        versus[other.format] = t_test([leader.deltas[s] - other.deltas[s] for s in seeds])
    separated = all((ci := v.ci(confidence)) is not None and ci[1] < 0 for v in versus.values())
    winner = leader.format if leader.verdict == "benefit" and versus and separated else None
    top = bootstrap_top_rank({c.format: c.deltas for c in usable})
    return Ranking(winner, leader.format, versus, top, confidence, leads=leader.test.mean < 0)

"""Group jobs into cells and order them the way the report reads.

A cell is one configuration run with several seeds: its jobs share their whole resolved configuration except the
seed and the keys that only say where a run is written or how it is shown (`configuration`). Each configuration gets
a stable hash; the report shows it, with the keys that set it apart, wherever two cells would otherwise look alike.
A cell's *setup* is its configuration without the optimizer and the weight storage: the context in which optimizers
are compared with their AdamW baseline.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from altgrad.report.load import Job
from altgrad.resume_check import flatten
from altgrad.report.order import FORMAT_ORDER, OPTIMIZER_ORDER, STAGE_ORDER, STORAGE_ORDER, rank
from altgrad.report.stages import stage_of
from altgrad.report.stats import Summary, summarize

CONTEXT_FIELDS = ("experiment", "model", "data", "layer_map", "format", "storage", "stage", "setup")
"""What must match for two cells to be compared (everything but the optimizer and its learning rate)."""
CELL_FIELDS = CONTEXT_FIELDS + ("optimizer_label", "lr", "config")
SHOWN_ALWAYS = ("format", "optimizer_label", "storage")
HASHED_FIELDS = ("setup", "config")
"""Shown only where two cells agree on every other field (their label then names the keys that differ)."""

BASELINE_OPTIMIZER = "adamw"

# Keys of summary.json["config"] that never make two jobs different configurations (fnmatch patterns on dotted
# keys; a pattern also covers the keys below it). Each says where a run is written, how it is shown or checkpointed,
# or how fast it goes, and none changes a number the report reads (tests/faults/test_cells.py runs the proof):
LOCATION_KEYS = (
    "paths", "hydra", "ckpt_path", "run_name", "resume_sweep", "resume_with_new_config",
    "logger",                               # loggers (CSV, W&B: folders, projects, modes) only record
    "data.cache_dir", "data.num_workers",   # where tokens are cached, how many processes load them
    "trainer.checkpoint_every_n_steps",     # how often last.ckpt is written (saving consumes no random number)
    "trainer.progress_refresh", "trainer.sample_tokens",  # the console: progress bar, the closing sample
    "trainer.keep_freed_memory", "trainer.peak_flops",    # the allocator's policy; the MFU estimate's peak
    "trainer.profiler",                     # Lightning's profiler times the hooks; the same bits
    "tuned_lr",                             # a lookup table: the lrs a run took from it are in optimizer.* / baseline.*
    "endpoint",                             # the analysis a study declares, not what a run computes
    "quant.kernel",                         # how quantizer calls run: the same bits on every road (tests/quant)
    "format.label",                         # a name for the format option; what it names is in format.*
)
# Deliberately NOT location keys: trainer.val_check_interval (best_val_loss is the minimum over the validations run,
# and a divergence is caught at one), trainer.log_every_n_steps (the instruments' interval interpolates it),
# optimizer.kernel (the compiled and eager steps differ by ~1e-6; auto and native compare as compiled, the same
# bits: resume_check.SAME_BITS), and everything else under trainer (precision, compile, devices, clipping, ...).
DATA_LOCATIONS = ("data.path", "data.dir")
"""Where a data source reads its files (data=local, data=folder): not identity once the files' sha256 are recorded."""
SEED_KEY = "seed"
"""Every key named seed (seed, data.seed, callbacks.*.seed): what tells the replicates of one cell apart."""
COMPARED_KEYS = ("arm", "optimizer", "baseline", "quant.master", "quant.storage_rounding")
"""What a cell's setup leaves out: the arm (its name, the optimizer, AdamW's lr in baseline.lr) and the weight
storage: what the report compares within one setup."""


def _covered(key: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, p) or fnmatch.fnmatchcase(key, p + ".*") for p in patterns)


def configuration(job: Job) -> dict[str, Any]:
    """The job's configuration as compared between jobs: its resolved config flattened to dotted keys, without the
    seeds and LOCATION_KEYS. Where the run recorded its data files' sha256 (summary.json ``data_files``), the data is
    identified by them (file name and content), not by the folder it was read from: a study moved to another
    machine still pools. A job without a recorded config is identified by its overrides."""
    config = job.config
    if not config:
        flat = {f"override.{k}": v for k, v in _overrides(job).items()}
    else:
        flat = flatten(config)  # as the resume checks compare it: keys added later filled with what older runs ran
    out = {k: v for k, v in flat.items()
           if k.rsplit(".", 1)[-1] != SEED_KEY and not _covered(k.removeprefix("override."), LOCATION_KEYS)}
    files = job.summary.get("data_files")
    if isinstance(files, Mapping) and files:
        paths = [str(p) for p in files]
        for key in [k for k, v in out.items() if k.startswith("data.") and isinstance(v, str)]:
            where = out[key].rstrip("/")
            if key in DATA_LOCATIONS or (where and any(p == where or p.startswith(where + "/") for p in paths)):
                del out[key]  # the folder or files the recorded files were read from
        out["data_files"] = sorted((os.path.basename(str(p)), str(sha)) for p, sha in files.items())
    return out


def _overrides(job: Job) -> dict[str, str]:
    out = {}
    for item in job.overrides:
        key, sep, value = item.partition("=")
        if sep:
            out[key.lstrip("+~")] = value
    return out


def stable_hash(values: Mapping[str, Any]) -> str:
    """8 hex digits of the sha256 of `values` (keys sorted, JSON): the same configuration hashes the same in every
    report, on every machine."""
    text = json.dumps(sorted(values.items()), default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def setup_of(config: Mapping[str, Any]) -> dict[str, Any]:
    """A configuration without COMPARED_KEYS: what the arms of one comparison share."""
    return {k: v for k, v in config.items() if not _covered(k, COMPARED_KEYS)}


def differing_keys(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The keys whose values are not the same in every one of `configs` (a key some lack counts), sorted."""
    keys = sorted(set().union(*configs)) if configs else []
    return [k for k in keys
            if len({json.dumps(c[k], default=str) if k in c else "<absent>" for c in configs}) > 1]


def _labels(configs: Mapping[str, Mapping[str, Any]], peers: Iterable[Sequence[str]]) -> dict[str, str]:
    """hash -> a label naming what sets its configuration apart from the others in each group of `peers` (hashes
    that share every other cell field), e.g. ``model.n_embd=32 · 1a2b3c4d``; just the hash where it stands alone."""
    shown: dict[str, list[str]] = {h: [] for h in configs}
    for group in peers:
        group = sorted(set(group))
        if len(group) < 2:
            continue
        keys = differing_keys([configs[h] for h in group])
        for h in group:
            for k in keys:
                part = f"{k}={configs[h].get(k, '<absent>')}"
                if part not in shown[h]:
                    shown[h].append(part)
    labels = {}
    for h, parts in shown.items():
        text = ", ".join(parts[:3]) + (f", … ({len(parts)} keys)" if len(parts) > 3 else "")
        labels[h] = f"{text} · {h}" if text else h
    return labels


def job_field(job: Job, name: str) -> Any:
    """The value of one cell field for a job (setup and config: their hashes)."""
    if name == "stage":
        return stage_of(job)
    if name == "optimizer_label":  # a study arm where the run recorded one (conf/arm/), else the optimizer label
        return job.arm
    if name in ("format", "storage", "lr"):
        return getattr(job, name)
    if name == "config":
        return stable_hash(configuration(job))
    if name == "setup":
        return stable_hash(setup_of(configuration(job)))
    value = job.get(name)
    return None if value is None else str(value)


@dataclass(frozen=True)
class Cell:
    """Jobs sharing every CELL_FIELDS value; losses are per seed (duplicates of a seed averaged)."""

    key: tuple[tuple[str, Any], ...]
    jobs: tuple[Job, ...]

    def __getitem__(self, name: str) -> Any:
        return dict(self.key)[name]

    @property
    def context(self) -> tuple[tuple[str, Any], ...]:
        return tuple((k, v) for k, v in self.key if k in CONTEXT_FIELDS)

    @property
    def is_baseline(self) -> bool:
        return any(j.optimizer == BASELINE_OPTIMIZER for j in self.jobs)

    def count(self, *states: str) -> int:
        return sum(j.state in states for j in self.jobs)

    def losses_by_seed(self, which: str = "final") -> dict[int, float]:
        per_seed: dict[int, list[float]] = {}
        for job in self.jobs:
            loss = job.final_loss if which == "final" else job.best_loss
            if loss is not None and job.seed is not None:
                per_seed.setdefault(job.seed, []).append(loss)
        return {s: sum(v) / len(v) for s, v in per_seed.items()}

    def loss_summary(self, which: str = "final") -> Summary:
        return summarize(list(self.losses_by_seed(which).values()))

    def diagnostic_summary(self, name: str) -> Summary:
        return summarize([j.diagnostics[name] for j in self.jobs if name in j.diagnostics])


def group_cells(jobs: Iterable[Job]) -> list[Cell]:
    """Cells of the jobs that have a summary (completed, diverged, failed), one per configuration, sorted by report
    order. The setup and config fields hold a label: the hash, after the keys that set it apart from cells that
    agree on every other field."""
    plain = [f for f in CELL_FIELDS if f not in HASHED_FIELDS]
    rows = []
    configs: dict[str, dict[str, Any]] = {}
    for job in jobs:
        if job.state in ("completed", "diverged", "failed"):
            config = configuration(job)
            setup = setup_of(config)
            hashes = {"config": stable_hash(config), "setup": stable_hash(setup)}
            configs.setdefault(hashes["config"], config)
            configs.setdefault(hashes["setup"], setup)
            rows.append((job, tuple(job_field(job, f) for f in plain), hashes))
    # Label each hash against the hashes that agree with it on every other field of their own key.
    setup_peers: dict[tuple, list[str]] = {}
    config_peers: dict[tuple, list[str]] = {}
    for _, values, hashes in rows:
        context = tuple(v for f, v in zip(plain, values) if f in CONTEXT_FIELDS)
        setup_peers.setdefault(context, []).append(hashes["setup"])
        config_peers.setdefault((values, hashes["setup"]), []).append(hashes["config"])
    setup_labels = _labels(configs, setup_peers.values())
    config_labels = _labels(configs, config_peers.values())
    groups: dict[tuple[tuple[str, Any], ...], list[Job]] = {}
    for job, values, hashes in rows:
        named = dict(zip(plain, values), setup=setup_labels[hashes["setup"]], config=config_labels[hashes["config"]])
        groups.setdefault(tuple((f, named[f]) for f in CELL_FIELDS), []).append(job)
    cells = [Cell(k, tuple(v)) for k, v in groups.items()]
    return sorted(cells, key=lambda c: sort_key(dict(c.key)))


def varying_fields(cells: Sequence[Cell], fields: Sequence[str] = CELL_FIELDS) -> list[str]:
    """The fields a table must show: the always-shown ones, any other that takes more than one value, and setup or
    config only where two cells agree on every other field shown (the label then tells them apart)."""
    shown = [f for f in fields if f not in HASHED_FIELDS and (f in SHOWN_ALWAYS or len({c[f] for c in cells}) > 1)]
    for hashed in (f for f in HASHED_FIELDS if f in fields):
        # config is set apart against cells of the same setup: a differing setup already differs in config
        rest = [f for f in fields if f != hashed
                and (f not in HASHED_FIELDS or HASHED_FIELDS.index(f) < HASHED_FIELDS.index(hashed))]
        seen: dict[tuple, set[Any]] = {}
        for c in cells:
            seen.setdefault(tuple(c[f] for f in rest), set()).add(c[hashed])
        if any(len(v) > 1 for v in seen.values()):
            shown.append(hashed)
    return [f for f in fields if f in shown]


def setup_differences(jobs: Sequence[Job]) -> list[str]:
    """The keys in which the setups of `jobs` (those with a recorded config) differ: [] when two arms of a contrast
    ran in the same setup, as a comparison needs."""
    setups = {stable_hash(s): s for s in (setup_of(configuration(j)) for j in jobs if j.config)}
    return differing_keys(list(setups.values())) if len(setups) > 1 else []


def mixed_configurations(jobs: Sequence[Job]) -> list[str]:
    """The keys in which the configurations of `jobs` differ ([] when they are one configuration): what a report
    must say where a requested grouping (an arm of a declared endpoint, say) pools them."""
    configs = {stable_hash(c): c for c in (configuration(j) for j in jobs)}
    return differing_keys(list(configs.values())) if len(configs) > 1 else []


def sort_key(values: dict[str, Any]) -> tuple:
    """Report order: canonical formats, optimizers, storages and stages first, then by name; lr ascending; cells
    that differ only in their setup or config by its label."""
    return (
        tuple(str(values.get(f) or "") for f in ("experiment", "model", "data", "layer_map")),
        rank(FORMAT_ORDER, values.get("format")),
        rank(STORAGE_ORDER, values.get("storage")),
        rank(STAGE_ORDER, values.get("stage")),
        str(values.get("setup") or ""),
        rank(OPTIMIZER_ORDER, values.get("optimizer_label")),
        values.get("lr") if values.get("lr") is not None else float("inf"),
        str(values.get("config") or ""),
    )


def describe(values: dict[str, Any], fields: Sequence[str]) -> str:
    """A short label such as ``manifold[update], on-grid nearest, lr=0.003`` for the given fields."""
    parts = []
    for f in fields:
        v = values.get(f)
        if v is None:
            continue
        if f == "lr":
            parts.append(f"lr={v:g}")
        elif f in HASHED_FIELDS:
            parts.append(f"[{v}]")
        else:
            parts.append(f"{f}={v}" if f in ("experiment", "model", "data") else str(v))
    return ", ".join(parts)

"""One learning rate per optimizer from an lr_scan sweep, for the experiments that compare optimizers.

For each optimizer label, every scanned lr at which all of the optimizer's runs completed (none diverged, failed
or is missing) is a candidate; its score is the mean over formats of the mean final validation loss over seeds
(formats weigh equally, however many seeds each has). The pick is the candidate with the lowest score, among
those scanned in every format the optimizer was scanned in. ``--write`` puts each pick into the ``optimizer.lr``
line of the bundle in conf/experiment/optim/ whose runs carry that label.

    python -m altgrad.sweep.lr_pick multirun/DATE/TIME_lr_scan [--write] [--optim-dir conf/experiment/optim]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from altgrad.report.load import Job, load_sweeps

OPTIM_DIR = Path(__file__).resolve().parents[2] / "conf" / "experiment" / "optim"
"""The optimizer bundles experiments use: conf/experiment/optim/NAME.yaml (optimizer preset + its lr)."""
_LR_LINE = re.compile(r"^(?P<indent>[ \t]+)lr:[^\n]*$", re.MULTILINE)


@dataclass(frozen=True)
class LrPick:
    """The chosen lr of one optimizer (None: no candidate), its score, the candidates, and the lrs at which some run
    did not complete (diverged, failed, or missing)."""

    optimizer_label: str
    lr: float | None
    score: float | None
    formats: tuple[str, ...]
    candidates: tuple[float, ...]
    unstable: tuple[float, ...]

    def describe(self) -> str:
        if self.lr is None:
            return (f"{self.optimizer_label}: no lr completed in every format {list(self.formats)} "
                    f"(unstable: {[f'{x:g}' for x in self.unstable]})")
        return (f"{self.optimizer_label}: lr={self.lr:g} (mean final val loss {self.score:.4f} over "
                f"{len(self.formats)} formats; {len(self.candidates)} stable lrs, unstable: "
                f"{[f'{x:g}' for x in self.unstable]})")


def pick_learning_rates(jobs: Iterable[Job]) -> dict[str, LrPick]:
    """The pick for every optimizer label among the jobs (see the module docstring for the rule)."""
    runs: dict[str, dict[float, list[Job]]] = defaultdict(lambda: defaultdict(list))
    for job in jobs:
        if job.lr is not None:
            runs[job.optimizer_label][job.lr].append(job)
    picks = {}
    for label, by_lr in sorted(runs.items()):
        formats = tuple(sorted({j.format for js in by_lr.values() for j in js}))
        scores: dict[float, float] = {}
        unstable = []
        for lr, js in sorted(by_lr.items()):
            if any(j.state != "completed" or j.final_loss is None for j in js):
                unstable.append(lr)
                continue
            per_format: dict[str, list[float]] = defaultdict(list)
            for j in js:
                per_format[j.format].append(float(j.final_loss))
            if set(per_format) == set(formats):
                scores[lr] = sum(sum(v) / len(v) for v in per_format.values()) / len(per_format)
        best = min(scores, key=lambda lr: (scores[lr], lr)) if scores else None
        picks[label] = LrPick(label, best, scores.get(best) if best is not None else None, formats,
                              tuple(sorted(scores)), tuple(unstable))
    return picks


def bundle_labels(optim_dir: Path = OPTIM_DIR) -> dict[str, Path]:
    """optimizer label (as summary.json records it) → bundle file, for every <optim_dir>/*.yaml.

    Each bundle is composed the way an experiment uses it (``+experiment/optim=NAME`` on train.yaml of the conf
    tree holding optim_dir), so the label is the one its runs report.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    conf_dir = optim_dir.resolve().parents[1]
    out = {}
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            for path in sorted(optim_dir.glob("*.yaml")):
                cfg = compose(config_name="train", overrides=[f"+experiment/optim={path.stem}"])
                out[str(cfg.optimizer.get("label") or cfg.optimizer.name)] = path
    finally:
        GlobalHydra.instance().clear()
    return out


def write_lr(path: Path, lr: float, note: str) -> None:
    """Replace the bundle's `  lr: ...` line (under optimizer:) with the picked lr and where it came from."""
    text = path.read_text()
    if len(_LR_LINE.findall(text)) != 1:
        raise ValueError(f"{path} must hold exactly one indented `lr:` line (under optimizer:) to be rewritten")
    value = f"{lr:.6g}"
    value += ".0" if value.isdigit() else ""  # 3 → 3.0: a float, like every other lr in the tree
    path.write_text(_LR_LINE.sub(lambda m: f"{m['indent']}lr: {value}  # {note}", text))


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m altgrad.sweep.lr_pick", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dirs", nargs="+", metavar="SWEEP_DIR", help="lr_scan multirun folder(s)")
    parser.add_argument("--write", action="store_true", help="put the picks into the optimizer bundles")
    parser.add_argument("--optim-dir", type=Path, default=OPTIM_DIR, help="folder of the optimizer bundles")
    args = parser.parse_args(list(argv))
    try:
        picks = pick_learning_rates(load_sweeps(args.sweep_dirs).jobs)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not picks:
        print("error: no job with a learning rate in the given sweep folders", file=sys.stderr)
        return 2
    bundles = bundle_labels(args.optim_dir)
    for pick in picks.values():
        print(pick.describe())
        if args.write and pick.lr is not None:
            if pick.optimizer_label not in bundles:
                print(f"  no bundle in {args.optim_dir} has optimizer.label {pick.optimizer_label!r}; not written")
                continue
            note = f"lr_scan pick ({', '.join(args.sweep_dirs)}): mean final val loss {pick.score:.4f}"
            write_lr(bundles[pick.optimizer_label], pick.lr, note)
            print(f"  written to {bundles[pick.optimizer_label]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

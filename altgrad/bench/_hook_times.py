"""Wall time of every diagnostics hook inside one training job, by kind of step, timed without a sampler.

    python -m altgrad.bench._hook_times OUT.json [--every 10,50] -- TRAIN_OVERRIDES...

Runs ``python -m altgrad.train TRAIN_OVERRIDES`` in this process with a ``perf_counter`` pair around each hook that
the callbacks of ``altgrad/callbacks/`` define (``on_*``, and the optimizer post-hooks ``_after_optimizer_step``) and
around the module's ``configure_gradient_clipping``; at fit end it writes OUT.json (every call's seconds per hook,
every step's seconds from ``altgrad.module.JobClock``) and prints, per hook, ms a step over the run and the median
ms of its calls on each kind of step: steps that are a multiple of none of ``--every``, of the first only, of the
second, ... (step = call number, for hooks called once a step). A sampling profiler takes part of a core that torch's
second thread needs (``_step_samples`` is read at one thread only); this reads the job at any thread count, at the
cost of two clock reads a hook.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import json
import pkgutil
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HOOK_NAMES = ("_after_optimizer_step",)  # hooks the callbacks register on the optimizer (not Lightning's on_*)


def callback_classes() -> list[type]:
    """The Lightning callbacks defined in altgrad.callbacks' modules."""
    import lightning as L

    import altgrad.callbacks as package

    found = []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        found += [c for c in vars(module).values()
                  if inspect.isclass(c) and issubclass(c, L.Callback) and c.__module__ == module.__name__]
    return found


def timed(owner: type, name: str, record: dict[str, list[float]], label: str) -> Callable[[], None]:
    """Wrap ``owner.name`` (defined on ``owner`` or inherited) so each call appends its seconds to record[label];
    returns the undo."""
    own = vars(owner).get(name)
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            record[label].append(time.perf_counter() - start)

    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, own) if own is not None else delattr(owner, name)


def install(record: dict[str, list[float]], classes: Sequence[type]) -> Callable[[], None]:
    """Time every hook the ``classes`` define themselves, and the module's clipping; returns the undo of all."""
    from altgrad.module import AltGradModule

    undo = [timed(AltGradModule, "configure_gradient_clipping", record, "module.configure_gradient_clipping")]
    for cls in classes:
        for name, value in list(vars(cls).items()):
            if callable(value) and (name.startswith("on_") or name in HOOK_NAMES):
                undo.append(timed(cls, name, record, f"{cls.__name__}.{name}"))

    def undo_all() -> None:
        for u in reversed(undo):
            u()

    return undo_all


def kind(step: int, every: Sequence[int]) -> int:
    """0 for a step that is a multiple of none of ``every``, else 1 + the index of the largest interval it is a
    multiple of (``every`` ascending)."""
    return max((i + 1 for i, n in enumerate(every) if step % n == 0), default=0)


def summarize(record: dict[str, list[float]], steps: int, every: Sequence[int]
              ) -> list[tuple[str, float, list[float | None] | None, int]]:
    """(hook, ms a step over the run, median ms of its calls per kind of step or None for hooks not called once a
    step, calls), largest first."""
    if steps < 1:
        raise ValueError(f"steps={steps} is not valid; valid: the job's steps, >= 1")
    rows = []
    for label, seconds in record.items():
        medians = None
        if len(seconds) == steps:
            by_kind: list[list[float]] = [[] for _ in range(len(every) + 1)]
            for number, s in enumerate(seconds, 1):
                by_kind[kind(number, every)].append(s)
            medians = [1000 * statistics.median(v) if v else None for v in by_kind]
        rows.append((label, 1000 * sum(seconds) / steps, medians, len(seconds)))
    return sorted(rows, key=lambda r: -r[1])


def table(rows: list[tuple[str, float, list[float | None] | None, int]], every: Sequence[int]) -> str:
    """The rows as a Markdown table."""
    kinds = ["other steps"] + [f"every {n}th" for n in every]
    lines = ["| hook | ms a step | " + " | ".join(f"median ms, {k}" for k in kinds) + " | calls |",
             "|---|---:|" + "---:|" * len(kinds) + "---:|"]
    for label, per_step, medians, calls in rows:
        cells = ["" if m is None else f"{m:.3f}" for m in (medians or [None] * len(kinds))]
        lines.append(f"| `{label}` | {per_step:.3f} | " + " | ".join(cells) + f" | {calls} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    overrides: list[str] = []
    if "--" in args:
        at = args.index("--")
        args, overrides = args[:at], args[at + 1:]
    parser = argparse.ArgumentParser(prog="python -m altgrad.bench._hook_times", description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="the JSON file to write")
    parser.add_argument("--every", default="10,50", help="the logging intervals that name kinds of step (10,50)")
    opts = parser.parse_args(args)
    try:
        every = sorted(int(n) for n in opts.every.split(","))
        if not every or every[0] < 1:
            raise ValueError
    except ValueError:
        print(f"error: --every {opts.every!r} is not valid; valid: intervals >= 1, comma-separated (10,50)",
              file=sys.stderr)
        return 2
    if not opts.out.parent.is_dir():
        print(f"error: {opts.out}: no folder {opts.out.parent} to write it in; valid: a path in an existing folder",
              file=sys.stderr)
        return 2
    import runpy

    import altgrad.module as module

    record: dict[str, list[float]] = defaultdict(list)
    undo = install(record, callback_classes())
    summary = module.JobClock.summary

    def write(clock: Any, fit_end: float) -> dict:
        steps = [s for s, _ in clock.steps]
        opts.out.write_text(json.dumps({"overrides": overrides, "every": every, "step_seconds": steps,
                                        "hooks": dict(record)}))
        print(table(summarize(record, len(steps), every), every), flush=True)
        return summary(clock, fit_end)

    module.JobClock.summary = write
    sys.argv = ["altgrad.train", *overrides]
    try:
        runpy.run_module("altgrad.train", run_name="__main__", alter_sys=True)
    finally:
        module.JobClock.summary = summary
        undo()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a training step's time goes by a sampling profiler: a job's steps against the plain loop's, part by part.

    python -m altgrad.bench._step_samples RAW --kind job|loop --steps N [--rate HZ]

RAW is py-spy's raw output (``py-spy record --nonblocking -r HZ -f raw -o RAW -- <command>``: one line per distinct
stack, ``frame;frame;...;leaf COUNT``, each frame ``function (file:line)``) of one training process: a job (``python
-m altgrad.train``, ``--kind job``) or the job bench's plain loop (``python -m altgrad.bench._reference_loop``,
``--kind loop``). Only samples inside the training steps count (the job's ``_TrainingEpochLoop``, the loop's ``run``;
validation and imports left out), each charged to the part its innermost Python frame belongs to: a torch op's C time
shows under the Python frame that called it, so the parts separate the kernels both processes run (backward, the
Linear layers (quantized ones: their autograd node), the rest of the forward, the optimizer, the grad-norm clip) from
what only a job adds (Lightning's own Python, the diagnostics callbacks). Printed: ms a step per part (samples ÷ rate
÷ steps); with ``--callbacks``, also each callback's hooks with what they call (torch ops, quantizer calls) included.
py-spy is not a dependency of altgrad (``pip install py-spy`` to rerun); ``--nonblocking`` reads the process without
pausing it.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

# parts, in the order they are printed
PARTS = ("backward", "linear", "other forward", "optimizer", "grad norm", "lightning", "callbacks", "rest")
# the frame that encloses a training step, by kind of process
STEP_FRAME = {"job": "training_epoch_loop.py", "loop": "run (altgrad/bench/_reference_loop.py"}
OUTSIDE = ("_find_and_load", "evaluation_loop", "evaluate (altgrad/bench/_reference_loop.py")  # imports, validation


def stacks(lines: Iterable[str]) -> Iterator[tuple[list[str], int]]:
    """(frames outermost first, sample count) of each line of a raw py-spy file; blank lines skipped (a sample
    without Python frames, e.g. of a thread in C alone, has no frames)."""
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            raise ValueError(f"line {number} is not 'frame;...;frame COUNT' (py-spy's raw format): {line[:80]!r}")
        yield (stack.split(";") if stack else []), int(count)


def in_step(frames: list[str], kind: str) -> bool:
    """Whether a sample was taken inside a training step of a ``kind`` process (job or loop)."""
    stack = ";".join(frames)
    return STEP_FRAME[kind] in stack and not any(o in stack for o in OUTSIDE)


def frame_path(frame: str) -> str:
    """The file of a frame ``function (file:line)``."""
    return frame.rpartition(" (")[2].rsplit(":", 1)[0]


def part(leaf: str) -> str:
    """The part of a step that an innermost frame ``function (file:line)`` belongs to."""
    function, path = leaf.rpartition(" (")[0], frame_path(leaf)
    if function == "_engine_run_backward":
        return "backward"
    if path.endswith(("torch/nn/modules/linear.py", "altgrad/quant/linear_node.py")):  # plain or quantized Linear
        return "linear"
    if "torch/optim/" in path:
        return "optimizer"
    if path.endswith("torch/nn/utils/clip_grad.py"):
        return "grad norm"
    if path.endswith("altgrad/model.py") or "torch/nn/" in path:
        return "other forward"
    if path.startswith("lightning/") or "/lightning/" in path:
        return "lightning"
    if "altgrad/callbacks/" in path:
        return "callbacks"
    return "rest"


def _tally(lines: Iterable[str], kind: str, steps: int, rate: float, key: Callable[[list[str]], str | None]
           ) -> tuple[Counter[str], float]:
    """Samples inside the steps counted by ``key(frames)`` (None: not counted), and ms a step per sample."""
    if kind not in STEP_FRAME:
        raise ValueError(f"kind={kind!r} is not valid; valid: {', '.join(STEP_FRAME)}")
    counts: Counter[str] = Counter()
    for frames, count in stacks(lines):
        name = key(frames) if in_step(frames, kind) else None
        if name is not None:
            counts[name] += count
    return counts, 1000.0 / (rate * steps)


def ms_per_step(lines: Iterable[str], kind: str, steps: int, rate: float) -> dict[str, float]:
    """Each part's ms a step, and "all" (the in-step samples)."""
    counts, scale = _tally(lines, kind, steps, rate, lambda frames: part(frames[-1]))  # in a step: frames not empty
    out = {p: counts[p] * scale for p in PARTS}
    out["all"] = sum(counts.values()) * scale
    return out


def _outermost_callback(frames: list[str]) -> str | None:
    paths = (frame_path(f) for f in frames)
    return next((p.rsplit("/", 1)[-1].removesuffix(".py") for p in paths if "altgrad/callbacks/" in p), None)


def per_callback(lines: Iterable[str], kind: str, steps: int, rate: float) -> dict[str, float]:
    """ms a step inside each callback's hooks, what they call included (each sample charged to the outermost
    ``altgrad/callbacks/<name>.py`` frame of its stack), by callback module name, largest first."""
    counts, scale = _tally(lines, kind, steps, rate, _outermost_callback)
    return {name: n * scale for name, n in counts.most_common()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m altgrad.bench._step_samples", description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path, help="py-spy's raw output (-f raw) of one training process")
    parser.add_argument("--kind", required=True, choices=sorted(STEP_FRAME), help="a job or the plain loop")
    parser.add_argument("--steps", required=True, type=int, help="the process's training steps (trainer.max_steps)")
    parser.add_argument("--rate", type=float, default=100.0, help="py-spy's sampling rate, Hz (-r)")
    parser.add_argument("--callbacks", action="store_true",
                        help="also each callback's hooks, what they call included (ms a step)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.rate <= 0:
        parser.error(f"--steps {args.steps} --rate {args.rate}: valid: steps >= 1, rate > 0")
    if not args.raw.is_file():
        parser.error(f"{args.raw}: no such file; valid: the file py-spy record -f raw -o wrote")
    lines = args.raw.read_text().splitlines()
    try:
        parts = ms_per_step(lines, args.kind, args.steps, args.rate)
        hooks = per_callback(lines, args.kind, args.steps, args.rate) if args.callbacks else {}
    except ValueError as err:
        parser.error(f"{args.raw}: {err}")
    print(f"{args.raw.name}: all {parts['all']:.2f} ms a step | "
          + " | ".join(f"{p} {parts[p]:.2f}" for p in PARTS))
    if args.callbacks:
        print(f"{args.raw.name}: callbacks' hooks, what they call included: {sum(hooks.values()):.2f} ms a step | "
              + (" | ".join(f"{name} {ms:.2f}" for name, ms in hooks.items()) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

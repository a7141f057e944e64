"""``python -m altgrad.study NAME``: carry out the study conf/study/NAME.yaml; rerun the same command to resume.

    python -m altgrad.study ongrid --set data.dir=/path/to/eurlex-en --jobs 2   # make study
    python -m altgrad.study study_cpu --jobs 2                                   # the first CPU study (finished)
    python -m altgrad.study study_cpu_debug --root DIR --records DIR --out DIR   # its pipeline at debug size
    python -m altgrad.study evidence_gpu --budget-s 540                          # GPU confirmation, in chunks

Exit codes: 0 done, 1 a job failed (rerun to retry it), 2 a refusal or a configuration error, 3 the time budget
ran out (the running jobs checkpointed: rerun to go on), 128 + N stopped by signal N (the same); one line on
stderr says which.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from altgrad.study.driver import Study, StudyStop, best_and_worst
from altgrad.study.plan import REPO, PlanError, available_plans, load_plan
from altgrad.study.sweeps import DriverInterrupted


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m altgrad.study", description=__doc__.split("\n\n")[0])
    parser.add_argument("plan", help=f"a plan in conf/study/ ({', '.join(available_plans())}) or a plan file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting every job gets (the plan's `required` keys, e.g. data.dir=PATH)")
    parser.add_argument("--formats", default=None,
                        help="with formats_from: the formats beside the reference (default: the other study's best "
                             "and worst)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop after this many seconds (the running jobs checkpoint); rerun to continue")
    parser.add_argument("--root", type=Path, default=None, help="sweep folders (default multirun/<study>)")
    parser.add_argument("--records", type=Path, default=None, help="job records (default: the plan's records)")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default: the records' parent)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="sweeps run at once (one per cell); each gets cpu_count/jobs threads unless "
                             "OMP_NUM_THREADS is set")
    parser.add_argument("--until", default=None, metavar="STAGE", help="stop after this stage")
    args = parser.parse_args(list(argv))
    try:
        plan = load_plan(args.plan)
        if args.until is not None:
            plan.stage(args.until)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"error: --jobs={args.jobs} is invalid; valid: a whole number of sweeps ≥ 1", file=sys.stderr)
        return 2
    if args.budget_s is not None and args.budget_s <= 0:
        print(f"error: --budget-s={args.budget_s:g} is invalid; valid: a positive number of seconds", file=sys.stderr)
        return 2
    bad = [s for s in args.set if "=" not in s or not s.split("=", 1)[0]]
    given = {s.split("=", 1)[0] for s in args.set}
    missing = [key for key in plan.required if key not in given]
    if bad or missing:
        what = f"--set {bad[0]!r} is not KEY=VALUE" if bad else f"{missing[0]} is required by the plan"
        print(f"error: {what}; valid: --set {(missing or plan.required or ('KEY',))[0]}=VALUE"
              + (f" (required: {', '.join(plan.required)})" if plan.required else ""), file=sys.stderr)
        return 2
    root = args.root or REPO / "multirun" / plan.slug
    records = args.records or (REPO / plan.records if plan.records else REPO / "docs" / "results" / plan.slug / "runs")
    out = args.out or records.parent
    try:
        formats: tuple[str, ...] = ()
        if plan.formats_from is not None:
            picked = (tuple(f.strip() for f in args.formats.split(",") if f.strip()) if args.formats
                      else best_and_worst(REPO / plan.formats_from["records"]))
            formats = (plan.formats_from["reference"], *picked)
            print(f"[study] formats: {', '.join(formats)}", flush=True)
        Study(plan, root, records, out, settings=args.set, formats=formats, budget_s=args.budget_s,
              jobs=args.jobs).run(args.until)
    except StudyStop as stop:
        print(f"error: {stop}", file=sys.stderr)
        return stop.code
    except DriverInterrupted as stop:
        print(f"error: interrupted by {stop}: the running jobs were stopped with a checkpoint; rerun the same "
              "command to continue", file=sys.stderr)
        return 128 + stop.signum
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"[study] done: report in {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

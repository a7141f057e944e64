"""``python -m altgrad.report SWEEP_DIR [SWEEP_DIR ...] [--out DIR] [--threshold 0]``."""

from __future__ import annotations

import argparse
import shlex
import sys

from altgrad.report.document import write_report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m altgrad.report",
        description="Write report.md and PNG plots from Hydra sweep folders (job dirs holding summary.json).")
    parser.add_argument("sweep_dirs", nargs="+", metavar="SWEEP_DIR",
                        help="a multirun folder (multirun/DATE/TIME), a run folder, or a folder of either")
    parser.add_argument("--out", default=None, help="folder for report.md and the plots (default: first SWEEP_DIR)")
    parser.add_argument("--threshold", type=float, default=0.0,
                        help="failure stages: a minimum relative loss increase over fp32, required on top of the "
                             "Holm-corrected paired test against seed noise (default 0: the test alone; 0.05 = 5%%)")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "-m", "altgrad.report", *argv])
    try:
        report = write_report(args.sweep_dirs, args.out, args.threshold, command=command)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a read-only, full or vanished output folder
        where = exc.filename or args.out or args.sweep_dirs[0]
        print(f"error: cannot write the report to {where} ({exc.strerror or exc}); give a writable --out",
              file=sys.stderr)
        return 2
    print(f"wrote {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Dispatch `python -m altgrad.bench NAME [args]` to `altgrad.bench.NAME.main(args)`."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import altgrad.bench as _pkg


COMMANDS = {"diagnostics_overhead": "callbacks"}  # module -> subcommand, where the two names differ
ON_REQUEST = frozenset({"subnormals"})  # subcommands that need arguments (run dirs to read): not part of `all`


def available() -> list[str]:
    """Subcommands: the benchmark modules of this package, by their COMMANDS name where they have one."""
    modules = (m.name for m in pkgutil.iter_modules(_pkg.__path__) if not m.name.startswith("_"))
    return sorted(COMMANDS.get(m, m) for m in modules)


def main(argv: list[str]) -> int:
    names = available()
    if not argv or argv[0] in {"-h", "--help"}:
        print(f"usage: python -m altgrad.bench {{{','.join(names)},all}} [args]  (all: every one but "
              f"{', '.join(sorted(ON_REQUEST))})")
        return 0 if argv else 2
    todo = [n for n in names if n not in ON_REQUEST] if argv[0] == "all" else [argv[0]]
    for name in todo:
        if name not in names:
            print(f"error: unknown benchmark {name!r}; valid: {', '.join(names)}, all", file=sys.stderr)
            return 2
        module = next((m for m, command in COMMANDS.items() if command == name), name)
        importlib.import_module(f"altgrad.bench.{module}").main(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A tuned-lr table: format → arm → (lr, where the pick came from), read from and written to its YAML file.

The file (conf/experiment/optim/tuned/NAME.yaml) is a Hydra config that evaluation experiments read by
interpolation; each pick's provenance is the comment on its line:

    tuned_lr:
      e4m3:
        plain: 0.003  # = adamw: the lr of every arm's grid-less parameters
        adamw: 0.003  # 4/4 lrs 0.001…0.03 stable, seeds [101]: final val loss 0.4958 (multirun/.../tune)

Values are read with PyYAML; PyYAML drops comments, so the notes are read back from the lines this module writes
(``render_table`` is the only writer: the file is always rewritten whole, never edited in place).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from altgrad.report.load import as_float

PLAIN_KEY = "plain"
"""Table key of the lr of every arm's grid-less parameters in a format: AdamW's pick there."""
TableEntry = tuple[float, str]  # lr, provenance note
Table = dict[str, dict[str, TableEntry]]  # format label → arm key → entry
_FORMAT_LINE = re.compile(r"^  (?P<format>[^:#\s]+):\s*$")
_ENTRY_LINE = re.compile(r"^    (?P<key>[^:#\s]+): (?P<value>[^#\n]+?)(?:  # (?P<note>[^\n]*))?$")
HEADER = """\
# @package _global_
# Tuned learning rates per format and arm, written by `python -m altgrad.sweep.lr_pick SWEEP... --table FILE`
# (rerun it to change them). `plain` is AdamW's pick in that format: the lr of every arm's grid-less parameters.
# fp32-master arms are keyed by optimizer.name, on-grid arms by NAME-ongrid_ROUNDING. An experiment uses it with
#   defaults: [/experiment/optim/tuned/THIS_FILE_NAME]
#   baseline: {lr: ${tuned_lr.${format.label}.plain}}
#   optimizer: {lr: ${tuned_lr.${format.label}.${optimizer.name}}}
"""


def read_table(path: Path) -> Table:
    """The table in ``path`` (empty when the file does not exist). ValueError names what is malformed."""
    if not path.exists():
        return {}
    text = path.read_text()
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict) or not isinstance(data.get("tuned_lr", {}), dict):
        raise ValueError(f"{path} is not a tuned-lr table: it must hold a `tuned_lr:` mapping of format → arm → lr")
    notes: dict[tuple[str, str], str] = {}
    fmt = None
    for line in text.splitlines():
        if m := _FORMAT_LINE.match(line):
            fmt = m["format"]
        elif (m := _ENTRY_LINE.match(line)) and fmt is not None:
            notes[(fmt, m["key"])] = m["note"] or ""
    table: Table = {}
    for fmt, arms in (data.get("tuned_lr") or {}).items():
        if not isinstance(arms, dict):
            raise ValueError(f"{path}: tuned_lr.{fmt} must map arm → lr, got {arms!r}")
        for key, lr in arms.items():
            value = as_float(lr)
            if value is None or value <= 0:
                raise ValueError(f"{path}: tuned_lr.{fmt}.{key}={lr!r} is not a positive learning rate")
            table.setdefault(str(fmt), {})[str(key)] = (value, notes.get((str(fmt), str(key)), ""))
    return table


def render_table(table: Table) -> str:
    """The table file's text: the usage header, then format → arm → lr (plain and adamw first), notes as comments."""
    lines = [HEADER.rstrip("\n"), "tuned_lr:"]
    for fmt in sorted(table):
        lines.append(f"  {fmt}:")
        arms = table[fmt]
        first = [k for k in (PLAIN_KEY, "adamw") if k in arms]
        for key in first + sorted(k for k in arms if k not in first):
            lr, note = arms[key]
            lines.append(f"    {key}: {float_text(lr)}" + (f"  # {note}" if note else ""))
    return "\n".join(lines) + "\n"


def write_table(path: Path, table: Table) -> None:
    """Write the whole table to ``path`` (its folder created when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_table(table))


def float_text(lr: float) -> str:
    """An lr as YAML reads back as a float: 6 significant digits, 3 → 3.0."""
    value = f"{lr:.6g}"
    return value + (".0" if value.lstrip("-").isdigit() else "")

"""Each committed study report regenerates byte for byte from its committed records with today's report code, by the
command it names (issue 33: ``python -m altgrad.report … --out …`` reproduces the committed report)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from altgrad.report.__main__ import main

REPO = Path(__file__).resolve().parents[2]
STUDIES = ("study-cpu", "study-ongrid")

pytestmark = pytest.mark.slow  # a full report with its figures per study


@pytest.mark.parametrize("study", STUDIES)
def test_a_committed_study_report_regenerates(study: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    committed = REPO / "docs" / "results" / study / "report.md"
    if not committed.is_file():
        pytest.skip(f"{study} has no committed report yet (its study is still running)")
    text = committed.read_text()
    named = re.search(r"^Command: `(.+)`$", text, re.MULTILINE)
    assert named, f"{committed} names no command"
    argv = shlex.split(named.group(1))[3:]          # after "python -m altgrad.report"
    out = argv[argv.index("--out") + 1]
    assert (REPO / out).resolve() == committed.parent, "the command writes the report where it is committed"
    monkeypatch.chdir(REPO)                          # the command's paths are the repository's
    fresh = tmp_path / "out"
    argv[argv.index("--out") + 1] = str(fresh)
    assert main(argv) == 0
    regenerated = (fresh / "report.md").read_text().replace(f"--out {fresh}", f"--out {out}")
    assert regenerated == text
    committed_figures = sorted(p.name for p in committed.parent.glob("*.png"))
    assert committed_figures == sorted(p.name for p in fresh.glob("*.png"))   # none stale, none missing
    for name in committed_figures:
        assert (fresh / name).read_bytes() == (committed.parent / name).read_bytes(), name

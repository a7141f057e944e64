"""The repository stands alone: no file points outside it, and every relative link in the docs resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".yaml", ".md", ".cpp", ".toml", ".txt"}
SOURCES = [p for top in ("altgrad", "conf", "docs", "tests") for p in (REPO / top).rglob("*")
           if p.suffix in TEXT_SUFFIXES and p.is_file()]
SOURCES += [REPO / "README.md", REPO / "Makefile", REPO / "pyproject.toml"]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "conf").rglob("*.md"))]
# A markdown link or image whose target is a relative path (no scheme, no pure anchor).
LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s]+)\)")


def test_nothing_points_at_the_sibling_folder_users_do_not_have() -> None:
    outside = "../" + "shared"  # built, so this file does not match itself
    hits = [f"{p.relative_to(REPO)}:{n}" for p in SOURCES
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if outside in line]
    assert not hits, f"files point at {outside}/, which users never have: {hits}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = [target for target in LINK.findall(doc.read_text())
              if not (doc.parent / target.split("#", 1)[0]).exists()]
    assert not broken, f"{doc.relative_to(REPO)} links to missing files: {broken}"

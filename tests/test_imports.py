"""The package's modules form layers: no import circle anywhere in altgrad, and the format module imports nothing
from altgrad (it is data; everything that computes on a format sits above it). Imports inside functions count too:
a circle through a lazy import is still a circle, only hidden until the function runs."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "altgrad"


def module_files() -> dict[str, Path]:
    """Dotted module name → file, for every module of the package (a package by its __init__.py)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The altgrad modules a file imports, anywhere in it, except under ``if TYPE_CHECKING:`` (never run).

    ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of ``pkg``."""
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree)
               if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
               for child in node.body for n in ast.walk(child)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                found.add(dotted if dotted in modules else node.module)
    return {m for m in found if m in modules}


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported_modules(path, modules) - {name} for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_altgrad() -> None:
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_the_format_is_data_that_imports_nothing_from_altgrad() -> None:
    assert import_graph()["altgrad.quant.format"] == set()

"""`python -m altgrad.bench`: every benchmark module is a subcommand; `all` leaves out those that need arguments."""

from __future__ import annotations

import pytest

from altgrad.bench import __main__ as dispatch


def test_every_benchmark_is_a_subcommand_and_all_skips_the_ones_needing_run_dirs(monkeypatch) -> None:
    names = dispatch.available()
    assert {"floor", "subnormals", "job", "calls", "callbacks"} <= set(names)
    assert "_hook_times" not in names and "diagnostics_overhead" not in names
    ran: list[str] = []

    class Fake:
        def __init__(self, name: str) -> None:
            self.name = name

        def main(self, argv: list[str]) -> None:
            ran.append(self.name)

    monkeypatch.setattr(dispatch.importlib, "import_module", lambda path: Fake(path.rsplit(".", 1)[-1]))
    assert dispatch.main(["all"]) == 0
    assert "subnormals" not in ran and "floor" in ran and "diagnostics_overhead" in ran
    ran.clear()
    assert dispatch.main(["subnormals", "RUN"]) == 0 and ran == ["subnormals"]


def test_an_unknown_benchmark_is_named_with_the_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert dispatch.main(["nope"]) == 2
    err = capsys.readouterr().err
    assert "error: unknown benchmark 'nope'; valid: " in err and "subnormals" in err

"""The provenance section: the data files' sha256 as one set or not, the code commits named, records per stage
folder and failures per cell, from synthetic summaries."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from altgrad.report.load import Job
from altgrad.report.provenance import (applies, by_stage, code_commits, data_sets, failure_kind, failures_by_cell,
                                       provenance_lines)

TRAIN, VAL = "a" * 64, "b" * 64


def job(name: str, *, state: str = "completed", files: dict[str, str] | None = None, commit: str | None = "c0ffee",
        dirty: bool = False, arm: str | None = "adamw_sr", fmt: str = "e4m3", lr: float = 1e-3,
        cause: str | None = None) -> Job:
    summary: dict[str, Any] = {"status": state, "format": fmt, "optimizer": "adamw", "lr": lr, "arm": arm,
                               "data_files": files, "divergence_cause": cause,
                               "code": {"commit": commit, "dirty": dirty} if commit else None}
    return Job(Path(name), name, state, summary)


SAME = {"/data/eurlex_en.train.txt": TRAIN, "/data/eurlex_en.val.txt": VAL}


def test_one_set_of_data_files_whatever_folder_it_was_read_from() -> None:
    jobs = [job("pilot/0", files=SAME),
            job("tune_ref/0", files={"/elsewhere/eurlex_en.train.txt": TRAIN, "eurlex_en.val.txt": VAL})]
    sets, without = data_sets(jobs)
    assert len(sets) == 1 and len(sets[0].jobs) == 2 and not without
    assert sets[0].files == (("eurlex_en.train.txt", TRAIN), ("eurlex_en.val.txt", VAL))
    line = provenance_lines(jobs)[0]
    assert line == (f"Data: one set of data files across the 2 runs that record it: eurlex_en.train.txt sha256 "
                    f"{TRAIN}, eurlex_en.val.txt sha256 {VAL}.")


def test_two_sets_are_said_to_be_two() -> None:
    other = {**SAME, "/data/eurlex_en.val.txt": "c" * 64}
    jobs = [job("pilot/0", files=SAME), job("pilot/1", files=SAME), job("eval/0", files=other), job("old/0")]
    sets, without = data_sets(jobs)
    assert [len(s.jobs) for s in sets] == [2, 1] and [j.name for j in without] == ["old/0"]
    lines = provenance_lines(jobs)
    assert lines[0].startswith("Data: **not one set** — the runs read 2 different sets of data files")
    assert lines[1].startswith("  - set 1 (2 runs; folders pilot): ")
    assert lines[2].startswith("  - set 2 (1 run; folders eval): ")
    assert lines[3] == "  - 1 run(s) record no data files"


def test_code_commits_are_named_and_counted() -> None:
    jobs = [job("a/0"), job("a/1"), job("b/0", commit="beef", dirty=True), job("c/0", commit=None)]
    commits, without = code_commits(jobs)
    assert {c: len(js) for c, js in commits.items()} == {"c0ffee": 2, "beef+dirty": 1}
    assert [j.name for j in without] == ["c/0"]
    (line,) = [x for x in provenance_lines(jobs) if x.startswith("Code:")]
    assert line == "Code: 2 code states — c0ffee (2 runs); beef+dirty (1 run); 1 run(s) name none (older records)."
    (one,) = [x for x in provenance_lines([job("a/0"), job("a/1")]) if x.startswith("Code:")]
    assert one == "Code: one code state, c0ffee (2 runs)."


def test_failures_are_counted_per_cell() -> None:
    jobs = [job("eval/0", state="diverged", cause="never learned: lowest training loss 5.5 after 200 steps"),
            job("eval/1", state="diverged", cause="non-finite loss"), job("eval/2"),
            job("eval/3", state="failed", fmt="e7m0"), job("eval/4", fmt="e7m0")]
    assert [failure_kind(j) for j in jobs] == ["never learned", "diverged", None, "crashed", None]
    assert failures_by_cell(jobs) == [("eval", "e4m3", "adamw_sr", 1e-3, {"never learned": 1, "diverged": 1}, 3),
                                      ("eval", "e7m0", "adamw_sr", 1e-3, {"crashed": 1}, 2)]
    (line,) = [x for x in provenance_lines(jobs) if x.startswith("Failures")]
    assert "eval e4m3 adamw_sr lr 0.001: 1 diverged, 1 never learned of 3" in line
    assert "eval e7m0 adamw_sr lr 0.001: 1 crashed of 2" in line


def test_stage_folders_and_when_the_section_applies() -> None:
    jobs = [job("pilot/0"), job("pilot/1", state="diverged"), job("tune_ref/0")]
    assert by_stage(jobs) == {"pilot": {"completed": 1, "diverged": 1}, "tune_ref": {"completed": 1}}
    assert applies(jobs)
    assert not applies([job("x/0", arm=None)])  # no arm, no data files: an older study's records (study-cpu)
    assert applies([job("x/0", arm=None, files=SAME)])


def test_commits_of_one_code_are_one_code_state(tmp_path: Path) -> None:
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True,
                              env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                                   "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}).stdout.strip()

    def commit(path: str, text: str) -> str:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
        git("add", "-A")
        git("commit", "-q", "-m", path)
        return git("rev-parse", "HEAD")

    git("init", "-q")
    for path in ("altgrad/a.py", "conf/c.yaml", "pyproject.toml", "Makefile"):
        code = commit(path, "1\n")
    commit("docs/results/runs/0/summary.json", "{}\n")  # a records commit: the same code
    commit("conf/experiment/optim/tuned/s.yaml", "tuned_lr: {}\n")  # a study's tuned-lr table: the same
    records = commit("conf/study/s.yaml", "stages: []\n")  # a study's plan, amended: which runs, not what they compute
    changed = commit("altgrad/a.py", "2\n")
    jobs = [job("a/0", commit=code), job("a/1", commit=code), job("b/0", commit=records), job("c/0", commit=changed),
            job("d/0", commit=records, dirty=True)]
    (line,) = [x for x in provenance_lines(jobs, root=tmp_path) if x.startswith("Code:")]
    head, states = line.split(" — ")
    states, note = states.split(" (“=”")
    assert head == "Code: 3 code states"
    assert states.split("; ")[0] == f"{code} (2 runs) = {records} (1 run)"  # most runs first
    assert sorted(states.split("; ")[1:]) == sorted([f"{changed} (1 run)", f"{records}+dirty (1 run)"])
    assert note == " joins commits whose altgrad, conf, pyproject.toml, Makefile are identical, study plans and " \
                   "tuned-lr tables aside: records and tables committed as they were written)."
    (one,) = [x for x in provenance_lines(jobs[:3], root=tmp_path) if x.startswith("Code:")]
    assert one.startswith(f"Code: one code state, {code} (2 runs) = {records} (1 run) (")
    # outside a checkout (or for a commit it lacks) each commit stands alone, as before
    (apart,) = [x for x in provenance_lines(jobs[:3], root=tmp_path / "altgrad") if x.startswith("Code:")]
    assert apart == f"Code: 2 code states — {code} (2 runs); {records} (1 run)."

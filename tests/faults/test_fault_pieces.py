"""The pieces behind the newer fault handling, in process: command-line mistakes, job dir names, what a run records
about its code and format, a full disk, and how a parallel sweep's workers learn that it stops."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from altgrad.atomic import is_temporary
from altgrad.interrupts import InterruptGuard, RunInterrupted
from altgrad.provenance import code_state
from altgrad.quant.layer_map import custom_grid_name
from altgrad.sweep import stop
from altgrad.sweep.naming import MAX_BYTES, job_dirname
from altgrad.train_cli import command_line_problem, sweep_resume_command

REPO = Path(__file__).resolve().parents[2]


# --- the command line ----------------------------------------------------------------------------------------------
def test_an_unquoted_value_with_a_space_gets_the_quoting_hint() -> None:
    message = command_line_problem(["data=local", "data.path=/data/my", "corpus.txt", "seed=1"])
    assert message == ("'corpus.txt' is not an override (key=value): if it is the rest of 'data.path=/data/my', a "
                       "value with a space must be quoted, e.g. 'data.path=/data/my corpus.txt'")
    assert "is not an override (key=value) or a flag" in command_line_problem(["corpus.txt"])


@pytest.mark.parametrize("arg", ["format=null", "optimizer=~", "+format=null"])
def test_a_config_group_set_to_null_names_its_options(arg: str) -> None:
    message = command_line_problem([arg])
    group = arg.lstrip("+").split("=")[0]
    assert message.startswith(f"{group}={arg.split('=')[1]} names no option of the {group} group; valid: ")
    assert "adamw" in message if group == "optimizer" else "e4m3" in message


@pytest.mark.parametrize("args", [["-m", "seed=1,2", "format=e4m3,e5m2"], ["--cfg", "job", "seed=1"],
                                  ["-cn", "train", "trainer.max_steps=3"], ["format.grad=null", "ckpt_path=null"],
                                  ["hydra/launcher=joblib", "+resume_sweep=true"], ["callbacks=none"]])
def test_good_command_lines_pass(args: list[str]) -> None:
    assert command_line_problem(args) is None


def test_the_sweep_resume_command_is_the_same_sweep_in_its_folder() -> None:
    args = ["-m", "seed=1,2", "data.path=/a b/c.txt", "hydra.sweep.dir=/old", "+resume_sweep=false"]
    assert sweep_resume_command(args, "/runs/s") == (
        "python -m altgrad.train -m seed=1,2 'data.path=/a b/c.txt' hydra.sweep.dir=/runs/s +resume_sweep=true")


@given(st.text(min_size=1, max_size=400))
def test_a_job_dir_name_is_one_folder_and_tells_values_apart(text: str) -> None:
    name = job_dirname(text)
    assert "/" not in name and name not in (".", "..") and len(name.encode()) <= MAX_BYTES
    if len(text.replace("%", "%25").replace("/", "%2F").encode()) <= MAX_BYTES and text not in (".", ".."):
        assert name.replace("%2F", "/").replace("%25", "%") == text  # readable and reversible when short
    assert job_dirname(text) == name  # the same on every rerun


def test_job_dirs_named_by_a_path_do_not_nest() -> None:
    assert job_dirname("data.path=/a/b.txt,seed=1") == "data.path=%2Fa%2Fb.txt,seed=1"
    assert job_dirname("format=e4m3,seed=1") == "format=e4m3,seed=1"  # the names of every earlier study


# --- what a run records ---------------------------------------------------------------------------------------------
def test_a_custom_grid_is_named_by_its_fields() -> None:
    assert custom_grid_name({"name": "e4m3"}) is None  # the preset itself: the run records its option's label
    assert custom_grid_name({"name": "e4m3", "mbits": 20, "ebits": None}) == "e4m20"  # not e4m3: a 25-bit grid
    assert custom_grid_name({"name": "e4m3", "mbits": 20, "bias": 3}) == "e4m20b3"
    assert custom_grid_name({"name": "e3m4", "bias": 3, "policy": "ieee"}) == "e3m4b3-ieee"
    assert custom_grid_name({"name": "e4m3", "ebits": 5, "mbits": 2}) == "e5m2b7-fn"  # not the e5m2 preset's grid
    assert custom_grid_name({"name": "e4m3", "ebits": 5, "mbits": 2, "bias": 15, "policy": "ieee"}) == "e5m2"  # it is
    assert custom_grid_name({"name": "fp32", "mbits": 3}) is None  # unquantized


def test_the_code_state_is_this_checkout_or_unknown(tmp_path: Path) -> None:
    state = code_state(REPO)
    if (REPO / ".git").exists():
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert state["commit"] == head.stdout.strip() and isinstance(state["dirty"], bool)
    assert code_state(tmp_path) == {"commit": None, "dirty": None}  # not a checkout: nulls, never an error


def test_a_checkpoint_that_meets_a_full_disk_raises_the_disk_error_and_leaves_no_file(tmp_path: Path) -> None:
    """torch.save reports a failed write as RuntimeError('unexpected pos …'); the run must see the OSError (one line,
    'File too large' here, 'No space left on device' on a full disk), and the temporary file must be closed and gone,
    so its space is free for the summary that records the failure. The kernel refuses the writes: a file size limit."""
    target = tmp_path / "checkpoints" / "last.ckpt"
    target.parent.mkdir()
    target.write_bytes(b"the previous checkpoint")
    script = (
        "import resource, signal, torch\n"
        "from altgrad.checkpoint import AtomicCheckpointIO\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))\n"
        "try:\n"
        f"    AtomicCheckpointIO().save_checkpoint({{'w': torch.zeros(100_000)}}, {str(target)!r})\n"
        "except OSError as err:\n"
        "    print('OSError', err.errno)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.stdout.split() == ["OSError", str(errno.EFBIG)], result.stderr[-2000:]
    assert target.read_bytes() == b"the previous checkpoint"
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]


def test_temporary_files_are_recognised_by_name() -> None:
    assert is_temporary(Path(".last.ckpt.0123456789abcdef0123456789abcdef.tmp"))
    assert not is_temporary(Path("last.ckpt")) and not is_temporary(Path(".last.ckpt.tmp"))


# --- a parallel sweep stops as one ---------------------------------------------------------------------------------
def test_a_worker_reads_only_its_own_launchers_marker(tmp_path: Path) -> None:
    stop.write_marker(tmp_path, stop.SIGNAL, signal.SIGTERM, os.getppid())  # as this process's launcher would
    assert stop.read_marker(tmp_path)["signal"] == signal.SIGTERM
    stop.write_marker(tmp_path, stop.SIGNAL, signal.SIGTERM, os.getppid() + 1)  # a killed launcher's, say
    assert stop.read_marker(tmp_path) is None
    stop.write_marker(tmp_path, stop.REFUSED, None, os.getppid())
    assert stop.read_marker(tmp_path, (stop.SIGNAL,)) is None and stop.read_marker(tmp_path)["kind"] == "refused"
    stop.remove_marker(tmp_path)
    assert stop.read_marker(tmp_path) is None


def test_a_noting_guard_keeps_the_first_signal_and_polls_the_launcher() -> None:
    guard = InterruptGuard()
    guard.install()
    try:
        guard.note_only = True
        seen: list[int] = []
        guard.on_signal = seen.append
        os.kill(os.getpid(), signal.SIGTERM)  # noted (a worker between jobs, a launcher while its pool runs)
        assert guard.signum == signal.SIGTERM and seen == [signal.SIGTERM]
        with pytest.raises(RunInterrupted):  # a second signal stops at once
            os.kill(os.getpid(), signal.SIGTERM)
        guard.reset()
        requests = iter([None, signal.SIGUSR1])
        guard.external = lambda: next(requests)
        assert not guard.requested  # polled at a step boundary: nothing yet
        assert guard.requested and guard.signum == signal.SIGUSR1  # the launcher was signalled
    finally:
        guard.uninstall()


def test_only_a_changed_code_file_makes_the_code_state_dirty(tmp_path: Path) -> None:
    """A study writes its tuned-lr table and runs from it before the table is committed: those runs ran the
    committed code (their config holds the lrs), as does a run beside an edited doc, test or record."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True,
                              env=env).stdout.strip()

    def write(path: str, text: str) -> None:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)

    def state() -> dict:
        code_state.cache_clear()
        return code_state(tmp_path)

    git("init", "-q")
    for path in ("altgrad/a b.py", "conf/c.yaml", "conf/experiment/optim/tuned/s.yaml", "conf/study/p.yaml",
                 "docs/r.md", "tests/t.py", "pyproject.toml", "Makefile", "altgraded.txt"):
        write(path, "1\n")
    git("add", "-A")
    git("commit", "-q", "-m", "all")
    head = git("rev-parse", "HEAD")
    assert state() == {"commit": head, "dirty": False}
    for path in ("conf/experiment/optim/tuned/s.yaml", "conf/study/p.yaml", "docs/r.md", "tests/t.py", "altgraded.txt"):
        write(path, "2\n")
    write("altgrad/new.py", "untracked\n")
    assert state() == {"commit": head, "dirty": False}
    for path, change in (("altgrad/a b.py", "edit"), ("conf/c.yaml", "stage"), ("Makefile", "edit"),
                         ("pyproject.toml", "rename")):
        git("stash", "-q")
        if change == "rename":
            git("mv", path, "renamed.toml")
        else:
            write(path, "3\n")
            if change == "stage":
                git("add", path)
        assert state() == {"commit": head, "dirty": True}, (path, change)
        git("reset", "-q", "--hard")
    code_state.cache_clear()

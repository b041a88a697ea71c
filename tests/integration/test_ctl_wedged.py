"""`ctl` against a tree with a wedged (SIGSTOPped) child, or no tree at all: every read command
answers before its --timeout is up, showing what the stopped child did not say; an unreachable
tree is one line and exit 3.

Wall time is measured only as a bound ("returned before its timeout plus a margin for starting
an interpreter"), never as a figure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.harness import Tree

pytestmark = pytest.mark.integration

TIMEOUT_S = 2.0
"""The --timeout every command here is given."""
MARGIN_S = 5.0
"""What a command may take beyond its --timeout: starting an interpreter and importing the CLI
on a loaded machine. A command that waits on the stopped child (the supervisor's default
forward timeout is 10 s) goes past it."""
WATCHDOG = "[supervisor]\nwatchdog_s = 600.0\n"
"""The stopped child must stay stopped for the test: the watchdog would kill it after 10 s."""


def ctl(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`orchestra-sup ctl --run-dir RUN_DIR ARGS --timeout TIMEOUT_S`, asserted to return
    before TIMEOUT_S + MARGIN_S."""
    argv = [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(run_dir), *args]
    argv += ["--timeout", str(TIMEOUT_S)]
    started = time.monotonic()
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    took = time.monotonic() - started
    assert took < TIMEOUT_S + MARGIN_S, f"{args} returned after {took:.1f} s: {proc.stderr}"
    return proc


def ok_json(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return json.loads(proc.stdout)


@pytest.fixture
def stopped(
    request: pytest.FixtureRequest, tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> Iterator[tuple[Tree, str, int]]:
    """A tree whose child `request.param` is SIGSTOPped; continued afterwards, whatever
    happened."""
    config = tmp_path / "tree.toml"
    config.write_text(WATCHDOG)
    tree = tree_factory(workspace=repo, config=config)
    name = request.param
    pid = tree.pids()[name]
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield tree, name, pid
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("stopped", ["coordinator", "shard-1"], indirect=True)
def test_read_commands_answer_with_a_child_stopped(stopped: tuple[Tree, str, int]) -> None:
    """status, tree, lanes and top --once answer within --timeout while a child is stopped:
    status and tree list it (its pid as before), lanes and top name it as unanswered."""
    tree, name, pid = stopped
    status = ok_json(ctl(tree.run_dir, "status", "--json"))
    assert {c["name"]: c["pid"] for c in status["children"]}[name] == pid

    nested = ok_json(ctl(tree.run_dir, "tree", "--json"))
    leaves = json.dumps(nested)
    assert f'"name": "{name}"' in leaves and f'"pid": {pid}' in leaves

    lanes = ok_json(ctl(tree.run_dir, "lanes", "--json"))
    assert name in lanes["unanswered"]

    frame = ok_json(ctl(tree.run_dir, "top", "--once", "--json"))
    assert frame["error"] is None
    assert name in frame["lanes"]["unanswered"]
    assert pid in [c["pid"] for c in frame["status"]["children"]]

    text = ctl(tree.run_dir, "top", "--once")
    assert text.returncode == 0, text.stderr
    assert f"no answer from {', '.join(lanes['unanswered'])}" in text.stdout
    assert str(pid) in text.stdout


def test_stopped_supervisor_is_unreachable_in_one_line(tree_factory: Callable[..., Tree]) -> None:
    """A supervisor that does not answer: status and top exit 3 with one line naming the
    timeout, before it is up."""
    tree = tree_factory()
    os.kill(tree.proc.pid, signal.SIGSTOP)
    try:
        for args in (["status"], ["top", "--once"], ["top", "--json"]):
            proc = ctl(tree.run_dir, *args)
            assert proc.returncode == 3, (args, proc.stdout, proc.stderr)
            assert proc.stderr.splitlines() == [
                f"orchestra-sup: the tree at {tree.run_dir} did not answer within {TIMEOUT_S:g} s"
            ]
            assert proc.stdout == ""
    finally:
        os.kill(tree.proc.pid, signal.SIGCONT)


@pytest.mark.parametrize(
    "args",
    [["status"], ["tree", "--json"], ["lanes"], ["top"], ["top", "--once"], ["top", "--json"]],
    ids=lambda args: " ".join(args),
)
def test_no_tree_is_one_line_exit_3(tmp_path: Path, args: list[str]) -> None:
    """No tree at the run directory: exit 3 and one line on stderr, no traceback, nothing on
    stdout."""
    proc = ctl(tmp_path / "nothing", *args)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert proc.stderr.splitlines() == [
        f"orchestra-sup: no tree is running at {tmp_path / 'nothing'}"
    ]
    assert proc.stdout == ""

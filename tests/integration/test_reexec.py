"""`ctl rollover supervisor --release R`: the supervisor re-executes itself in place onto R and
re-adopts its running children (`supervisor.reexec`, docs/adr/0007-supervisor-reexec.md).

The second release is a wrapper script that re-labels this interpreter (version 9.0.0,
`ORCHESTRA_SUP_TEST_VERSION`); every wait is on an event (a notify datagram, a status, a plan
report) under a deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.protocol import frames as f
from tests.integration.harness import (
    Tree,
    assert_no_leftovers,
    make_release,
    plan,
    task,
    wait_until,
)

pytestmark = pytest.mark.integration


def release(tmp_path: Path, name: str = "release-9", before: str = "") -> Path:
    """A second release (`make_release`: this interpreter, re-labelled 9.0.0); `before` is sh
    run first, for a release that misbehaves."""
    path = make_release(tmp_path, name, version="9.0.0")
    if before:
        path.write_text(path.read_text().replace("#!/bin/sh\n", "#!/bin/sh\n" + before, 1))
    return path


def rollover_supervisor(
    tree: Tree, to: Path, timeout_s: float = 10.0
) -> subprocess.CompletedProcess[str]:
    """`ctl rollover supervisor --release TO`, to its end. `timeout_s` also bounds how long a
    progress poll that the exec cut off is waited for."""
    argv = [sys.executable, "-m", "orchestra_sup", "ctl", "rollover", "supervisor"]
    argv += ["--release", str(to), "--run-dir", str(tree.run_dir), "--timeout", str(timeout_s)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s + 30)


def children_of_main_thread(pid: int) -> set[int]:
    """The children whose parent-death signal is tied to `pid`'s main thread."""
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return {int(p) for p in fh.read().split()}


def identities(status: f.StatusReply) -> dict[str, tuple[int | None, int, str]]:
    return {c.name: (c.pid, c.generation, c.state) for c in status.children}


def sockets(tree: Tree) -> set[str]:
    return {p.name for p in tree.run_dir.glob("*.ipc")}


def test_reexec_keeps_every_child_and_the_plan_goes_on(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """Mid-plan, with a lane running: same supervisor pid, the new version and release in
    status, every child the same process at the same generation (its socket still there), and
    the plan completes with every task run once."""
    gate = tmp_path / "gate"
    tree = tree_factory(workspace=repo)
    plan_id = tree.submit(
        plan(
            "across",
            task("first", "echo first"),
            task("long", f"while [ ! -e {gate} ]; do sleep 0.05; done", needs=["first"]),
            task("after", "echo after", needs=["long"]),
        )
    )

    def long_running() -> bool:
        reply = tree.ctl(f.CtlLanes())
        assert isinstance(reply, f.LaneList)
        return any(lane.task == "long" and lane.state == "running" for lane in reply.lanes)

    wait_until(long_running, 20, "the long task to run")
    before = tree.status()
    assert before.version != "9.0.0"
    # every child's parent-death signal is tied to the thread an exec keeps
    assert {c.pid for c in before.children} <= children_of_main_thread(before.supervisor_pid)
    files = sockets(tree)

    to = release(tmp_path)
    done = rollover_supervisor(tree, to)
    assert done.returncode == 0, done.stdout + done.stderr
    tree.await_notify(b"READY=1")

    after = tree.status()
    assert after.supervisor_pid == before.supervisor_pid == tree.proc.pid
    assert (after.version, after.release) == ("9.0.0", str(to))
    assert identities(after) == identities(before)
    assert all(c.state == "running" for c in after.children)
    assert sockets(tree) == files
    gate.touch()
    report = tree.wait_plan(plan_id, timeout_s=30)
    assert report.ok, report
    assert {t.id: t.attempts for t in report.tasks} == {"first": 1, "long": 1, "after": 1}


def test_a_child_killed_after_the_reexec_is_restarted(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """Right after the re-exec, SIGKILL the custodian: its exit is seen at once (well within
    the watchdog) and it restarts at the next generation; stopping the new image then stops
    every child it adopted, leaving nothing behind."""
    tree = tree_factory(workspace=repo)
    done = rollover_supervisor(tree, release(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    tree.await_notify(b"READY=1")
    custodian = tree.child("custodian")
    assert custodian.pid is not None and custodian.generation == 1
    os.kill(custodian.pid, signal.SIGKILL)
    again = tree.wait_running("custodian", 2, timeout_s=5)  # the watchdog would take 10 s
    assert again.pid != custodian.pid and again.restarts == 1
    assert again.last_exit == f.ExitInfo(signal=signal.SIGKILL)
    assert tree.stop() == 0
    assert_no_leftovers()


def test_a_release_that_cannot_be_executed_changes_nothing(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """A release that is not executable is refused before anything moves; one that is no
    longer a program by the time of the exec fails at the exec itself, and the tree goes on as
    it was (same children, same version, ready again); a good release is then taken as usual."""
    tree = tree_factory(workspace=repo)
    before = tree.status()

    plain = release(tmp_path, "not-executable")
    plain.chmod(0o644)
    refused = rollover_supervisor(tree, plain)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "not an executable" in refused.stderr

    # passes its probe and its start check, then turns into a file the kernel cannot execute
    # (ENOEXEC)
    spoiled = release(
        tmp_path,
        "spoiled",
        'case "$*" in *--preflight*) printf "not a program\\n" > "$0.new"; '
        'chmod 755 "$0.new"; mv "$0.new" "$0";; esac\n',
    )
    failed = rollover_supervisor(tree, spoiled)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "cannot execute it" in failed.stderr and "Traceback" not in failed.stderr
    tree.await_notify(b"READY=1")  # systemd hears the reload is over
    same = tree.status()
    assert identities(same) == identities(before)
    assert (same.supervisor_pid, same.version) == (before.supervisor_pid, before.version)

    done = rollover_supervisor(tree, release(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    tree.await_notify(b"READY=1")
    assert tree.status().version == "9.0.0"
    assert identities(tree.status()) == identities(before)


def test_a_new_image_that_cannot_adopt_stops_the_tree(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """A new image that cannot read its hand-off (here: the release hands it /dev/null) cannot
    go back to the old one: it says so in one line, stops every child it inherited and what
    their lanes left running, and exits 1 for systemd to restart it; the next tree on the
    state directory runs the interrupted step again and finishes the plan."""
    gate = tmp_path / "gate"
    one = tree_factory(workspace=repo, base=tmp_path / "tree")
    plan_id = one.submit(plan("cut", task("long", f"while [ ! -e {gate} ]; do sleep 0.05; done")))

    def running() -> bool:
        reply = one.ctl(f.CtlLanes())
        assert isinstance(reply, f.LaneList)
        return any(lane.state == "running" for lane in reply.lanes)

    wait_until(running, 20, "the lane to run")
    broken = release(
        tmp_path,
        "broken",
        f'case "$*" in *--adopt*) exec {sys.executable} -m orchestra_sup start --adopt 0;; esac\n',
    )
    rollover_supervisor(one, broken, timeout_s=3)
    assert one.proc.wait(timeout=60) == 1
    log = one.log()
    said = [line for line in log.splitlines() if line.startswith("orchestra-sup: ")]
    assert len(said) == 1 and said[0].startswith("orchestra-sup: cannot adopt the tree: "), log
    assert "Traceback" not in log
    assert_no_leftovers()

    two = tree_factory(workspace=repo, base=tmp_path / "tree")
    gate.touch()
    report = two.wait_plan(plan_id, timeout_s=30)
    assert report.ok and report.tasks[0].attempts == 2, report

"""What a real tree tells systemd on its `NOTIFY_SOCKET` (`supervisor.notify`): READY=1 once
every child has shaken hands, STATUS= lines that follow the lanes and plans, WATCHDOG=1 pings
that a re-executed image keeps sending, STOPPING=1 as a stop begins. The test plays systemd's
part with the harness's notify socket; every wait is on a datagram under a deadline."""

from __future__ import annotations

import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.integration.harness import Tree, make_release, plan, task, wait_until

pytestmark = pytest.mark.integration


def next_status(tree: Tree, wanted: str) -> str:
    """Read datagrams until a STATUS= line contains `wanted`; return that line."""
    seen: list[str] = []

    def arrived() -> str | None:
        tree.notify.settimeout(20)
        for line in tree.notify.recv(4096).decode().split("\n"):
            if line.startswith("STATUS="):
                seen.append(line)
                if wanted in line:
                    return line
        return None

    return wait_until(arrived, 20, f"STATUS with {wanted!r} (seen: {seen[-5:]})")  # type: ignore[return-value]


def test_ready_means_every_child_is_running(tree: Tree) -> None:
    """When READY=1 arrives, every child has completed its handshake: status at once shows
    them all running, each with a pid."""
    children = tree.status().children
    assert len(children) == 4
    assert all(c.state == "running" and c.pid for c in children), children


def test_status_follows_lanes_and_plans(tree: Tree, tmp_path: Path) -> None:
    """A lane running for a plan shows in STATUS= ("4/4 children running, 1 lane, 1 plan"), and
    goes away from it when the plan is done."""
    gate = tmp_path / "gate"
    plan_id = tree.submit(plan("p", task("wait", f"while [ ! -e {gate} ]; do sleep 0.05; done")))
    assert next_status(tree, "1 lane,") == "STATUS=4/4 children running, 1 lane, 1 plan"
    gate.touch()
    assert tree.wait_plan(plan_id, timeout_s=30).ok
    assert next_status(tree, "0 lanes") == "STATUS=4/4 children running, 0 lanes, 0 plans"


def test_watchdog_pings_go_on_after_a_reexec(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """With WATCHDOG_USEC set, the supervisor pings WATCHDOG=1; after it re-executes itself onto
    another release (same pid, which systemd goes on watching) the new image pings too."""
    tree = tree_factory(workspace=repo, extra_env={"WATCHDOG_USEC": "400000"})
    tree.await_notify(b"WATCHDOG=1")
    release = make_release(tmp_path, "release-9", version="9.0.0")
    # Read on while the rollover runs: a unix datagram queue holds few messages (10 by
    # default), and the tree drops what does not fit rather than block its loop.
    with ThreadPoolExecutor(1) as pool:
        rollover = pool.submit(tree.rollover, "supervisor", release, timeout_s=60)
        tree.await_notify(b"READY=1")  # the new image's; what follows is its own
        tree.await_notify(b"WATCHDOG=1", timeout_s=10)
        done = rollover.result()
    assert done.returncode == 0, done.stdout + done.stderr
    assert tree.status().version == "9.0.0"


def test_stopping_is_said_as_the_stop_begins(tree: Tree) -> None:
    """SIGTERM: STOPPING=1 arrives, then the supervisor exits 0."""
    tree.proc.send_signal(signal.SIGTERM)
    tree.await_notify(b"STOPPING=1")
    assert tree.stop() == 0

"""Restarts on real trees: a failure stays inside its own process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from orchestra_sup.protocol import frames as f
from tests.integration.harness import (
    RawPeer,
    Tree,
    alive,
    assert_no_leftovers,
    plan,
    task,
    wait_until,
)

pytestmark = pytest.mark.integration


def test_sigkill_shard_restarts_only_that_shard(tree: Tree) -> None:
    """SIGKILL of shard-0: it comes back with a new pid and generation 2; the others keep
    their pids, and a plan submitted afterwards runs."""
    before = tree.pids()
    os.kill(before["shard-0"], signal.SIGKILL)  # type: ignore[arg-type]
    shard = tree.wait_running("shard-0", 2)
    assert shard.pid != before["shard-0"]
    assert shard.restarts == 1 and shard.operator_restarts == 0
    assert shard.last_exit == f.ExitInfo(signal=signal.SIGKILL, status=None)
    after = tree.pids()
    for name in ("coordinator", "custodian", "shard-1"):
        assert after[name] == before[name], name
    report = tree.wait_plan(tree.submit(plan("after", task("a", "true"), task("b", "true"))))
    assert report.ok


@pytest.mark.parametrize("role", ["coordinator", "custodian"])
def test_sigkill_coordinator_or_custodian_restarts_it_alone(tree: Tree, role: str) -> None:
    """SIGKILL of the coordinator or the custodian restarts it alone; shards keep their pids."""
    before = tree.pids()
    os.kill(before[role], signal.SIGKILL)  # type: ignore[arg-type]
    tree.wait_running(role, 2)
    after = tree.pids()
    assert after[role] != before[role]
    for name, pid in before.items():
        if name != role:
            assert after[name] == pid, name
    assert tree.wait_plan(tree.submit(plan("after", task("a", "true")))).ok


def test_lane_on_killed_shard_is_reported_and_plan_completes(tree: Tree) -> None:
    """A lane whose shard dies is paused, not failed (a lost worker process is no verdict on the
    work): it is re-placed and re-run as attempt 2 with a partial-work warning, its dependant
    runs, the plan completes ok, and the lost lane's command does not outlive its shard."""
    long = 'if [ "$ORCHESTRA_ATTEMPT" = 1 ]; then sleep 300; fi'
    plan_id = tree.submit(plan("lost", task("long", long), task("dep", "true", ["long"])))

    def running_lane() -> f.LaneInfo | None:
        reply = tree.ctl(f.CtlLanes())
        assert isinstance(reply, f.LaneList)
        return next((lane for lane in reply.lanes if lane.state == "running"), None)

    lane = wait_until(running_lane, 20, "the lane to run")
    assert isinstance(lane, f.LaneInfo)
    shard_pid = tree.pids()[lane.shard]
    sleeper = wait_until(
        lambda: next(
            (p for p in psutil.Process(shard_pid).children(recursive=True) if "sleep" in p.name()),
            None,
        ),
        10,
        "the lane's sleep",
    )
    assert isinstance(sleeper, psutil.Process)
    os.kill(shard_pid, signal.SIGKILL)  # type: ignore[arg-type]
    report = tree.wait_plan(plan_id, timeout_s=30)
    assert report.ok, report
    by_id = {t.id: t for t in report.tasks}
    long_report = by_id["long"]
    assert (long_report.status, long_report.attempts, long_report.failure) == ("succeeded", 2, None)
    assert long_report.lane != lane.lane
    assert len(long_report.warnings) == 1 and lane.lane in long_report.warnings[0]
    assert "partial work" in long_report.warnings[0]
    assert by_id["dep"].status == "succeeded"
    wait_until(lambda: not sleeper.is_running(), 10, "the lane's command to be killed")


def test_ctl_restart_is_graceful_and_counted_apart(tree: Tree) -> None:
    """`ctl restart coordinator`: new pid, generation + 1, counted as an operator restart; every
    other child keeps its pid."""
    before = tree.pids()
    assert tree.ctl(f.CtlRestart(name="coordinator")) == f.Ack()
    child = tree.child("coordinator")
    assert child.state == "running" and child.generation == 2
    assert child.pid != before["coordinator"]
    assert child.operator_restarts == 1 and child.restarts == 0
    assert child.last_exit == f.ExitInfo(signal=None, status=0)
    after = tree.pids()
    for name, pid in before.items():
        if name != "coordinator":
            assert after[name] == pid


def test_ctl_restart_unknown_child_is_refused(tree: Tree) -> None:
    """Restarting a name that is not a child is a typed not_found error naming the children."""
    from orchestra_sup.errors import ErrorCode, RemoteError

    with pytest.raises(RemoteError) as info:
        tree.ctl(f.CtlRestart(name="shard-9"))
    assert info.value.code is ErrorCode.NOT_FOUND
    assert "shard-0" in info.value.message


def test_stop_via_ctl_exits_zero_and_leaves_nothing(tree: Tree) -> None:
    """`ctl stop` stops the tree as SIGTERM does."""
    assert tree.ctl(f.CtlStop()) == f.Ack()
    assert tree.proc.wait(timeout=30) == 0
    assert_no_leftovers()


def test_second_start_on_live_run_dir_is_refused(tree: Tree, tmp_path: Path) -> None:
    """A second `start` on a run directory a live tree owns exits 2 with one line."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestra_sup",
            "start",
            "--run-dir",
            str(tree.run_dir),
            "--state-dir",
            str(tmp_path / "other"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "owned by a live tree" in proc.stderr and str(tree.proc.pid) in proc.stderr
    assert tree.status().supervisor_pid == tree.proc.pid
    assert not (tmp_path / "other").exists()  # the refused start made no state directory


def test_stale_run_dir_of_a_crashed_tree_is_taken_over(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """SIGKILL of the supervisor takes its children down (parent-death signal); a new tree on
    the same run directory takes the stale one over."""
    first = tree_factory(workspace=repo, base=tmp_path / "a")
    children = [psutil.Process(pid) for pid in first.pids().values() if pid]
    first.stop(signal.SIGKILL)
    wait_until(
        lambda: not any(alive(p) for p in children),
        10,
        "children to die with their supervisor",
    )
    assert (first.run_dir / "supervisor.lock").exists()
    second = tree_factory(workspace=repo, base=tmp_path / "b", run_dir=first.run_dir)
    assert second.status().supervisor_pid == second.proc.pid


def test_status_answers_while_the_coordinator_is_wedged(tree: Tree) -> None:
    """`ctl status` is answered by the supervisor even while the coordinator is stopped dead;
    a request the coordinator must answer fails within its timeout instead of hanging."""
    from orchestra_sup.errors import ErrorCode, RemoteError

    pid = tree.pids()["coordinator"]
    os.kill(pid, signal.SIGSTOP)  # type: ignore[arg-type]
    try:
        reply = tree.ctl(f.CtlStatus(), timeout_s=2.0)
        assert isinstance(reply, f.StatusReply)
        with pytest.raises(RemoteError) as info:
            tree.ctl(f.CtlPlan(id="nope"), timeout_s=1.0)
        assert info.value.code is ErrorCode.TIMEOUT
        assert isinstance(tree.ctl(f.CtlStatus(), timeout_s=2.0), f.StatusReply)
    finally:
        os.kill(pid, signal.SIGCONT)  # type: ignore[arg-type]


def test_custodian_serves_read_tools_and_refuses_coordinator_sandboxes(tree: Tree) -> None:
    """Over the custodian's real socket: read_file and list_dir answer, a path escape is a typed
    error, and a sandbox asked for by the coordinator is refused."""
    from orchestra_sup.errors import ErrorCode

    with RawPeer(tree.run_dir / "custodian.ipc", b"coordinator.99", "coordinator") as peer:
        ask = peer.ask
        read = ask(f.ToolCall(tool="read_file", params={"path": "README"}))
        assert isinstance(read, f.ToolResult) and read.value["text"] == "seed\n"
        listing = ask(f.ToolCall(tool="list_dir", params={"path": ""}))
        assert isinstance(listing, f.ToolResult)
        assert [e["name"] for e in listing.value["entries"]] == ["README"]
        escape = ask(f.ToolCall(tool="read_file", params={"path": "../../etc/passwd"}))
        assert isinstance(escape, f.Error) and escape.code is ErrorCode.PATH_ESCAPE
        refused = ask(f.SandboxCreate(lane="sneaky"))
        assert isinstance(refused, f.Error) and refused.code is ErrorCode.FORBIDDEN


def test_forged_heartbeats_do_not_keep_a_frozen_child_alive(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """Heartbeats count only from the child's own connection: a stopped shard is killed by the
    watchdog and restarted while a stranger sends heartbeats in its name."""
    config = tmp_path / "fast.toml"
    config.write_text("[supervisor]\nwatchdog_s = 1.0\n")
    tree = tree_factory(workspace=repo, config=config)
    victim = tree.pids()["shard-1"]
    beat = f.Heartbeat(loop_lag_p50_ms=0, loop_lag_p99_ms=0, loop_lag_max_ms=0)
    os.kill(victim, signal.SIGSTOP)  # type: ignore[arg-type]
    with RawPeer(tree.run_dir / "supervisor.ipc", sender="shard-1") as stranger:

        def restarted() -> bool:
            stranger.send(beat, "x", ttl_s=None)
            child = tree.child("shard-1")
            return child.generation == 2 and child.state == "running"

        wait_until(restarted, 20, "the watchdog to restart the frozen shard-1")
    assert tree.child("shard-1").last_exit == f.ExitInfo(signal=signal.SIGKILL, status=None)


def test_a_stranger_cannot_take_over_a_live_peers_routing_id(tree: Tree) -> None:
    """A socket that connects to the custodian under shard-0's routing id and goes away does not
    cut shard-0 off: its next lane still gets a sandbox at once."""
    first = tree.wait_plan(tree.submit(plan("warm", task("a", "true"), task("b", "true"))))
    assert first.ok and {t.shard for t in first.tasks} == {"shard-0", "shard-1"}
    with RawPeer(tree.run_dir / "custodian.ipc", b"shard-0.1") as stranger:
        stranger.sock.send(b"garbage")
        stranger.sock.poll(200)
    report = tree.wait_plan(
        tree.submit(plan("after", task("a", "true"), task("b", "true"))), timeout_s=20
    )
    assert report.ok, report


def test_second_tree_on_a_live_state_dir_is_refused(tree: Tree, tmp_path: Path) -> None:
    """Two trees on one state directory would each call the other's lanes lost: refused."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestra_sup",
            "start",
            "--run-dir",
            str(tmp_path / "r2"),
            "--state-dir",
            str(tree.state_dir),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "state directory" in proc.stderr and "owned by a live tree" in proc.stderr
    assert not (tmp_path / "r2").exists()  # the refused start made no run directory

"""OTP behaviours on real process trees: shutdown timeouts, intensity, the watchdog, identity."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, assert_no_leftovers, plan, task, wait_until

pytestmark = pytest.mark.integration

DEBUG = {"ORCHESTRA_SUP_DEBUG_HOOKS": "1"}


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tree.toml"
    path.write_text(text)
    return path


def test_child_ignoring_sigterm_is_killed_after_the_shutdown_timeout(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """`ctl restart` of a child that ignores SIGTERM: SIGKILL after shutdown_timeout_s, reaped,
    and started again."""
    cfg = config(tmp_path, "[supervisor]\nshutdown_timeout_s = 0.5\n")
    tree = tree_factory(workspace=repo, config=cfg, extra_env=DEBUG)
    assert tree.ctl(f.CtlDebug(name="shard-1", action="ignore_sigterm")) == f.Ack()
    old = tree.pids()["shard-1"]
    assert tree.ctl(f.CtlRestart(name="shard-1")) == f.Ack()
    child = tree.child("shard-1")
    assert child.last_exit == f.ExitInfo(signal=signal.SIGKILL, status=None)
    assert child.generation == 2 and child.pid != old and child.state == "running"
    assert not psutil.pid_exists(old) or psutil.Process(old).status() == psutil.STATUS_ZOMBIE


def test_stalled_loop_is_restarted_by_the_watchdog(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """A child whose event loop is blocked stops heartbeating; after watchdog_s it is killed
    and restarted, and the others keep their pids."""
    cfg = config(tmp_path, "[supervisor]\nwatchdog_s = 1.0\n")
    tree = tree_factory(workspace=repo, config=cfg, extra_env=DEBUG)
    before = tree.pids()
    assert tree.ctl(f.CtlDebug(name="coordinator", action="block_loop", seconds=60)) == f.Ack()
    child = tree.wait_running("coordinator", 2, timeout_s=20)
    assert child.last_exit == f.ExitInfo(signal=signal.SIGKILL, status=None)
    assert child.restarts == 1
    after = tree.pids()
    for name in ("custodian", "shard-0", "shard-1"):
        assert after[name] == before[name]


def test_a_stalled_supervisor_does_not_blame_its_children(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """SIGSTOP the supervisor for longer than the watchdog: when it resumes, its children's
    silence was its own, so none is killed."""
    cfg = config(tmp_path, "[supervisor]\nwatchdog_s = 1.0\n")
    tree = tree_factory(workspace=repo, config=cfg)
    before = tree.pids()
    os.kill(tree.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(2.5)  # the fault injected, not a synchronisation: a stall > watchdog_s
    finally:
        os.kill(tree.proc.pid, signal.SIGCONT)
    wait_until(lambda: "silence forgiven" in tree.log(), 10, "the watchdog to notice its stall")
    status = tree.status()
    assert tree.pids() == before
    assert all(c.restarts == 0 and c.state == "running" for c in status.children), status


def test_loop_lag_of_every_process_is_in_status(
    tree_factory: Callable[..., Tree], repo: Path
) -> None:
    """`ctl status` carries (p50, p99, max) loop lag for the supervisor and every child; a loop
    blocked for 0.6 s (below the watchdog) shows up in that child's max."""
    tree = tree_factory(workspace=repo, extra_env=DEBUG)
    wait_until(
        lambda: all(c.loop_lag_ms is not None for c in tree.status().children),
        20,
        "every child's first heartbeat",
    )
    assert tree.ctl(f.CtlDebug(name="custodian", action="block_loop", seconds=0.6)) == f.Ack()
    lagged = wait_until(
        lambda: (lag := tree.child("custodian").loop_lag_ms) is not None and lag[2] >= 500 and lag,
        20,
        "the custodian's blocked loop in its max lag",
    )
    assert isinstance(lagged, tuple) and lagged[0] <= lagged[1] <= lagged[2]
    for child in tree.status().children:
        assert child.loop_lag_ms is not None
        assert 0 <= child.loop_lag_ms[0] <= child.loop_lag_ms[1] <= child.loop_lag_ms[2]
    p50, p99, worst = tree.status().loop_lag_ms
    assert 0 <= p50 <= p99 <= worst


def test_debug_hooks_are_off_unless_enabled(tree: Tree) -> None:
    """Without ORCHESTRA_SUP_DEBUG_HOOKS=1 the fault-injection request is refused."""
    from orchestra_sup.errors import ErrorCode, RemoteError

    with pytest.raises(RemoteError) as info:
        tree.ctl(f.CtlDebug(name="shard-0", action="block_loop", seconds=5))
    assert info.value.code is ErrorCode.FORBIDDEN


def test_intensity_exceeded_at_the_root_exits_3_and_leaves_nothing(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """More than max_restarts restarts within max_seconds at the root: every child stopped, the
    supervisor exits 3 (for systemd's Restart=on-failure), nothing left behind."""
    cfg = config(tmp_path, "[supervisor]\nmax_restarts = 1\nmax_seconds = 60.0\n")
    tree = tree_factory(workspace=repo, config=cfg)
    tree.submit(plan("busy", task("a", "sleep 300")))
    os.kill(tree.pids()["coordinator"], signal.SIGKILL)  # type: ignore[arg-type]
    tree.wait_running("coordinator", 2)
    os.kill(tree.pids()["coordinator"], signal.SIGKILL)  # type: ignore[arg-type]
    assert tree.proc.wait(timeout=30) == 3
    assert_no_leftovers()


def test_shard_intensity_escalates_to_the_root_which_restarts_all_shards(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """The shards' sub-supervisor gives up after its own intensity; the root restarts it as one
    child: every shard comes back with a new generation, the coordinator and custodian keep
    their pids."""
    cfg = config(tmp_path, "[supervisor]\nmax_restarts = 1\nmax_seconds = 60.0\n")
    tree = tree_factory(workspace=repo, config=cfg)
    before = tree.pids()
    os.kill(before["shard-0"], signal.SIGKILL)  # type: ignore[arg-type]
    tree.wait_running("shard-0", 2)
    os.kill(tree.pids()["shard-0"], signal.SIGKILL)  # type: ignore[arg-type]
    tree.wait_running("shard-0", 3)
    tree.wait_running("shard-1", 2)
    after = tree.pids()
    assert after["coordinator"] == before["coordinator"]
    assert after["custodian"] == before["custodian"]
    assert after["shard-1"] != before["shard-1"]
    assert tree.proc.poll() is None


def test_a_planted_pid_is_never_signalled(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """A process the tree did not start, whose pid is written into the run and state files,
    survives a shard crash, the orphan sweep and the stop."""
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        state = tmp_path / "state"
        run_dir = Path(f"/tmp/osup-plant-{os.getpid()}")
        for where in (state, run_dir):
            where.mkdir(parents=True, exist_ok=True)
        for path in (
            run_dir / "supervisor.lock",
            state / "tree.lock",
            state / "shard-0.pid",
            run_dir / "coordinator.pid",
        ):
            path.write_text(f"{stranger.pid}\n")
        tree = tree_factory(workspace=repo, run_dir=run_dir)
        os.kill(tree.pids()["shard-0"], signal.SIGKILL)  # type: ignore[arg-type]
        tree.wait_running("shard-0", 2)
        assert tree.stop() == 0
        assert stranger.poll() is None, "the planted process was signalled"
    finally:
        stranger.kill()
        stranger.wait()


def test_lane_daemons_die_with_their_shard(tree: Tree, tmp_path: Path) -> None:
    """A lane that backgrounds, setsids and double-forks: SIGKILL of its shard leaves none of
    those processes running."""
    pids = tmp_path / "pids"
    cmd = (
        f"sleep 300 & echo $! >> {pids}; "
        f"setsid sleep 301 & echo $! >> {pids}; "
        f"( (sleep 302 & echo $! >> {pids}) & ); "
        f"sleep 303"
    )
    tree.submit(plan("daemons", task("d", cmd)))
    wait_until(
        lambda: pids.exists() and len(pids.read_text().split()) == 3,
        20,
        "the lane to start its daemons",
    )
    spawned = [int(p) for p in pids.read_text().split()]
    shard_of = {lane.lane: lane.shard for lane in tree.ctl(f.CtlLanes()).lanes}  # type: ignore[union-attr]
    (shard,) = set(shard_of.values())
    os.kill(tree.pids()[shard], signal.SIGKILL)  # type: ignore[arg-type]

    def gone() -> bool:
        for pid in spawned:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    return False
            except psutil.NoSuchProcess:
                continue
        return True

    wait_until(gone, 10, "every process of the lane to die with its shard")


def test_a_waiting_lane_ends_its_shards_backoff(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """A shard in a long restart backoff: a lane that has nowhere else to go makes the
    coordinator ask the supervisor to recover it now, instead of waiting the backoff out."""
    cfg = config(tmp_path, "[supervisor]\nbackoff_initial_s = 30.0\nbackoff_max_s = 30.0\n")
    tree = tree_factory(workspace=repo, shards=1, config=cfg)
    os.kill(tree.pids()["shard-0"], signal.SIGKILL)  # type: ignore[arg-type]
    tree.wait_running("shard-0", 2)  # the first restart is immediate
    os.kill(tree.pids()["shard-0"], signal.SIGKILL)  # type: ignore[arg-type]
    wait_until(lambda: tree.child("shard-0").state == "backoff", 10, "shard-0 to back off")
    plan_id = tree.submit(plan("urgent", task("now", "true")))
    report = tree.wait_plan(plan_id, timeout_s=15)  # half the 30 s backoff
    assert report.ok, report
    assert tree.child("shard-0").generation == 3

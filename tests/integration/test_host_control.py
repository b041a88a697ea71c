"""What a root's operator asks of a host (issue 21, `supervisor.hostctl`): `ctl restart
host-a/shard-0` and `ctl rollover host-a` are done by host-a's agent, and `ctl stop-host host-a`
drains the host, then its agent stops and revokes its lease, so etcd and the root see it leave
at once."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.etcd_cluster import EtcdCluster, needs_etcd
from tests.integration.harness import Tree, plan, task, wait_until
from tests.integration.hostagent import TTL_S, Agent, host_of, registration
from tests.integration.test_ctl_access import cli
from tests.integration.test_remote_shards import joined_tree

pytestmark = [pytest.mark.integration, needs_etcd]


def shard_generation(tree: Tree, name: str) -> int | None:
    host = host_of(tree, "host-a")
    shard = next((s for s in host.shards if s.name == name), None) if host else None
    return shard.generation if shard is not None and shard.state == "running" else None


def test_a_hosts_shard_is_restarted_by_its_agent_when_the_root_asks(
    tree_factory: Callable[..., Tree],
    etcd_cluster: EtcdCluster,
    agents: Callable[..., Agent],
    tmp_path: Path,
) -> None:
    tree, agent, _keys = joined_tree(tree_factory, etcd_cluster, agents, tmp_path)
    assert shard_generation(tree, "shard-0") == 1
    done = cli("ctl", "--run-dir", str(tree.run_dir), "restart", "host-a/shard-0")
    assert done.returncode == 0 and "restarted host-a/shard-0" in done.stdout, done
    wait_until(lambda: shard_generation(tree, "shard-0") == 2, 15, "host-a's shard-0 gen 2")
    assert "the root asks: CtlRestart" in agent.log()
    ran = tree.wait_plan(tree.submit(plan("after", task("t", "true", requires=["remote"]))), 60)
    assert ran.ok and ran.tasks[0].shard == "host-a/shard-0", ran.tasks

    for name, why in (
        ("host-b/shard-0", "no host 'host-b' joined (hosts: host-a)"),
        ("host-a/shard-9", "no child named 'shard-9'"),
    ):
        refused = cli("ctl", "--run-dir", str(tree.run_dir), "restart", name)
        assert refused.returncode != 0 and why in refused.stderr, refused
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_a_restart_of_a_hosts_busy_shard_reruns_its_lane_once(
    tree_factory: Callable[..., Tree],
    etcd_cluster: EtcdCluster,
    agents: Callable[..., Agent],
    tmp_path: Path,
) -> None:
    """`ctl restart host-a/shard-0` while its lane runs: the agent reports the shard stopping
    at once, so the lane runs again on the next generation (attempt 2), never on the stopping
    one; the shard takes lanes after."""
    tree, _agent, _keys = joined_tree(tree_factory, etcd_cluster, agents, tmp_path)
    plan_id = tree.submit(plan("busy", task("long", "sleep 3", requires=["remote"])))

    wait_until(lambda: tree.task(plan_id).status == "running", 30, "the lane on host-a")
    done = cli("ctl", "--run-dir", str(tree.run_dir), "restart", "host-a/shard-0")
    assert done.returncode == 0, done
    report = tree.wait_plan(plan_id, 60)
    assert report.ok and report.tasks[0].attempts == 2, report.tasks
    after = tree.wait_plan(tree.submit(plan("after", task("t", "true", requires=["remote"]))), 60)
    assert after.ok, after.tasks


def test_stop_host_drains_then_the_agent_leaves(
    tree_factory: Callable[..., Tree],
    etcd_cluster: EtcdCluster,
    agents: Callable[..., Agent],
    tmp_path: Path,
) -> None:
    """A lane runs on host-a: stop-host leaves it running, places nothing new there (a task
    only host-a could run waits), and once the lane has ended the agent exits 0 and its
    registration is gone from etcd well before its lease could have ended by itself."""
    tree, agent, _keys = joined_tree(tree_factory, etcd_cluster, agents, tmp_path)
    go = tmp_path / "go"
    wait = f"while [ ! -e {go} ]; do sleep 0.05; done"
    running = tree.submit(plan("running", task("there", wait, requires=["remote"])))

    wait_until(lambda: tree.task(running).status == "running", 30, "the lane on host-a")
    argv = [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(tree.run_dir)]
    stopping = subprocess.Popen(
        [*argv, "stop-host", "host-a", "--drain-timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(
            lambda: host_of(tree, "host-a").state == "draining",  # type: ignore[union-attr]
            15,
            "host-a draining",
        )
        waits = tree.submit(plan("waits", task("there", "true", requires=["remote"])))
        here = tree.wait_plan(tree.submit(plan("here", task("t", "true"))), timeout_s=30)
        assert here.ok and here.tasks[0].shard == "shard-0", here.tasks  # placed after "waits"
        assert tree.task(waits).shard is None, tree.task(waits)
        assert agent.proc.poll() is None  # its lane still runs: the agent stays
        go.touch()
        out, err = stopping.communicate(timeout=60)
    finally:
        if stopping.poll() is None:
            stopping.kill()
    assert stopping.returncode == 0 and "host-a drained and stopping" in out, (out, err)
    assert tree.wait_plan(running, timeout_s=30).ok
    left = time.monotonic()
    assert agent.proc.wait(timeout=30) == 0, agent.log()
    wait_until(lambda: registration(etcd_cluster, "host-a") is None, TTL_S, "the lease revoked")
    print(f"registration gone {time.monotonic() - left:.2f} s after stop-host answered")
    assert tree.task(waits).shard is None  # nothing else offers "remote": it waits for a host


def test_a_host_rolls_over_its_shards_when_the_root_asks(
    tree_factory: Callable[..., Tree],
    etcd_cluster: EtcdCluster,
    agents: Callable[..., Agent],
    tmp_path: Path,
) -> None:
    """`ctl rollover host-a` while a lane runs there: the agent starts shard-0's generation 2
    beside generation 1, and the root's roster follows (a new task runs on generation 2 while
    the old one still runs its lane, for longer than the lease's TTL); the lane finishes there,
    generation 1 retires, and the report names host-a's shard. A `stop-host` asked during the
    drain waits for it: a draining generation's lanes count. The agent itself is not
    re-executed: asked, it refuses."""
    tree, agent, _keys = joined_tree(tree_factory, etcd_cluster, agents, tmp_path)
    refused = cli("ctl", "--run-dir", str(tree.run_dir), "rollover", "host-a/supervisor")
    assert refused.returncode == 2, refused
    assert "this is a host's agent" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    go = tmp_path / "go"
    wait = f"while [ ! -e {go} ]; do sleep 0.05; done"
    running = tree.submit(plan("running", task("there", wait, requires=["remote"])))

    wait_until(lambda: tree.task(running).status == "running", 30, "the lane on host-a")
    argv = [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(tree.run_dir)]
    rolling = subprocess.Popen(
        [*argv, "rollover", "host-a", "--drain-timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    stopping: subprocess.Popen[str] | None = None
    try:
        wait_until(lambda: shard_generation(tree, "shard-0") == 2, 30, "generation 2 running")
        beside = tree.wait_plan(
            tree.submit(plan("beside", task("t", "true", requires=["remote"]))), 60
        )
        assert beside.ok and beside.tasks[0].shard == "host-a/shard-0", beside.tasks
        # The lane outlives two lease TTLs on the draining generation 1: every renewal's
        # deadline reaches it too, or it would stop its lanes as a shard its agent forgot.
        stopping = subprocess.Popen(
            [*argv, "stop-host", "host-a", "--drain-timeout", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        watch_until = time.monotonic() + 2 * TTL_S
        while time.monotonic() < watch_until:
            assert tree.task(running).status == "running", tree.task(running)
            assert rolling.poll() is None, rolling.communicate()
            assert stopping.poll() is None, stopping.communicate()  # generation 1 drains
            time.sleep(0.1)
        go.touch()
        out, err = rolling.communicate(timeout=60)
        stopped = stopping.communicate(timeout=60)
    finally:
        for proc in (rolling, stopping):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert rolling.returncode == 0, (out, err)
    assert stopping.returncode == 0 and "host-a drained and stopping" in stopped[0], stopped
    assert (
        "host-a/shard-0" in out
        and "generation 1 drained: 0 moved, 0 re-run partial, 1 finished there" in out
    ), out
    assert "rollover host-a/" in out and " of host-a done" in out, out
    finished = tree.wait_plan(running, timeout_s=30)
    assert finished.ok and finished.tasks[0].attempts == 1, finished.tasks
    assert "the root asks: CtlRollover" in agent.log()
    assert agent.proc.wait(timeout=30) == 0, agent.log()

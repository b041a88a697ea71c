"""Losing the coordinator or the custodian disturbs nothing that runs elsewhere; chaos loses
nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestra_sup.config import ISOLATION_ENV, LANE_USER_ENV
from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, plan, task, wait_until

pytestmark = pytest.mark.integration


def running_lanes(tree: Tree) -> list[f.LaneInfo]:
    reply = tree.ctl(f.CtlLanes())
    assert isinstance(reply, f.LaneList)
    return [lane for lane in reply.lanes if lane.state == "running"]


def test_coordinator_loss_keeps_lanes_running_and_loses_no_result(
    tree: Tree, tmp_path: Path
) -> None:
    """The coordinator is frozen while four lanes finish (their results go to its socket and
    are never read), then SIGKILLed: the lanes never noticed, and the results, kept in the
    shards' durable outboxes, reach the restarted coordinator; every task succeeds once."""
    gate = tmp_path / "gate"
    runs = tmp_path / "runs"
    cmd = f"while [ ! -e {gate} ]; do sleep 0.05; done; echo $ORCHESTRA_TASK >> {runs}"
    plan_id = tree.submit(plan("c-loss", *(task(f"t{i}", cmd) for i in range(4))))
    wait_until(lambda: len(running_lanes(tree)) == 4, 20, "four running lanes")
    before = tree.pids()
    coordinator = before["coordinator"]
    os.kill(coordinator, signal.SIGSTOP)  # type: ignore[arg-type]
    try:
        gate.touch()
        wait_until(
            lambda: not tree.ctl(f.CtlLanes()).lanes,
            20,  # type: ignore[union-attr]
            "the lanes to finish and hand their results to the outbox",
        )
        frozen = tree.ctl(f.CtlLanes())
        assert isinstance(frozen, f.LaneList) and frozen.unanswered == ["coordinator"]
    finally:
        os.kill(coordinator, signal.SIGKILL)  # type: ignore[arg-type]
    tree.wait_running("coordinator", 2)
    report = tree.wait_plan(plan_id, timeout_s=30)
    assert report.ok, report
    assert all(t.attempts == 1 for t in report.tasks)
    assert sorted(runs.read_text().split()) == ["t0", "t1", "t2", "t3"]
    after = tree.pids()
    for name in ("custodian", "shard-0", "shard-1"):
        assert after[name] == before[name]


def test_custodian_loss_is_waited_out_and_disturbs_no_running_lane(
    tree: Tree, tmp_path: Path
) -> None:
    """SIGKILL of the custodian while one lane runs and another waits for its sandbox: the
    running lane is untouched, the sandbox request is served once the custodian is back, and
    sandboxes made before the crash are still on disk."""
    gate = tmp_path / "gate"
    plan_id = tree.submit(
        plan(
            "k-loss",
            task("first", f"while [ ! -e {gate} ]; do sleep 0.05; done"),
            task("second", "echo second > second.txt", needs=["first"], commit=True),
        )
    )
    (lane,) = wait_until(lambda: running_lanes(tree), 20, "the first lane to run")  # type: ignore[misc]
    os.kill(tree.pids()["custodian"], signal.SIGKILL)  # type: ignore[arg-type]
    gate.touch()  # 'second' now asks for a sandbox while the custodian is down or restarting
    report = tree.wait_plan(plan_id, timeout_s=60)
    assert report.ok, report
    assert all(t.attempts == 1 for t in report.tasks)
    assert Path(lane.sandbox or "").is_dir()
    assert tree.child("custodian").generation == 2


def default_isolation(**extra: str) -> dict[str, str]:
    """This environment without the suite's isolation overrides (tests/conftest.py), plus
    `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in (ISOLATION_ENV, LANE_USER_ENV)}
    return env | extra


@pytest.mark.timeout(120)
def test_short_chaos_run_loses_nothing(tmp_path: Path) -> None:
    """`bench chaos` for 15 s with the isolation a user gets by default (not the suite's
    `ORCHESTRA_SUP_ISOLATION` / `ORCHESTRA_SUP_LANE_USER`): random SIGKILLs every 1-3 s; tasks
    succeed, each success left its ledger line, nothing lost, nothing duplicated, no orphan, the
    supervisor alive."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestra_sup",
            "bench",
            "chaos",
            "--duration",
            "15",
            "--json",
            "--seed",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=110,
        stdin=subprocess.DEVNULL,
        env=default_isolation(TMPDIR=str(tmp_path)),
    )
    report = json.loads(proc.stdout)
    assert report["kills"] >= 4 and report["tasks"] >= 50
    assert report["succeeded"] > 0 and report["unrecorded"] == 0
    assert report["lost"] == 0 and report["duplicated"] == 0 and report["orphans"] == 0
    assert report["supervisor_alive"] is True
    assert proc.returncode == 0, proc.stderr

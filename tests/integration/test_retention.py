"""`[retention]` on a real tree (issue 22): a finished plan is pruned (its records, its inbox
entries), and its idempotency key outlives it, across a coordinator SIGKILL: a late re-send of
the key starts nothing. A finished lane's sandbox is removed; a running one's never."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest

from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, plan, task, wait_until
from tests.integration.test_ctl_access import cli

pytestmark = pytest.mark.integration


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def coordinator_keys(tree: Tree, db: str) -> list[bytes]:
    """The keys of the coordinator's db `db`, as committed (LMDB opened read-only beside it)."""
    env = lmdb.open(
        str(tree.state_dir / "coordinator"), readonly=True, lock=False, max_dbs=16, create=False
    )
    try:
        with env.begin() as txn:
            try:
                handle = env.open_db(db.encode(), txn=txn, create=False)
            except lmdb.NotFoundError:
                return []
            return [key for key, _ in txn.cursor(handle)]
    finally:
        env.close()


def test_a_pruned_plans_key_still_answers_a_late_resend(
    tree_factory: Callable[..., Tree], tmp_path: Path
) -> None:
    """`start_lane key=k` runs its lane once; `ctl prune` takes the finished plan (its record,
    its inbox entry), and `ctl plan` no longer finds it; the same key sent again, before and
    after a coordinator SIGKILL, is a duplicate of the pruned plan and runs nothing."""
    config = tmp_path / "tree.toml"
    config.write_text("[retention]\nplans_s = 0\nkeys_s = 3600\nevery_s = 3600\n")
    tree = tree_factory(shards=1, config=config)
    ran = tmp_path / "ran"
    run = f"echo once >> {ran}"
    first = tree.call("start_lane", run=run, key="deploy-42")
    assert first["duplicate"] is False
    assert tree.wait_plan(first["plan"], 30).ok
    lane = tree.wait_plan(first["plan"], 1).tasks[0].lane
    assert f"result:{lane}".encode() in coordinator_keys(tree, "inbox")

    dry = cli("ctl", "--run-dir", str(tree.run_dir), "prune", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["plans"] == [first["plan"]]
    assert isinstance(tree.ctl(f.CtlPlan(id=first["plan"])), f.PlanReport)  # still there
    done = cli("ctl", "--run-dir", str(tree.run_dir), "prune", "--json")
    assert done.returncode == 0, done.stderr

    def resend() -> dict:
        """The key sent again, and whatever it started run to its end."""
        answer = tree.call("start_lane", run=run, key="deploy-42")
        if answer["plan"] != first["plan"]:
            tree.wait_plan(answer["plan"], 30)
        return answer

    again = resend()
    assert lines(ran) == ["once"], "the re-sent key ran its action a second time"
    assert (again["plan"], again["duplicate"], again["status"]) == (first["plan"], True, "pruned")
    report = json.loads(done.stdout)
    assert (report["plans"], report["tasks"], report["inbox"]) == ([first["plan"]], 1, 1)
    assert report["kept"] == 1
    gone = cli("ctl", "--run-dir", str(tree.run_dir), "plan", first["plan"])
    assert gone.returncode != 0 and f"no plan '{first['plan']}'" in gone.stderr, gone
    wait_until(
        lambda: f"result:{lane}".encode() not in coordinator_keys(tree, "inbox"),
        10,
        "the inbox entry deleted",
    )
    assert first["plan"].encode() not in coordinator_keys(tree, "plan_heads")
    assert coordinator_keys(tree, "plan_keys") == [b"deploy-42"]

    before = tree.child("coordinator")
    assert before.pid is not None
    os.kill(before.pid, signal.SIGKILL)
    tree.wait_running("coordinator", before.generation + 1)
    late = resend()
    assert lines(ran) == ["once"], "after a restart, the re-sent key ran its action again"
    assert (late["plan"], late["duplicate"]) == (first["plan"], True), late
    other = tree.call("start_lane", run=run, key="deploy-43")  # a new key runs, as ever
    assert tree.wait_plan(other["plan"], 30).ok
    assert lines(ran) == ["once", "once"]  # deploy-42 once, deploy-43 once


def test_a_finished_lanes_sandbox_goes_and_a_running_ones_stays(
    tree_factory: Callable[..., Tree], tmp_path: Path
) -> None:
    """With `sandboxes_s = 0` and a prune every 0.2 s: a lane's sandbox is there for as long as
    it runs (many prunes pass), and goes once the lane ended; a marked sandbox's mark goes with
    it."""
    config = tmp_path / "tree.toml"
    config.write_text("[retention]\nsandboxes_s = 0\nevery_s = 0.2\n")
    tree = tree_factory(shards=1, config=config)
    gate = tmp_path / "gate"
    plan_id = tree.submit(
        plan(
            "kept",
            task("long", f"while [ ! -e {gate} ]; do sleep 0.05; done"),
            task("short", "true"),
        )
    )
    sandboxes = tree.state_dir / "sandboxes"

    def lanes() -> dict[str, str]:
        reply = tree.ctl(f.CtlPlan(id=plan_id))
        assert isinstance(reply, f.PlanReport)
        return {t.id: t.lane for t in reply.tasks if t.lane}

    wait_until(
        lambda: (
            tree.task(plan_id, "short").status == "succeeded"
            and tree.task(plan_id, "long").status == "running"
        ),
        30,
        "both",
    )
    ids = lanes()
    wait_until(lambda: not (sandboxes / ids["short"]).exists(), 10, "the short lane's sandbox gone")
    watch = time.monotonic() + 1.5  # seven prunes or so
    while time.monotonic() < watch:
        assert (sandboxes / ids["long"]).is_dir(), "a running lane's sandbox was removed"
        time.sleep(0.05)
    gate.touch()
    assert tree.wait_plan(plan_id, 30).ok
    wait_until(lambda: not (sandboxes / ids["long"]).exists(), 10, "the long lane's sandbox gone")
    wait_until(lambda: not list((sandboxes / ".ended").iterdir()), 10, "the marks gone")


def test_a_lane_lost_with_its_shard_has_its_sandbox_removed(
    tree_factory: Callable[..., Tree], tmp_path: Path
) -> None:
    """A lane whose shard is SIGKILLed never says it ended; the shard's next generation closes
    it as lost and tells the custodian, which removes its sandbox (`sandboxes_s = 0`), while
    the task's next lane, in a sandbox of its own, runs to the end."""
    config = tmp_path / "tree.toml"
    config.write_text("[retention]\nsandboxes_s = 0\nevery_s = 0.2\n")
    tree = tree_factory(shards=1, config=config)
    gate = tmp_path / "gate"
    plan_id = tree.submit(plan("lost", task("long", f"while [ ! -e {gate} ]; do sleep 0.05; done")))
    wait_until(lambda: tree.task(plan_id).status == "running", 30, "the lane to run")
    first = str(tree.task(plan_id).lane)
    sandbox = tree.state_dir / "sandboxes" / first
    wait_until(sandbox.is_dir, 10, "its sandbox")
    shard = tree.child("shard-0")
    assert shard.pid is not None
    os.kill(shard.pid, signal.SIGKILL)
    wait_until(lambda: tree.task(plan_id).lane not in (None, first), 30, "the task's next lane")
    wait_until(lambda: not sandbox.exists(), 20, "the lost lane's sandbox removed")
    gate.touch()
    assert tree.wait_plan(plan_id, 30).ok

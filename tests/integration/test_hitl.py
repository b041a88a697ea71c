"""HITL pauses on real trees: an approval survives the restart of its shard and of the whole
tree and is answered after it; a rejection's reason is the task's error (issue 8, ADR 0010)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, plan, task, wait_until

pytestmark = pytest.mark.integration


def awaiting(tree: Tree, plan_id: str) -> f.TaskReport:
    """Wait until the plan's one task waits for a human; return it."""

    def check() -> f.TaskReport | None:
        report = tree.ctl(f.CtlPlan(id=plan_id))
        assert isinstance(report, f.PlanReport)
        (t,) = report.tasks
        return t if t.status == "awaiting_approval" else None

    found = wait_until(check, 30, "the task to wait for approval")
    assert isinstance(found, f.TaskReport)
    return found


def pending_lane(tree: Tree) -> str:
    lanes = tree.ctl(f.CtlLanes())
    assert isinstance(lanes, f.LaneList)
    (entry,) = [lane for lane in lanes.lanes if lane.state == "awaiting_approval"]
    assert entry.question and entry.since is not None
    return entry.lane


def test_an_approval_survives_a_shard_restart_and_is_answered_after_it(
    tree: Tree, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    plan_id = tree.submit(plan("gate", task("deploy", f"touch {marker}", approve=True)))
    t = awaiting(tree, plan_id)
    assert "approve task deploy" in (t.question or "")
    lane = pending_lane(tree)
    for shard in ("shard-0", "shard-1"):
        before = tree.child(shard).generation
        assert isinstance(tree.ctl(f.CtlRestart(name=shard), timeout_s=30), f.Ack)
        tree.wait_running(shard, before + 1)
    assert awaiting(tree, plan_id).attempts == 0 and not marker.exists()  # nothing ran
    recorded = tree.ctl(f.CtlRespond(lane=lane, verdict="approve"))
    assert isinstance(recorded, f.HitlRecorded), recorded
    (done,) = tree.wait_plan(plan_id, timeout_s=30).tasks
    assert (done.status, done.attempts) == ("succeeded", 1) and marker.exists()
    assert [(a.verdict, a.uid, a.responder) for a in done.answers] == [("approve", 0, "root")]


def test_an_approval_survives_a_tree_restart_and_is_answered_after_it(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    first = tree_factory(workspace=repo)
    plan_id = first.submit(plan("gate", task("deploy", f"touch {marker}", approve=True)))
    awaiting(first, plan_id)
    lane = pending_lane(first)
    assert first.stop(signal.SIGTERM) == 0
    second = tree_factory(workspace=repo)  # the same state directory
    assert awaiting(second, plan_id).question
    assert pending_lane(second) == lane
    recorded = second.ctl(f.CtlRespond(lane=lane, verdict="approve"))
    assert isinstance(recorded, f.HitlRecorded), recorded
    (done,) = second.wait_plan(plan_id, timeout_s=30).tasks
    assert done.status == "succeeded" and marker.exists()


def test_a_rejection_s_reason_is_the_task_s_error(tree: Tree, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    plan_id = tree.submit(plan("gate", task("deploy", f"touch {marker}", approve=True)))
    awaiting(tree, plan_id)
    recorded = tree.ctl(
        f.CtlRespond(lane=pending_lane(tree), verdict="reject", text="not during the freeze")
    )
    assert isinstance(recorded, f.HitlRecorded), recorded
    (t,) = tree.wait_plan(plan_id, timeout_s=30).tasks
    assert (t.status, t.failure, t.attempts) == ("failed", "preflight_escalation", 0)
    assert t.error == "rejected by root: not during the freeze"
    assert not marker.exists()


def test_a_failed_attempt_paused_for_review_is_retried_with_the_rejection_as_feedback(
    tree: Tree, tmp_path: Path
) -> None:
    """`on_failure = "pause"`: the failed attempt waits for a human; a rejection's reason is
    the next attempt's `$ORCHESTRA_FEEDBACK`."""
    seen = tmp_path / "feedback"
    spec = plan(
        "review",
        task(
            "fix",
            f'echo "${{ORCHESTRA_FEEDBACK:-none}}" >> {seen}; test -n "$ORCHESTRA_FEEDBACK"',
            on_failure="pause",
            retries=1,
        ),
    )
    plan_id = tree.submit(spec)
    t = awaiting(tree, plan_id)
    assert t.failure == "tool_failure" and "approve to retry" in (t.question or "")
    recorded = tree.ctl(
        f.CtlRespond(lane=pending_lane(tree), verdict="reject", text="use the staging db")
    )
    assert isinstance(recorded, f.HitlRecorded) and "retried" in recorded.outcome
    (done,) = tree.wait_plan(plan_id, timeout_s=30).tasks
    assert (done.status, done.attempts) == ("succeeded", 2), done
    assert seen.read_text().splitlines() == ["none", "use the staging db"]

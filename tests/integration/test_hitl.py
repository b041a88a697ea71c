"""HITL pauses on real trees: an approval survives the restart of its shard and of the whole
tree and is answered after it; a rejection's reason is the task's error (issue 8, ADR 0010)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.coordinator.plan import load_plan
from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, git, plan, task, wait_until

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


ASKS = "tests.integration.lane_programs:Asks"


@pytest.fixture
def asking(tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path) -> Tree:
    config = tmp_path / "asks.toml"
    config.write_text(f'[lanes]\nprograms = ["{ASKS}"]\n')
    return tree_factory(workspace=repo, config=config)


def question(tree: Tree, text: str, *, live: bool) -> f.LaneInfo:
    """Wait until `ctl lanes` lists a pause asking `text`; on a live lane (its shard named)
    or on none (shard "")."""

    def check() -> f.LaneInfo | None:
        lanes = tree.ctl(f.CtlLanes())
        assert isinstance(lanes, f.LaneList)
        for lane in lanes.lanes:
            asks = lane.state == "awaiting_approval" and lane.question == text
            if asks and bool(lane.shard) == live:
                return lane
        return None

    found = wait_until(check, 30, f"a pause asking {text!r}")
    assert isinstance(found, f.LaneInfo)
    return found


def test_a_program_s_questions_are_answered_through_ctl(asking: Tree) -> None:
    plan_id = asking.submit(plan("ask", task("ask", "deploy?", program=ASKS)))
    first = question(asking, "deploy?", live=True)
    assert asking.ctl(f.CtlRespond(lane=first.lane, verdict="approve"))
    second = question(asking, "sure?", live=True)
    assert second.lane == first.lane  # the same lane asks again: it never stopped
    assert asking.ctl(f.CtlRespond(lane=second.lane, verdict="redirect", text="canary"))
    (t,) = asking.wait_plan(plan_id, timeout_s=30).tasks
    assert (t.status, t.attempts) == ("succeeded", 1), t
    assert "approve: \nredirect: canary\n" in t.output_tail
    assert [a.verdict for a in t.answers] == ["approve", "redirect"]
    assert t.notes == [f"{first.lane}: asking"]


def test_a_question_outlives_its_shard_and_the_re_run_gets_the_answer(asking: Tree) -> None:
    """The shard of a lane waiting for a human is killed: the question waits with no lane (not
    a worker loss), is answered, and the task re-runs; its program's first question finds the
    answer recorded and goes straight on to the next."""
    plan_id = asking.submit(plan("ask", task("ask", "deploy?", program=ASKS)))
    first = question(asking, "deploy?", live=True)
    shard = asking.child(first.shard)
    assert shard.pid is not None
    os.kill(shard.pid, signal.SIGKILL)
    held = question(asking, "deploy?", live=False)
    assert held.lane == first.lane
    assert asking.ctl(f.CtlRespond(lane=held.lane, verdict="approve"))
    second = question(asking, "sure?", live=True)
    assert second.lane != first.lane  # a new attempt, on a live shard
    assert asking.ctl(f.CtlRespond(lane=second.lane, verdict="approve"))
    (t,) = asking.wait_plan(plan_id, timeout_s=30).tasks
    assert (t.status, t.attempts, t.failure) == ("succeeded", 2, None), t
    assert any("while it waited for a human" in w for w in t.warnings), t.warnings


def test_a_question_outlives_a_tree_restart(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    config = tmp_path / "asks.toml"
    config.write_text(f'[lanes]\nprograms = ["{ASKS}"]\n')
    first = tree_factory(workspace=repo, config=config)
    plan_id = first.submit(plan("ask", task("ask", "deploy?", program=ASKS)))
    asked = question(first, "deploy?", live=True)
    assert first.stop(signal.SIGTERM) == 0
    second = tree_factory(workspace=repo, config=config)
    held = question(second, "deploy?", live=False)
    assert held.lane == asked.lane
    assert second.ctl(f.CtlRespond(lane=held.lane, verdict="approve"))
    confirm = question(second, "sure?", live=True)
    assert second.ctl(f.CtlRespond(lane=confirm.lane, verdict="approve"))
    (t,) = second.wait_plan(plan_id, timeout_s=30).tasks
    assert t.status == "succeeded", t


def test_a_lane_over_its_cpu_budget_fails_the_task_with_budget_exhaustion(tree: Tree) -> None:
    spec = plan(
        "spin",
        task("spin", "while :; do :; done", budget=f.Budget(cpu_s=0.5), retries=3, backoff_s=0.05),
    )
    (t,) = tree.wait_plan(tree.submit(spec), timeout_s=60).tasks
    assert (t.status, t.failure, t.attempts) == ("failed", "budget_exhaustion", 1), t
    assert "budget exhausted: cpu_s" in (t.error or "")
    assert "budget cannot cover" in (t.error or "")  # the retries stopped at the budget
    assert t.spent.cpu_s >= 0.5


def test_the_review_example_revises_after_a_rejection_and_asks_again(
    tree_factory: Callable[..., Tree], repo: Path
) -> None:
    """examples/review.toml as its header runs it: rejected, the review is done again with the
    reason as feedback and the human is asked again; approved, it commits REVIEW.md."""
    examples = Path(__file__).resolve().parents[2] / "examples"
    tree = tree_factory(
        workspace=repo,
        config=examples / "review.config.toml",
        extra_env={"PYTHONPATH": str(examples)},
    )
    plan_id = tree.submit(load_plan(examples / "review.toml"))
    first = question_like(tree, "Publish this review?")
    assert tree.ctl(f.CtlRespond(lane=first.lane, verdict="reject", text="list the authors"))
    second = question_like(tree, "Publish this review?", other_than=first.lane)
    assert tree.ctl(f.CtlRespond(lane=second.lane, verdict="approve"))
    (t,) = tree.wait_plan(plan_id, timeout_s=60).tasks
    assert (t.status, t.attempts) == ("succeeded", 2), t
    assert "revising after: list the authors" in t.output_tail
    assert t.commit is not None and "REVIEW.md" in git(repo, "show", "--stat", t.commit)
    assert [a.verdict for a in t.answers] == ["reject", "approve"]


def question_like(tree: Tree, prefix: str, other_than: str | None = None) -> f.LaneInfo:
    """Wait until a live lane (not `other_than`) waits for a human on a question starting
    with `prefix`."""

    def check() -> f.LaneInfo | None:
        lanes = tree.ctl(f.CtlLanes())
        assert isinstance(lanes, f.LaneList)
        for lane in lanes.lanes:
            asks = lane.state == "awaiting_approval" and (lane.question or "").startswith(prefix)
            if asks and lane.shard and lane.lane != other_than:
                return lane
        return None

    found = wait_until(check, 60, f"a question starting {prefix!r}")
    assert isinstance(found, f.LaneInfo)
    return found

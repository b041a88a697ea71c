"""Tasks supervised on real trees: retries with backoff, tenant quotas, budgets carved from the
plan (issue 8; `coordinator.strategy`, `coordinator.quota`, `coordinator.budget`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, plan, task, wait_until

pytestmark = pytest.mark.integration


def test_a_command_failing_twice_then_succeeding_under_retries_2_takes_three_attempts(
    tree: Tree, tmp_path: Path
) -> None:
    """Each attempt sees its number in $ORCHESTRA_ATTEMPT; the first two fail, the third
    succeeds, with a retry warning for each failure."""
    seen = tmp_path / "attempts"
    spec = plan(
        "flaky",
        task(
            "flaky",
            f'echo "$ORCHESTRA_ATTEMPT" >> {seen}; test "$ORCHESTRA_ATTEMPT" -ge 3',
            retries=2,
            backoff_s=0.05,
        ),
    )
    report = tree.wait_plan(tree.submit(spec), timeout_s=60)
    (t,) = report.tasks
    assert (t.status, t.attempts, t.failure) == ("succeeded", 3, None), t
    assert seen.read_text().split() == ["1", "2", "3"]
    retries = [w for w in t.warnings if "retry" in w]
    assert len(retries) == 2 and "(tool_failure)" in retries[0], t.warnings


def test_retries_stop_at_the_cap_and_the_failure_is_typed(tree: Tree) -> None:
    spec = plan("hopeless", task("never", "exit 3", retries=1, backoff_s=0.05))
    (t,) = tree.wait_plan(tree.submit(spec), timeout_s=60).tasks
    assert (t.status, t.attempts, t.failure, t.exit_code) == ("failed", 2, "tool_failure", 3)
    assert "retry cap reached (1 of 1" in (t.error or "")


def test_a_quota_breach_starts_nothing_and_spends_nothing(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """Tenant acme may run one lane at a time: of two tasks ready together, the first runs,
    the second breaches the quota before any shard is chosen: no attempt, no lane, no sandbox,
    nothing spent; it fails with quota_breach (the default strategy escalates)."""
    config = tmp_path / "quota.toml"
    config.write_text("[quotas.acme]\nconcurrency = 1\n")
    tree = tree_factory(workspace=repo, config=config)
    go = tmp_path / "go"
    spec = f.PlanSpec(
        name="quota",
        tenant="acme",
        tasks=[
            task("first", f"while [ ! -e {go} ]; do sleep 0.02; done; echo done"),
            task("second", "echo should never run"),
        ],
    )
    plan_id = tree.submit(spec)

    def second_failed() -> f.TaskReport | None:
        report = tree.ctl(f.CtlPlan(id=plan_id))
        assert isinstance(report, f.PlanReport)
        second = report.tasks[1]
        return second if second.status == "failed" else None

    second = wait_until(second_failed, 30, "the second task to breach the quota")
    assert isinstance(second, f.TaskReport)
    assert second.failure == "quota_breach"
    assert "tenant acme has 1 live lanes (quota concurrency = 1)" in (second.error or "")
    assert (second.attempts, second.lane, second.sandbox) == (0, None, None)
    assert second.spent == f.Spend()

    def live_tasks() -> list[str | None]:
        lanes = tree.ctl(f.CtlLanes())
        assert isinstance(lanes, f.LaneList)
        return [lane.task for lane in lanes.lanes]

    # The first lane's start may still be on its way to its shard when the second breaches.
    wait_until(live_tasks, 30, "the first lane to run")
    assert live_tasks() == ["first"]  # only the first ever started
    go.touch()
    report = tree.wait_plan(plan_id, timeout_s=30)
    assert [t.status for t in report.tasks] == ["succeeded", "failed"]


def test_a_quota_breach_under_retry_waits_it_out(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """`on_failure = "retry"` turns a breach into a wait with backoff: the second task starts
    once the first has ended, and nothing ran while the tenant was at its ceiling."""
    config = tmp_path / "quota.toml"
    config.write_text("[quotas.acme]\nconcurrency = 1\n")
    tree = tree_factory(workspace=repo, config=config)
    log = tmp_path / "log"
    spec = f.PlanSpec(
        name="quota-retry",
        tenant="acme",
        tasks=[
            task("first", f"echo first-start >> {log}; sleep 0.5; echo first-end >> {log}"),
            task("second", f"echo second >> {log}", retries=20, backoff_s=0.05),
        ],
    )
    report = tree.wait_plan(tree.submit(spec), timeout_s=60)
    assert [t.status for t in report.tasks] == ["succeeded", "succeeded"], report
    assert log.read_text().split() == ["first-start", "first-end", "second"]
    second = report.tasks[1]
    assert second.attempts == 1  # every breach started nothing
    assert any("quota_breach" in w for w in second.warnings)


def test_a_plan_budget_is_shared_by_the_tasks_that_run_together(tree: Tree) -> None:
    """Two tasks ready together under a plan budget: the first lane's grant is a share of it,
    not all of it, so the second (with a budget of its own) still gets one and runs."""
    spec = f.PlanSpec(
        name="budgeted",
        budget=f.Budget(wall_s=600.0, output_bytes=1_000_000),
        tasks=[task("a", "echo hello"), task("b", "echo world", budget=f.Budget(wall_s=60.0))],
    )
    report = tree.wait_plan(tree.submit(spec), timeout_s=60)
    assert report.ok, report
    assert report.budget == f.Budget(wall_s=600.0, output_bytes=1_000_000)


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_task_timeout_kills_the_whole_process_group_and_is_typed(
    tree: Tree, tmp_path: Path
) -> None:
    """A plan task past its timeout_s: its command and the grandchild it left in its group are
    killed, and the task fails with the failure class timeout."""
    pidfile = tmp_path / "pgid"
    spec = plan("slow", task("slow", f"echo $$ > {pidfile}; sleep 300 & sleep 300", timeout_s=0.5))
    (t,) = tree.wait_plan(tree.submit(spec), timeout_s=60).tasks
    assert (t.status, t.failure) == ("failed", "timeout"), t
    assert group_gone(int(pidfile.read_text()))


def test_ctl_cancel_stops_a_running_task_at_once(tree: Tree, tmp_path: Path) -> None:
    pidfile = tmp_path / "pgid"
    plan_id = tree.submit(plan("long", task("long", f"echo $$ > {pidfile}; sleep 300 & sleep 300")))
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 30, "the command")
    report = tree.ctl(f.CtlPlan(id=plan_id))
    assert isinstance(report, f.PlanReport) and report.tasks[0].lane is not None
    assert isinstance(tree.ctl(f.CtlCancel(lane=report.tasks[0].lane)), f.Ack)
    (t,) = tree.wait_plan(plan_id, timeout_s=30).tasks
    assert (t.status, t.failure) == ("cancelled", None), t
    assert group_gone(int(pidfile.read_text()))


STRAYS = "tests.integration.lane_programs:Strays"


def test_a_command_a_program_leaves_running_ends_with_its_lane(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """A program that returns while a command it started in a task of its own still runs: the
    command's whole group is killed when the lane ends, so nothing it started outlives its lane
    (unbudgeted)."""
    config = tmp_path / "strays.toml"
    config.write_text(f'[lanes]\nprograms = ["{STRAYS}"]\n')
    tree = tree_factory(workspace=repo, config=config)
    pidfile = tmp_path / "pgid"
    (t,) = tree.wait_plan(
        tree.submit(plan("strays", task("s", str(pidfile), program=STRAYS))), 60
    ).tasks
    assert t.status == "succeeded", t
    pgid = int(pidfile.read_text())
    wait_until(lambda: group_gone(pgid), 10, "the left-behind command's group to be killed")

"""Plans survive a full stop and start of the tree (the state plane's promise)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest

from orchestra_sup.coordinator.planstore import read_plan
from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, plan, task, wait_until

pytestmark = pytest.mark.integration


def test_plan_continues_after_a_full_restart(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """SIGTERM mid-plan interrupts the running lane (recorded as interrupted, not failed); a new
    tree on the same state directory finishes the plan: finished tasks do not run again
    (attempts = 1), the interrupted one runs again with a partial-work warning."""
    runs = tmp_path / "runs"
    gate = tmp_path / "gate"
    spec = plan(
        "resume",
        task("first", f"echo first >> {runs}"),
        task(
            "second",
            f"echo second >> {runs}; while [ ! -e {gate} ]; do sleep 0.05; done",
            needs=["first"],
        ),
        task("third", f"echo third >> {runs}", needs=["second"]),
    )
    one = tree_factory(workspace=repo, base=tmp_path / "one")
    plan_id = one.submit(spec)

    def second_running() -> bool:
        reply = one.ctl(f.CtlLanes())
        assert isinstance(reply, f.LaneList)
        return any(lane.task == "second" and lane.state == "running" for lane in reply.lanes)

    wait_until(second_running, 20, "the second task to run")
    wait_until(lambda: runs.exists() and "second" in runs.read_text(), 10, "second to start")
    assert one.stop() == 0

    two = tree_factory(workspace=repo, base=tmp_path / "one")  # same state directory
    paused = two.ctl(f.CtlPlan(id=plan_id))
    assert isinstance(paused, f.PlanReport) and not paused.done
    gate.touch()
    report = two.wait_plan(plan_id, timeout_s=30)
    assert report.ok, report
    by_id = {t.id: t for t in report.tasks}
    assert by_id["first"].attempts == 1 and by_id["third"].attempts == 1
    assert by_id["second"].attempts == 2
    assert any("stopped" in w and "partial work" in w for w in by_id["second"].warnings), by_id
    assert by_id["second"].failure is None
    assert runs.read_text().split() == ["first", "second", "second", "third"]
    assert os.path.isdir(two.state_dir)


def test_a_lane_that_exits_0_on_sigterm_is_still_interrupted(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """A command that traps SIGTERM and exits 0 when the tree stops did not finish its step: it
    is recorded interrupted and runs again, and its dependant waits for that."""
    runs = tmp_path / "runs"
    gate = tmp_path / "gate"
    body = (
        f"echo $ORCHESTRA_ATTEMPT >> {runs}; trap 'exit 0' TERM; "
        f"while [ ! -e {gate} ]; do sleep 0.05; done"
    )
    spec = plan("trap", task("polite", body), task("after", "true", needs=["polite"]))
    one = tree_factory(workspace=repo, base=tmp_path / "s")
    plan_id = one.submit(spec)
    wait_until(lambda: runs.exists(), 20, "the first attempt to start")
    assert one.stop() == 0
    two = tree_factory(workspace=repo, base=tmp_path / "s")
    gate.touch()
    report = two.wait_plan(plan_id, timeout_s=30)
    by_id = {t.id: t for t in report.tasks}
    assert report.ok and by_id["polite"].attempts == 2, report
    assert runs.read_text().split() == ["1", "2"]


def test_a_graceful_shard_restart_re_runs_its_lane_once_elsewhere(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """`ctl restart shard-0` interrupts its lane; the stopping shard refuses the re-placement
    (it would only be interrupted again), so the step runs once more, on the new generation."""
    gate = tmp_path / "gate"
    tree = tree_factory(workspace=repo, shards=1)
    plan_id = tree.submit(plan("one", task("t", f"while [ ! -e {gate} ]; do sleep 0.05; done")))

    def running() -> bool:
        reply = tree.ctl(f.CtlLanes())
        assert isinstance(reply, f.LaneList)
        return any(lane.state == "running" for lane in reply.lanes)

    wait_until(running, 20, "the lane to run")
    assert tree.ctl(f.CtlRestart(name="shard-0"), timeout_s=60) == f.Ack()
    wait_until(running, 20, "the re-run to run")
    gate.touch()
    report = tree.wait_plan(plan_id, timeout_s=30)
    assert report.ok, report
    assert report.tasks[0].attempts == 2, report.tasks[0]
    assert not any("was lost" in w for w in report.tasks[0].warnings), report.tasks[0].warnings


def shards_on_disk(tree: Tree, plan_id: str) -> set[str | None]:
    """The shards plan `plan_id`'s tasks run on, as the coordinator's LMDB has committed them
    (read-only, beside the live coordinator)."""
    env = lmdb.open(str(tree.state_dir / "coordinator"), readonly=True, max_dbs=8)
    try:
        record = read_plan(env, plan_id)
    finally:
        env.close()
    if record is None:
        return set()
    return {t.shard for t in record.tasks.values()}


def test_a_task_on_a_shard_the_tree_no_longer_has_is_placed_again(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """The supervisor is SIGKILLed with a lane on shard-1, and the tree comes back with one
    shard: that lane is lost with shard-1 and its task runs again on shard-0 (it does not wait
    for a shard that will never return)."""
    import signal

    one = tree_factory(workspace=repo, base=tmp_path / "t", shards=2)
    spec = plan("two", task("a", "sleep 300"), task("b", "sleep 300"))
    plan_id = one.submit(spec)

    def on_both() -> bool:
        report = one.ctl(f.CtlPlan(id=plan_id))
        assert isinstance(report, f.PlanReport)
        return {t.shard for t in report.tasks if t.status == "running"} == {"shard-0", "shard-1"}

    wait_until(on_both, 20, "a lane on each shard")
    # Plan records are written behind: a SIGKILL before the placements are committed would
    # leave a record with both tasks still pending, and nothing lost to test.
    wait_until(lambda: shards_on_disk(one, plan_id) == {"shard-0", "shard-1"}, 20, "committed")
    one.stop(signal.SIGKILL)
    two = tree_factory(workspace=repo, base=tmp_path / "t", shards=1)

    def replaced() -> f.PlanReport | None:
        report = two.ctl(f.CtlPlan(id=plan_id))
        assert isinstance(report, f.PlanReport)
        return report if all(t.shard == "shard-0" for t in report.tasks) else None

    report = wait_until(replaced, 30, "every task on shard-0")
    assert isinstance(report, f.PlanReport)
    warnings = " ".join(w for t in report.tasks for w in t.warnings)
    assert "shard-1 (generation 1) was lost" in warnings, report.tasks

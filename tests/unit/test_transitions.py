"""The allowed-transitions tables (`orchestra_sup.transitions`): a task's status changes only
along `coordinator.status.TRANSITIONS`, and a forbidden move raises before anything changes."""

from __future__ import annotations

import pytest

from orchestra_sup.coordinator.placement import AffinityTicket
from orchestra_sup.coordinator.runner import FINAL, LIVE, PlanRecord, TaskStatus
from orchestra_sup.coordinator.status import TRANSITIONS as TASK
from orchestra_sup.protocol import frames as f
from orchestra_sup.shards.lane import TRANSITIONS as LANE
from orchestra_sup.shards.lane import LaneState
from orchestra_sup.supervisor.spec import ALLOWED, ChildState
from orchestra_sup.transitions import ForbiddenTransition, Transitions

S = TaskStatus
TICKET = AffinityTicket(shard="shard-0", generation=1, boot="b")


def _plan() -> PlanRecord:
    spec = f.PlanSpec(name="p", tasks=[f.TaskSpec(id="a", run="true")])
    return PlanRecord.new("p1", spec, submitted_at=0.0)


def _ended(status: str = "succeeded") -> PlanRecord:
    """A plan whose only task ran on lane p1-a-1 and ended with `status`."""
    rec = _plan()
    start = rec.place(rec.spec.tasks[0], TICKET)
    rec.set_status("a", S.RUNNING)
    result = f.LaneResult(
        lane=start.lane,
        plan="p1",
        task="a",
        shard="shard-0",
        status=status,
        exit_code=0,
        duration_s=0.1,
        output_tail="",
        sandbox=None,
        commit=None,
        error=None,
    )
    assert rec.apply(result).applied
    return rec


def f_ticket():
    from orchestra_sup.coordinator.placement import AffinityTicket

    return AffinityTicket(shard="shard-0", generation=1, boot="b")


def test_every_table_covers_its_states() -> None:
    assert set(TASK) == set(TaskStatus)
    assert set(LANE) == set(LaneState)
    assert set(ALLOWED) == set(ChildState)


@pytest.mark.parametrize("source", sorted(FINAL), ids=str)
def test_an_ended_task_comes_back_only_through_a_sibling_group_retry(source: TaskStatus) -> None:
    assert TASK[source] == {S.PENDING}


@pytest.mark.parametrize("target", [S.RUNNING, S.STARTING, S.FAILED, S.PAUSED], ids=str)
def test_a_forbidden_task_move_raises_and_changes_nothing(target: TaskStatus) -> None:
    rec = _ended("succeeded")
    counts = dict(rec.progress.counts)
    with pytest.raises(ForbiddenTransition, match="task a: no transition from succeeded to"):
        rec.set_status("a", target)
    assert rec.tasks["a"].status is S.SUCCEEDED
    assert dict(rec.progress.counts) == counts
    assert rec.done


def test_a_task_is_placed_before_it_runs() -> None:
    rec = _plan()
    with pytest.raises(ForbiddenTransition, match="from pending to running"):
        rec.set_status("a", S.RUNNING)
    assert not TASK.allows(S.PENDING, S.RUNNING)
    assert all(not TASK.allows(s, S.SKIPPED) for s in LIVE)


def test_the_table_type_is_read_only_and_says_whose_states() -> None:
    table = Transitions("door", {"shut": {"open"}, "open": {"shut"}})
    assert table.move("shut", "open") == "open"
    assert table["open"] == frozenset({"shut"})
    with pytest.raises(ForbiddenTransition, match=r"^door: no transition from open to open$"):
        table.move("open", "open")
    with pytest.raises(ValueError, match=r"^front door: no transition from gone to open$"):
        table.move("gone", "open", what="front door")
    with pytest.raises(TypeError):
        table["open"] = frozenset()  # type: ignore[index]

"""How the coordinator keeps plans in LMDB (`coordinator.planstore`), on a real store: what a
change writes is what changed, a plan round-trips, the layout before issue 24 is moved, and an
unacknowledged submission is dropped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import lmdb
import msgspec

from orchestra_sup.coordinator.placement import AffinityTicket
from orchestra_sup.coordinator.planstore import (
    DBS,
    HEADS,
    LEGACY,
    SPECS,
    TASKS,
    PlanEntry,
    PlanStore,
    read_plan,
    task_key,
)
from orchestra_sup.coordinator.runner import PlanRecord, TaskStatus
from orchestra_sup.protocol import frames as f
from orchestra_sup.state.store import Store

TICKET = AffinityTicket(shard="shard-0", generation=1, boot="b")


class Counting(Store):
    """A real store that also counts the bytes queued to it, per database."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, ["inbox", *DBS])
        self.queued: dict[str, int] = {}

    def put(self, db: str, key: bytes, value: bytes) -> None:
        self.queued[db] = self.queued.get(db, 0) + len(value)
        super().put(db, key, value)

    def put_durable(self, db: str, key: bytes, value: bytes) -> asyncio.Future[None]:
        self.queued[db] = self.queued.get(db, 0) + len(value)
        return super().put_durable(db, key, value)


def chain(n: int) -> f.PlanSpec:
    return f.PlanSpec(
        name="c",
        tasks=[
            f.TaskSpec(id=f"t{i}", run="true", needs=[f"t{i - 1}"] if i else []) for i in range(n)
        ],
    )


def written_by_one_change(tmp_path: Path, n: int) -> int:
    """Bytes one task's placement writes, in a plan of `n` tasks."""
    store = Counting(tmp_path / f"s{n}")
    try:
        plans = PlanStore(store)
        plan = PlanRecord.new("p1", chain(n), 0.0)
        plans.write(plan, new=True)
        store.queued.clear()
        plan.place(plan.spec.tasks[0], TICKET, 1.0)
        plans.write(plan)
        return sum(store.queued.values())
    finally:
        store.close()


def test_a_change_writes_what_changed_not_the_plan(tmp_path: Path) -> None:
    """Placing one task of a 2,000-task plan writes as many bytes as in a 2-task plan: its own
    record and the plan's head (the whole 2,000-task record was rewritten before)."""
    assert written_by_one_change(tmp_path, 2000) == written_by_one_change(tmp_path, 2) < 600


def test_a_plan_round_trips_and_only_changed_tasks_have_records(tmp_path: Path) -> None:
    """Written at submission, then after a placement and a result: loaded again, it is the
    same plan (tasks, spend, key), and only the changed task has a record of its own."""

    async def main() -> None:
        store = Store(tmp_path / "c", ["inbox", *DBS])
        store.start()
        plans = PlanStore(store)
        plan = PlanRecord.new("p1", chain(3), 5.0, key="k")
        await plans.write_durable(plan, new=True)
        start = plan.place(plan.spec.tasks[0], TICKET, 6.0)
        result = f.LaneResult(
            lane=start.lane,
            plan="p1",
            task="t0",
            shard="shard-0",
            status="succeeded",
            exit_code=0,
            duration_s=1.0,
            output_tail="hi",
            sandbox=None,
            commit=None,
            error=None,
            spent=f.Spend(wall_s=1.5),
        )
        assert plan.apply(result, 7.0).applied
        assert plan.dirty == {"t0"}
        await plans.write_durable(plan)
        assert plan.dirty == set()
        assert [k for k, _ in store.items(TASKS)] == [task_key("p1", "t0")]
        store.close()

        again = Store(tmp_path / "c", ["inbox", *DBS])
        (loaded,) = PlanStore(again).load()
        again.close()
        assert loaded == plan and loaded.key == "k" and loaded.spent.wall_s == 1.5
        assert loaded.tasks["t0"].status is TaskStatus.SUCCEEDED
        assert [s.id for s in loaded.ready()] == ["t1"]

    asyncio.run(main())


def test_a_plan_in_the_old_layout_is_moved(tmp_path: Path) -> None:
    """A whole `PlanRecord` under `plans` (the layout before issue 24) loads as it was, is
    written in the new layout and its old record deleted; read_plan finds it either way."""
    plan = PlanRecord.new("old1", chain(4), 3.0)
    plan.place(plan.spec.tasks[0], TICKET, 4.0)
    store = Store(tmp_path / "c", ["inbox", *DBS])
    store.put(LEGACY, b"old1", msgspec.msgpack.encode(plan))
    store.close()
    env = lmdb.open(str(tmp_path / "c"), readonly=True, max_dbs=8)
    assert read_plan(env, "old1") == plan
    env.close()

    store = Store(tmp_path / "c", ["inbox", *DBS])
    (loaded,) = PlanStore(store).load()
    store.close()
    assert loaded == plan
    store = Store(tmp_path / "c", ["inbox", *DBS])
    assert list(store.items(LEGACY)) == []
    assert {k for k, _ in store.items(TASKS)} == {task_key("old1", t) for t in plan.tasks}
    (again,) = PlanStore(store).load()
    store.close()
    assert again == plan
    env = lmdb.open(str(tmp_path / "c"), readonly=True, max_dbs=8)
    assert read_plan(env, "old1") == plan and read_plan(env, "nope") is None
    env.close()


def test_a_submission_whose_head_was_never_committed_is_dropped(tmp_path: Path) -> None:
    """A spec without a head (the coordinator died before the submission was acknowledged)
    is no plan: it is not loaded, and its entry is deleted; an unreadable head is skipped."""
    store = Store(tmp_path / "c", ["inbox", *DBS])
    entry = PlanEntry(id="lost", spec=chain(2), submitted_at=1.0)
    store.put(SPECS, b"lost", msgspec.msgpack.encode(entry))
    store.put(
        SPECS, b"bad", msgspec.msgpack.encode(PlanEntry(id="bad", spec=chain(1), submitted_at=2.0))
    )
    store.put(HEADS, b"bad", b"\xc1")
    store.close()
    store = Store(tmp_path / "c", ["inbox", *DBS])
    assert PlanStore(store).load() == []
    store.close()
    store = Store(tmp_path / "c", ["inbox", *DBS])
    assert [k for k, _ in store.items(SPECS)] == [b"bad"]
    store.close()


def test_what_a_prune_cut_short_left_is_deleted_at_load(tmp_path: Path) -> None:
    """A head with no spec, and task records of no plan (a prune whose later writes never
    committed, `coordinator.retention`), are deleted as the coordinator loads; a whole plan
    beside them is untouched."""
    store = Store(tmp_path / "c", ["inbox", *DBS])
    kept = PlanRecord.new("kept", chain(1), submitted_at=1.0)
    kept.dirty.update(kept.tasks)
    PlanStore(store).write(kept, new=True)
    store.put(HEADS, b"pruned", msgspec.msgpack.encode({"spent": {}}))
    store.put(TASKS, task_key("pruned", "t0"), b"\x80")
    store.put(TASKS, task_key("gone", "t0"), b"\x80")
    store.close()
    store = Store(tmp_path / "c", ["inbox", *DBS])
    assert [p.id for p in PlanStore(store).load()] == ["kept"]
    store.close()
    store = Store(tmp_path / "c", ["inbox", *DBS])
    assert [k for k, _ in store.items(HEADS)] == [b"kept"]
    assert {k.split(b"/")[0] for k, _ in store.items(TASKS)} == {b"kept"}
    store.close()

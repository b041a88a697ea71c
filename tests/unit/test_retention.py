"""The coordinator's retention (`coordinator.retention`) over a real LMDB store: what is due
and when, a session's lanes' plans held until it goes, a dry run that changes nothing, a stray
inbox entry, and a kept key that expires."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from orchestra_sup.coordinator.book import PlanBook
from orchestra_sup.coordinator.planstore import DBS, PlanStore
from orchestra_sup.coordinator.retention import DBS as RETENTION_DBS
from orchestra_sup.coordinator.retention import KEYS, InboxIndex, Retention
from orchestra_sup.coordinator.runner import PlanRecord, TaskStatus
from orchestra_sup.coordinator.sessionstore import DBS as SESSION_DBS
from orchestra_sup.coordinator.sessionstore import SessionStore
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.childargs import RetentionSettings
from orchestra_sup.state.store import Store

DAY = 86_400.0
SETTINGS = RetentionSettings(plans_s=DAY, keys_s=3 * DAY)


def finished(plan_id: str, at: float, key: str | None = None, session: bool = False) -> PlanRecord:
    """A one-task plan (a session when `session`) that finished at `at` (Unix seconds)."""
    spec = f.PlanSpec(
        name=plan_id,
        tasks=[f.TaskSpec(id="t", run="true")],
        coordinator="m:Program" if session else "dag",
    )
    plan = PlanRecord.new(plan_id, spec, submitted_at=at - 1, key=key)
    if session:
        plan.outcome = f.PlanOutcome(result=None, at=at)
    for status in (TaskStatus.STARTING, TaskStatus.RUNNING):
        plan.set_status("t", status)
    plan.set_status("t", TaskStatus.SUCCEEDED)
    plan.finished_at = at
    return plan


def result_of(plan_id: str) -> f.InboxPut:
    lane = f"{plan_id}-t-1"
    result = f.LaneResult(
        lane=lane, plan=plan_id, task="t", shard="shard-0", status=f.ResultStatus.SUCCEEDED,
        exit_code=0, duration_s=0.1, output_tail="", sandbox=None, commit=None, error=None,
    )  # fmt: skip
    return f.InboxPut(msg_id=f"result:{lane}", result=result)


Steps = Callable[[Retention, PlanBook, Store], Awaitable[Any]]


def with_retention(
    tmp_path: Path,
    plans: list[PlanRecord],
    steps: Steps,
    on_commit: Callable[[int], None] | None = None,
    max_batch: int = 10_000,
) -> Any:
    """`steps` against a retention over `plans` (finished, kept in memory: their records are
    not written) in a store whose batches hold at most `max_batch` writes."""

    async def main() -> Any:
        dbs = ["inbox", *DBS, *SESSION_DBS, *RETENTION_DBS]
        store = Store(tmp_path / "coordinator", dbs, on_commit=on_commit, max_batch=max_batch)
        store.start()
        try:
            book = PlanBook(None, PlanStore(store), pump=lambda: None)  # type: ignore[arg-type]
            inbox = InboxIndex()
            for plan in plans:
                book.add(plan)
                book.final.add(plan.id)
                book.active.pop(plan.id, None)
                put = result_of(plan.id)
                inbox.add(put.msg_id, put, known=True)
            retention = Retention(
                book, store, inbox, SessionStore(store), SETTINGS, forget=lambda plan: None
            )
            retention.load(now=0.0)
            return await steps(retention, book, store)
        finally:
            store.close()

    return asyncio.run(main())


def test_a_sessions_lanes_go_with_it_and_a_dry_run_changes_nothing(tmp_path: Path) -> None:
    plans = [
        finished("s1", at=10.0, session=True),
        finished("lane1", at=5.0, key="s1:e1"),  # finished before its session
        finished("alone", at=20.0, key="other:e9"),  # "other" is no plan: its own
        finished("young", at=2 * DAY),
    ]

    async def steps(retention: Retention, book: PlanBook, store: Store) -> list[f.PruneReport]:
        dry = retention.prune(dry_run=True, now=DAY + 30)
        assert set(book.plans) == {"s1", "lane1", "alone", "young"}
        real = retention.prune(now=DAY + 30)
        again = retention.prune(now=DAY + 30)
        return [dry, real, again]

    dry, real, again = with_retention(tmp_path, plans, steps)
    assert sorted(dry.plans) == sorted(real.plans) == ["alone", "lane1", "s1"]
    assert (real.plan_count, real.tasks, real.inbox, real.sessions) == (3, 3, 3, 1)
    assert dry.kept == real.kept == 2  # lane1's and alone's keys
    assert again.plan_count == 0 and again.inbox == 0


def test_a_lane_of_a_live_session_waits_for_it(tmp_path: Path) -> None:
    """A session still running keeps its finished lanes' plans past `plans_s`: its program may
    replay their keys."""
    running = finished("s1", at=0.0, session=True)
    running.outcome = None  # under way
    plans = [running, finished("lane1", at=5.0, key="s1:e1")]

    async def steps(retention: Retention, book: PlanBook, store: Store) -> f.PruneReport:
        report = retention.prune(now=10 * DAY)
        assert "lane1" in book.plans and book.keys["s1:e1"] == "lane1"
        return report

    assert with_retention(tmp_path, plans, steps).plan_count == 0


def test_a_kept_key_answers_until_keys_s_then_goes_and_a_stray_entry_goes(
    tmp_path: Path,
) -> None:
    plans = [finished("p1", at=0.0, key="k1")]

    async def steps(retention: Retention, book: PlanBook, store: Store) -> list[Any]:
        retention.prune(now=DAY + 1)
        assert "p1" not in book.plans and book.keys["k1"] == "p1"
        late = result_of("p1")  # its shard re-sent the result: committed, applied to nothing
        retention.inbox.add(late.msg_id, late, known=False)
        stray = retention.prune(now=DAY + 2)
        await store.put_durable("inbox", b"barrier", b"")
        kept_then = dict(store.items(KEYS))
        expired = retention.prune(now=3 * DAY + 1)
        await store.put_durable("inbox", b"barrier", b"")
        return [stray, kept_then, expired, dict(store.items(KEYS)), dict(book.keys)]

    stray, kept_then, expired, kept_after, keys = with_retention(tmp_path, plans, steps)
    assert stray.inbox == 1 and stray.plan_count == 0
    assert list(kept_then) == [b"k1"]
    assert expired.keys == 1 and expired.kept == 0
    assert kept_after == {} and keys == {}


def test_a_key_kept_late_goes_when_its_own_time_comes(tmp_path: Path) -> None:
    """A session's lane's plan goes with its session, after plans that finished later: its key
    still goes at its own `keys_s`, not behind theirs (the kept keys are a heap)."""
    plans = [
        finished("child", at=0.0, key="s1:e1"),
        finished("other", at=10.0, key="kx"),
        finished("s1", at=50.0, session=True),
    ]

    async def steps(retention: Retention, book: PlanBook, store: Store) -> tuple[Any, Any]:
        retention.prune(now=DAY + 60)  # all three go; child's key is kept last
        report = retention.prune(now=3 * DAY + 5)  # child's key is due, kx's not yet
        return report, dict(book.keys)

    report, keys = with_retention(tmp_path, plans, steps)
    assert report.keys == 1 and keys == {"kx": "other"}


def test_every_commit_of_a_prune_leaves_the_plan_or_its_key(tmp_path: Path) -> None:
    """One write per transaction, as a coordinator killed between any two would leave them: at
    each commit the plan's head is there, or its key is kept; never neither."""
    plans = [finished("p1", at=0.0, key="deploy")]
    seen: list[bool] = []
    holder: dict[str, Store] = {}

    def check(_writes: int) -> None:
        store = holder.get("store")
        if store is not None:
            seen.append(
                store.get("plan_heads", b"p1") is not None or store.get(KEYS, b"deploy") is not None
            )

    async def steps(retention: Retention, book: PlanBook, store: Store) -> None:
        plan = book.plans["p1"]
        await PlanStore(store).write_durable(plan, new=True)
        holder["store"] = store
        retention.prune(now=DAY + 1)
        await store.put_durable("inbox", b"barrier", b"")

    with_retention(tmp_path, plans, steps, on_commit=check, max_batch=1)
    assert len(seen) >= 4 and all(seen), seen


def test_a_pruned_plan_is_never_written_again(tmp_path: Path) -> None:
    """A plan pruned before its final write ran (plans_s = 0), or changed after it went, is not
    written: a head would be left with no spec."""
    plans = [finished("p1", at=0.0)]

    async def steps(retention: Retention, book: PlanBook, store: Store) -> list[bytes]:
        plan = book.plans["p1"]
        await PlanStore(store).write_durable(plan, new=True)
        retention.prune(now=DAY + 1)
        plan.touch("t")
        book.commit(plan)
        await book._finish(plan)
        await store.put_durable("inbox", b"barrier", b"")
        return [k for k, _ in store.items("plan_heads")]

    assert with_retention(tmp_path, plans, steps) == []

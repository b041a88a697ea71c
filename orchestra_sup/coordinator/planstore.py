"""How the coordinator keeps its plans in LMDB: a plan's spec once, a small head, one record per
task, so what a change writes is what changed.

Databases of the coordinator's environment (`DBS`):

- `plan_specs`: plan id -> `PlanEntry` (its id, spec, submission time and idempotency key),
  written once, when the plan is submitted;
- `plan_heads`: plan id -> `PlanHead` (what changes of the plan itself: what it spent, what
  humans granted it). A plan exists once its head is committed: the head is queued after
  everything else of a write, and at submission it is awaited;
- `plan_tasks`: `<plan id>/<task id>` -> `TaskRecord`, written when that task changes
  (`PlanRecord.dirty`); a task with no record is as submitted (`TaskRecord()`);
- `plans`: the layout before issue 24, one whole `PlanRecord` per plan, rewritten on every change
  (a 10,000-task plan wrote about 5 MB per task change). Read at start, moved into the layout
  above and deleted, in queue order (a coordinator killed halfway moves it again: the old record
  goes last, and nothing newer can have been written before it did).

A write queues the changed task records and then the head (`Store.put`, written behind); the
durable form resolves once the head is committed, and with it everything queued before it
(the store commits in queue order). An unreadable record is logged and skipped: one bad record
must not stop the coordinator.
"""

from __future__ import annotations

import asyncio
import logging

import lmdb
import msgspec

from orchestra_sup.coordinator.runner import PlanRecord, TaskRecord
from orchestra_sup.protocol import frames as f
from orchestra_sup.state.events import UNLOGGED, EventSink
from orchestra_sup.state.store import Store

log = logging.getLogger(__name__)

LEGACY = "plans"
SPECS = "plan_specs"
HEADS = "plan_heads"
TASKS = "plan_tasks"
DBS = [LEGACY, SPECS, HEADS, TASKS]
"""The databases `PlanStore` needs in the coordinator's environment."""


class PlanEntry(msgspec.Struct, kw_only=True):
    """What a plan was given at submission, never changed afterwards."""

    id: str
    spec: f.PlanSpec
    submitted_at: float
    key: str | None = None


class PlanHead(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What changes of a plan itself: what its ended lanes spent, what humans granted it, how
    it ended when it is a session, and when it was found done."""

    spent: f.Spend = f.Spend()
    granted: f.Budget | None = None
    outcome: f.PlanOutcome | None = None
    finished_at: float | None = None


def task_key(plan_id: str, task_id: str) -> bytes:
    return f"{plan_id}/{task_id}".encode()


class PlanStore:
    """The plans of the coordinator's `store` (opened with `DBS`). See the module docstring."""

    def __init__(self, store: Store, events: EventSink = UNLOGGED) -> None:
        self.store = store
        self.events = events
        """Where each write also logs what moved: the plan's acceptance and every task's
        status moves (`state.events`; `task.<status>`), written behind as the records are."""
        self._enc = msgspec.msgpack.Encoder()
        self._legacy = msgspec.msgpack.Decoder(PlanRecord)
        self._entry = msgspec.msgpack.Decoder(PlanEntry)
        self._head = msgspec.msgpack.Decoder(PlanHead)
        self._task = msgspec.msgpack.Decoder(TaskRecord)

    def write(self, plan: PlanRecord, *, new: bool = False) -> None:
        """Queue what changed of `plan`: its changed task records and its head (and, `new`, its
        entry first). Raises `ValueError` for a key LMDB cannot hold (`Store.put`)."""
        self._queue(plan, new)
        self.store.put(HEADS, plan.id.encode(), self._encode_head(plan))

    def write_durable(self, plan: PlanRecord, *, new: bool = False) -> asyncio.Future[None]:
        """`write`, resolving once all of it is committed (`Store.put_durable`)."""
        self._queue(plan, new)
        return self.store.put_durable(HEADS, plan.id.encode(), self._encode_head(plan))

    def delete(self, plan: PlanRecord) -> None:
        """Queue the delete of everything of `plan` (retention: `coordinator.retention`): its
        head first, so a coordinator killed halfway finds no plan, and then its entry and its
        task records (what `load` would skip as a spec with no head it deletes anyway)."""
        key = plan.id.encode()
        self.store.delete(HEADS, key)
        self.store.delete(SPECS, key)
        self.store.delete_prefix(TASKS, key + b"/")

    def _queue(self, plan: PlanRecord, new: bool) -> None:
        put, enc = self.store.put, self._enc.encode
        if new:
            entry = PlanEntry(
                id=plan.id, spec=plan.spec, submitted_at=plan.submitted_at, key=plan.key
            )
            put(SPECS, plan.id.encode(), enc(entry))
            self.events.emit(
                "plan.accepted", plan=plan.id, detail=f"{plan.spec.name}: {len(plan.tasks)} tasks"
            )
        dirty = plan.dirty
        for task_id in dirty:
            put(TASKS, task_key(plan.id, task_id), enc(plan.tasks[task_id]))
        dirty.clear()
        for task_id, status in plan.transitions:
            rec = plan.tasks[task_id]
            asked = rec.pending.lane if rec.pending is not None else ""  # a question's lane
            self.events.emit(
                f"task.{status}",
                plan=plan.id,
                task=task_id,
                lane=rec.lane or asked,
                child=rec.shard or "",
                detail=rec.error or f"attempt {rec.attempts}",
            )
        plan.transitions.clear()

    def _encode_head(self, plan: PlanRecord) -> bytes:
        return self._enc.encode(
            PlanHead(
                spent=plan.spent,
                granted=plan.granted,
                outcome=plan.outcome,
                finished_at=plan.finished_at,
            )
        )

    def load(self) -> list[PlanRecord]:
        """Every plan as committed, oldest submission first; plans still in the old layout
        (`LEGACY`) are moved to the new one on the way (queued). What a plan without both its
        entry and its head left (a submission never acknowledged, a prune cut short) is
        deleted (queued)."""
        store = self.store
        entries: dict[str, PlanEntry] = {}
        for key, value in store.items(SPECS):
            try:
                entries[key.decode()] = self._entry.decode(value)
            except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                log.error("plan %r: unreadable entry skipped: %s", key, exc)
        tasks: dict[str, dict[str, TaskRecord]] = {}
        for key, value in store.items(TASKS):
            plan_id, _, task_id = key.decode(errors="replace").partition("/")
            try:
                tasks.setdefault(plan_id, {})[task_id] = self._task.decode(value)
            except msgspec.DecodeError as exc:
                log.error("plan %s: task %r: unreadable record skipped: %s", plan_id, task_id, exc)
        plans: dict[str, PlanRecord] = {}
        for key, value in store.items(HEADS):
            plan_id = key.decode(errors="replace")
            entry = entries.pop(plan_id, None)
            try:
                head = self._head.decode(value)
            except msgspec.DecodeError as exc:
                log.error("plan %s: unreadable head skipped: %s", plan_id, exc)
                continue
            if entry is None:  # a plan pruned (`coordinator.retention`) by a run cut short
                log.warning("plan %s: a head with no spec, left by a prune: deleted", plan_id)
                store.delete(HEADS, key)
                continue
            stored = tasks.get(plan_id, {})
            plans[plan_id] = PlanRecord(
                id=entry.id,
                spec=entry.spec,
                submitted_at=entry.submitted_at,
                key=entry.key,
                tasks={t.id: stored.get(t.id) or TaskRecord() for t in entry.spec.tasks},
                spent=head.spent,
                granted=head.granted,
                outcome=head.outcome,
                finished_at=head.finished_at,
            )
        for plan_id in entries:  # a submission never acknowledged: its head was not committed
            store.delete(SPECS, plan_id.encode())
        for plan_id in tasks.keys() - plans.keys():  # what a pruned plan, or one never
            store.delete_prefix(TASKS, f"{plan_id}/".encode())  # acknowledged, left
        for key, value in store.items(LEGACY):
            try:
                plan = self._legacy.decode(value)
            except msgspec.DecodeError as exc:
                log.error("plan %r: unreadable record skipped: %s", key, exc)
                continue
            plan.dirty.update(plan.tasks)
            self.write(plan, new=True)
            store.delete(LEGACY, key)
            plans[plan.id] = plan
        return sorted(plans.values(), key=lambda p: p.submitted_at)


def read_plan(env: lmdb.Environment, plan_id: str) -> PlanRecord | None:
    """Plan `plan_id` as committed in the coordinator's environment `env` (opened read-only
    beside a live coordinator, as tests and tools do), in either layout; None when it has none."""
    enc = plan_id.encode()
    try:
        with env.begin() as txn:
            legacy = _get(env, txn, LEGACY, enc)
            if legacy is not None:
                return msgspec.msgpack.decode(legacy, type=PlanRecord)
            head, raw = _get(env, txn, HEADS, enc), _get(env, txn, SPECS, enc)
            if head is None or raw is None:
                return None
            entry = msgspec.msgpack.decode(raw, type=PlanEntry)
            tasks: dict[str, TaskRecord] = {}
            for spec in entry.spec.tasks:
                value = _get(env, txn, TASKS, task_key(plan_id, spec.id))
                tasks[spec.id] = (
                    TaskRecord()
                    if value is None
                    else msgspec.msgpack.decode(value, type=TaskRecord)
                )
    except lmdb.NotFoundError:
        return None
    head_rec = msgspec.msgpack.decode(head, type=PlanHead)
    return PlanRecord(
        id=entry.id,
        spec=entry.spec,
        submitted_at=entry.submitted_at,
        key=entry.key,
        tasks=tasks,
        spent=head_rec.spent,
        granted=head_rec.granted,
        outcome=head_rec.outcome,
        finished_at=head_rec.finished_at,
    )


def _get(env: lmdb.Environment, txn: lmdb.Transaction, db: str, key: bytes) -> bytes | None:
    try:
        handle = env.open_db(db.encode(), txn=txn, create=False)
    except lmdb.NotFoundError:
        return None
    return txn.get(key, db=handle)

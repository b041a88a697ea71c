"""What the coordinator keeps of the plans that ended, and for how long (issue 22, `[retention]`).

A finished plan is pruned `plans_s` seconds after it finished (`PlanRecord.finished_at`): its
record (`PlanStore.delete`), the inbox entries of its lanes (`InboxIndex`) and, for a session,
its state (`SessionStore.delete`). The one-task plans a session started go with it and never
before: a session replaying its program sends their keys again for as long as it runs. One
whose session is gone (or whose key only looks like a session's) goes on its own.

A plan's idempotency key outlives it: until `keys_s` after the plan finished, a submission that
repeats the key is answered with the pruned plan's id and starts nothing (db `plan_keys`: key ->
`KeptKey`, read at start into `PlanBook.keys`). A shard re-sending a result of a pruned plan
(its acknowledgement lost) has it committed again, applied to no plan, and pruned at the next
run (`InboxIndex.strays`).

Nothing is read to find what is due: plans are kept in the order they finished (`finished`,
and `load` at start) and taken from the front while due, and kept keys in a heap by when they
go. A run queues its
deletes to the write-behind thread (`Store.delete`, `delete_prefix`) and awaits none of them:
no handler waits for retention, and a coordinator killed mid-run finds at its next start either
a whole plan or none (the key is kept first, then the head goes; `PlanStore.load` deletes what
a head-less plan left). A plan pruned is never written again (`PlanBook.kept`). Runs every
`every_s` (`run`); `ctl prune` runs one now, or says what one would take (`prune(dry_run=True)`).
Its report is answered once the deletes are queued, before they are committed.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import logging
import time
from collections.abc import Callable

import msgspec

from orchestra_sup.coordinator.book import PlanBook
from orchestra_sup.coordinator.runner import PlanRecord
from orchestra_sup.coordinator.sessionstore import SessionStore
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.childargs import RetentionSettings
from orchestra_sup.protocol.patterns import DAG
from orchestra_sup.state.events import EventLog
from orchestra_sup.state.store import Store

log = logging.getLogger(__name__)

KEYS = "plan_keys"
"""The coordinator's db of pruned plans' idempotency keys."""
DBS = [KEYS]
"""The databases `Retention` needs in the coordinator's environment."""
SESSION_MARK = ":"
"""A session's lanes' keys are `<session plan id>:<effect id>` (`coordinator.session`)."""


class KeptKey(msgspec.Struct, kw_only=True):
    """A pruned plan's idempotency key: the plan it names, and until when (Unix seconds)."""

    plan: str
    until: float


def plan_of(put: f.InboxPut) -> str:
    """The plan an inbox entry is of."""
    part = put.result or put.pause or put.note
    assert part is not None  # the coordinator checked that exactly one is set
    return part.plan


class InboxIndex:
    """The inbox entries committed, by message id (what de-duplicates a re-sent one), and
    which plan each is of (what goes with a pruned plan). `strays` are the plans that entries
    were added for while the coordinator had no such plan (a result re-sent after its plan
    was pruned): they go at the next prune."""

    def __init__(self) -> None:
        self._plan: dict[str, str] = {}
        self._by_plan: dict[str, list[str]] = collections.defaultdict(list)
        self.strays: set[str] = set()

    def __contains__(self, msg_id: object) -> bool:
        return msg_id in self._plan

    def __len__(self) -> int:
        return len(self._plan)

    def add(self, msg_id: str, put: f.InboxPut, *, known: bool) -> None:
        """Entry `msg_id` (`put`) is committed; `known`: the coordinator has its plan."""
        if msg_id not in self._plan:
            plan = plan_of(put)
            self._plan[msg_id] = plan
            self._by_plan[plan].append(msg_id)
            if not known:
                self.strays.add(plan)

    def of(self, plan_id: str) -> list[str]:
        """The message ids of plan `plan_id`'s entries."""
        return self._by_plan.get(plan_id, [])

    def drop(self, plan_id: str) -> list[str]:
        """Forget plan `plan_id`'s entries; their message ids."""
        self.strays.discard(plan_id)
        ids = self._by_plan.pop(plan_id, [])
        for msg_id in ids:
            del self._plan[msg_id]
        return ids


class Retention:
    """The coordinator's retention over `book` and `store` (module docstring): `inbox` is the
    inbox's index, `sessions` the sessions' state, `forget(plan)` drops what other parts keep
    in memory of a pruned plan (the placer's lane index)."""

    def __init__(
        self,
        book: PlanBook,
        store: Store,
        inbox: InboxIndex,
        sessions: SessionStore,
        settings: RetentionSettings,
        forget: Callable[[PlanRecord], None],
        events: EventLog | None = None,
    ) -> None:
        self.book = book
        self.events = events
        """The tree's event log: its front is trimmed here (`events_s`), each run is logged."""
        self.store = store
        self.inbox = inbox
        self.sessions = sessions
        self.settings = settings
        self.forget = forget
        self._finished: collections.deque[tuple[float, str]] = collections.deque()
        """(finished_at, plan id) of the finished plans, in the order they finished."""
        self._kept: list[tuple[float, str]] = []
        """(until, key) of the keys kept for pruned plans, a heap: soonest to go first (a
        reload may shorten `keys_s`, and a session's lanes go late)."""
        self._children: dict[str, list[str]] = collections.defaultdict(list)
        """Session plan id -> the finished one-task plans it started, held until it goes."""
        self._enc = msgspec.msgpack.Encoder()
        self._kept_dec = msgspec.msgpack.Decoder(KeptKey)

    def load(self, now: float) -> None:
        """At start, once the plans are loaded: the finished ones in the order they finished
        (one that finished before `finished_at` was kept gets its last lane's end, or its
        submission), and the keys kept for pruned plans (those whose time ran out go)."""
        done = [p for p in self.book.plans.values() if p.done]
        for plan in done:
            if plan.finished_at is None:
                ends = [a.ended_at or 0.0 for t in plan.tasks.values() for a in t.history]
                plan.finished_at = max([plan.submitted_at, *ends])
        for plan in sorted(done, key=lambda p: p.finished_at or 0.0):
            self.finished(plan)
        kept: list[tuple[float, str]] = []
        for raw_key, value in self.store.items(KEYS):
            key = raw_key.decode(errors="replace")
            try:
                rec = self._kept_dec.decode(value)
            except msgspec.DecodeError as exc:
                log.error("retention: key %r: unreadable, dropped: %s", key, exc)
                self.store.delete(KEYS, raw_key)
                continue
            if rec.until <= now:
                self.store.delete(KEYS, raw_key)
            elif key not in self.book.keys:
                self.book.keys[key] = rec.plan
                kept.append((rec.until, key))
        self._kept.extend(kept)
        heapq.heapify(self._kept)

    def finished(self, plan: PlanRecord) -> None:
        """`plan` was found done (`PlanBook.on_done`, and `load`)."""
        assert plan.finished_at is not None
        self._finished.append((plan.finished_at, plan.id))

    async def run(self) -> None:
        """Prune every `every_s` seconds, until cancelled."""
        while True:
            await asyncio.sleep(self.settings.every_s)
            report = await self.prune_now()
            if report.plan_count or report.keys or report.inbox or report.events:
                log.info(
                    "retention: %d plans pruned (%d tasks, %d inbox entries, %d sessions), "
                    "%d keys expired, %d kept, %d events, in %.3f s",
                    report.plan_count, report.tasks, report.inbox, report.sessions,
                    report.keys, report.kept, report.events, report.took_s,
                )  # fmt: skip

    async def prune_now(self, *, dry_run: bool = False) -> f.PruneReport:
        """`prune`, then (not `dry_run`) the event log's front older than `events_s`, read off
        the loop (`EventLog.trim`); a run that took anything is itself an event."""
        report = self.prune(dry_run=dry_run)
        if dry_run or self.events is None:
            return report
        cutoff = time.time() - self.settings.events_s
        events = await asyncio.to_thread(self.events.trim, cutoff)
        report = msgspec.structs.replace(report, events=events)
        if report.plan_count or report.keys or report.inbox or events > 1:
            # (a run that trimmed only the last run's own record is not recorded: with a
            # short events_s, each run would otherwise trim one and write one, for ever)
            self.events.emit(
                "retention.pruned",
                detail=f"{report.plan_count} plans, {report.tasks} tasks, {report.inbox} inbox "
                f"entries, {report.keys} keys, {events} events",
            )
        return report

    def prune(self, *, dry_run: bool = False, now: float | None = None) -> f.PruneReport:
        """Prune what is due at `now` (default: the wall clock); with `dry_run`, change
        nothing and say what would go."""
        began = time.monotonic()
        now = time.time() if now is None else now
        due = self._due(now, take=not dry_run)
        plans = [p for session in due for p in [session, *self._held(session.id, dry_run)]]
        strays = [p for p in self.inbox.strays if p not in self.book.plans]
        inbox = sum(len(self.inbox.of(p)) for p in [*(q.id for q in plans), *strays])
        keyed = sum(1 for p in plans if p.key is not None and self._until(p) > now)
        expired = 0
        if dry_run:  # what the pops below would take (a scan: only when asked)
            expired = sum(1 for until, _key in self._kept if until <= now)
        else:
            while self._kept and self._kept[0][0] <= now:
                expired += 1
                _until, key = heapq.heappop(self._kept)
                if self.book.keys.get(key) not in self.book.plans:
                    self.book.keys.pop(key, None)
                self.store.delete(KEYS, key.encode())
            for plan in plans:
                self._drop(plan, now)
            for plan_id in strays:
                for msg_id in self.inbox.drop(plan_id):
                    self.store.delete("inbox", msg_id.encode())
        return f.PruneReport(
            dry_run=dry_run,
            plans=[p.id for p in plans][: f.IDS_MAX],
            plan_count=len(plans),
            tasks=sum(len(p.tasks) for p in plans),
            inbox=inbox,
            sessions=sum(1 for p in plans if p.spec.coordinator != DAG),
            keys=expired,
            kept=len(self._kept) + (keyed - expired if dry_run else 0),
            took_s=time.monotonic() - began,
        )

    def _until(self, plan: PlanRecord) -> float:
        """Until when `plan`'s key answers for it (Unix seconds)."""
        assert plan.finished_at is not None
        return plan.finished_at + self.settings.keys_s

    def _due(self, now: float, *, take: bool) -> list[PlanRecord]:
        """The finished plans due at `now`, oldest first, each a plan of its own or a session
        (its lanes' plans come with it: `_held`); `take`: off the queue."""
        cutoff = now - self.settings.plans_s
        out: list[PlanRecord] = []
        held: list[tuple[float, str]] = []
        seen = 0
        for finished_at, plan_id in self._finished:
            if finished_at > cutoff:
                break
            seen += 1
            plan = self.book.plans.get(plan_id)
            if plan is None:
                continue
            session = _session_of(plan)
            if session is not None and session in self.book.plans:
                held.append((finished_at, plan_id))  # it goes with its session
                continue
            out.append(plan)
        if take:
            for _ in range(seen):
                self._finished.popleft()
            for _finished_at, plan_id in held:
                session = _session_of(self.book.plans[plan_id])
                assert session is not None
                self._children[session].append(plan_id)
        else:
            going = {p.id for p in out}
            for _finished_at, plan_id in held:
                session = _session_of(self.book.plans[plan_id])
                if session is not None and session in going:
                    out.append(self.book.plans[plan_id])
        return out

    def _held(self, session_id: str, dry_run: bool) -> list[PlanRecord]:
        """The finished lanes' plans session `session_id` started and that wait for it."""
        ids = self._children.get(session_id, []) if dry_run else self._children.pop(session_id, [])
        return [self.book.plans[i] for i in ids if i in self.book.plans]

    def _drop(self, plan: PlanRecord, now: float) -> None:
        """Queue the delete of everything of `plan` and forget it; keep its key, queued first:
        one prune's writes may commit in two transactions, and a coordinator killed between
        them must find the plan, or its key (the key was in the plan's spec)."""
        book = self.book
        if plan.key is not None:
            until = self._until(plan)
            if until > now:
                kept = KeptKey(plan=plan.id, until=until)
                self.store.put(KEYS, plan.key.encode(), self._enc.encode(kept))
                heapq.heappush(self._kept, (until, plan.key))
            elif book.keys.get(plan.key) == plan.id:
                del book.keys[plan.key]
        book.planstore.delete(plan)
        if plan.spec.coordinator != DAG:
            self.sessions.delete(plan.id)
        for msg_id in self.inbox.drop(plan.id):
            self.store.delete("inbox", msg_id.encode())
        book.plans.pop(plan.id, None)
        book.final.discard(plan.id)
        book.waiters.pop(plan.id, None)
        self.forget(plan)


def _session_of(plan: PlanRecord) -> str | None:
    """The session plan id `plan`'s key names, if it has a session's key."""
    if plan.key is None or SESSION_MARK not in plan.key:
        return None
    return plan.key.partition(SESSION_MARK)[0]

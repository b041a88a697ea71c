"""The tree's one event log: a durable, append-only stream of what the tree did (issue 22).

ARCHITECTURE.md §12 ("One event log") and seeds/003 ("The event bus is the one write path"):
every consumer reads one log (`ctl events`, the SDK's `events`, the audit of answers) instead
of each process's own records.

Layout: the LMDB environment `<state_dir>/events`, db `events`; key = the event's sequence
number (8 bytes, big-endian), value = a msgpack `frames.Event` without its `seq`.

Writers: the supervisor and the coordinator, each through a `Store` of its own on this one
environment, so each event is written behind its process's loop like every other write
(`Store.append`: queued, O(1), no handler awaits it). LMDB lets one write transaction in at a
time across processes, and `append` reads and bumps the sequence inside it: sequence numbers
are unique, in commit order, and without holes across both writers. A writer killed before its
batch committed loses those events and no sequence number. In one process (`start
--colocated`) the two share one `Store` (LMDB forbids opening an environment twice in a
process): `EventLog.open` hands out the open one, counted, and closes it with its last user.

Readers (`page`) read what is committed, from any thread; the supervisor serves `ctl events`
off its loop. A reader that resumes from the last `seq` it saw misses nothing and sees nothing
twice, across restarts of any writer.

Retention (`trim`): the front of the log, events older than `[retention] events_s`, is deleted
a bounded run at a time; LMDB reuses the freed pages.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import msgspec

from orchestra_sup.errors import StateError
from orchestra_sup.protocol.frames.events import Event, EventsPage
from orchestra_sup.state.store import SEQ_BYTES, Store

log = logging.getLogger(__name__)

DB = "events"
EVENTS_DIR = "events"
"""The environment's directory inside the state directory."""
SCAN_MAX = 10_000
"""Rows a page looks at, at most, when it filters by plan (`page`'s `next` says where it
stopped); rows one `trim` deletes, at most."""
PAGE_MAX = 5_000
"""Events one page lists, at most."""
TRIM_STEP = 256
"""Rows `trim` reads at a time: a run that finds nothing old reads one step."""

KINDS = (
    "child.starting", "child.running", "child.stopping", "child.exited", "child.backoff",
    "child.stopped", "supervisor.escalated", "rollover.step", "rollover.done", "reload.done",
    "plan.accepted", "plan.finished", "task.pending", "task.starting", "task.running",
    "task.awaiting_approval", "task.paused", "task.interrupted", "task.succeeded",
    "task.failed", "task.skipped", "task.cancelled", "lane.fenced", "hitl.answered",
    "budget.refused", "quota.refused", "retention.pruned",
)  # fmt: skip
"""Every kind an event has (`Event.kind`)."""


class EventSink(Protocol):
    """What a component that records events needs: `EventLog.emit`."""

    def emit(self, kind: str, **fields: str) -> None: ...


class Unlogged:
    """An `EventSink` that keeps nothing: a component built without a log (a unit test)."""

    def emit(self, kind: str, **fields: str) -> None:
        pass


UNLOGGED = Unlogged()

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Event).decode
_shared: dict[Path, tuple[Store, int]] = {}
_shared_lock = threading.Lock()


class EventLog:
    """The event log at `<state_dir>/events`, written as `source` (`open`)."""

    def __init__(self, store: Store, source: str) -> None:
        self.store = store
        self.source = source
        self._closed = False

    @classmethod
    def open(
        cls, state_dir: Path, source: str, thread_start: Callable[[], None] | None = None
    ) -> EventLog:
        """The log of the tree whose state directory is `state_dir`, written as `source`;
        made if missing. `thread_start` is its write-behind thread's first call (`Store`; the
        first opener's, in a process that opens it twice). Raises `StateError` when it cannot
        be opened."""
        path = (state_dir / EVENTS_DIR).absolute()
        with _shared_lock:
            store, users = _shared.get(path, (None, 0))
            if store is None:
                store = Store(path, [DB], thread_start=thread_start)
                store.start()
            _shared[path] = (store, users + 1)
        return cls(store, source)

    def close(self) -> None:
        """Flush what this process queued and close the environment with its last user."""
        if self._closed:
            return
        self._closed = True
        path = self.store.path
        with _shared_lock:
            store, users = _shared[path]
            if users > 1:
                _shared[path] = (store, users - 1)
                return
            del _shared[path]
        store.close()

    def emit(self, kind: str, **fields: str) -> None:
        """Queue one event of `kind` with `fields` (`Event`'s `plan`, `task`, `lane`, `child`,
        `who`, `detail`), written behind: returns at once, and never raises for the log's own
        sake (closed, failing): recording must not fail what it records."""
        event = Event(at=round(time.time(), 6), source=self.source, kind=kind, **fields)
        try:
            self.store.append(DB, b"", _encode(event))
        except (StateError, ValueError) as exc:
            log.debug("event %s not logged: %s", kind, exc)

    def page(self, since: int = 0, limit: int = 500, plan: str = "") -> EventsPage:
        """The committed events after `since`, oldest first, at most `limit` (capped at
        `PAGE_MAX`); only plan `plan`'s when given (looking at `SCAN_MAX` rows at most). A row
        that cannot be decoded (written by a newer release, or damaged) is passed over and
        logged. Reads LMDB: call it off the loop."""
        limit = max(1, min(limit, PAGE_MAX))
        rows = self.store.scan(DB, _key(since + 1), SCAN_MAX if plan else limit)
        events: list[Event] = []
        last_seen = since
        for key, value in rows:
            last_seen = int.from_bytes(key, "big")
            event = _event(last_seen, value)
            if event is None or (plan and event.plan != plan):
                continue
            events.append(event)
            if len(events) >= limit:
                break
        first = self.store.scan(DB, b"", 1)
        newest = self.store.last_key(DB)
        return EventsPage(
            events=events,
            next=last_seen,
            first=int.from_bytes(first[0][0], "big") if first else 0,
            last=int.from_bytes(newest, "big") if newest else 0,
        )

    def trim(self, before: float) -> int:
        """Delete from the front the events written before `before` (Unix time, seconds), and
        rows that cannot be decoded, at most `SCAN_MAX` of them, reading `TRIM_STEP` rows at a
        time; returns how many went. Reads LMDB: call it off the loop."""
        gone, start = 0, b""
        while gone < SCAN_MAX:
            rows = self.store.scan(DB, start, TRIM_STEP)
            for key, value in rows:
                event = _event(0, value)
                if event is not None and event.at >= before:
                    return gone
                self.store.delete(DB, key)
                gone += 1
            if len(rows) < TRIM_STEP:
                return gone
            start = _key(int.from_bytes(rows[-1][0], "big") + 1)
        return gone


def _key(seq: int) -> bytes:
    return seq.to_bytes(SEQ_BYTES, "big")


def _event(seq: int, value: bytes) -> Event | None:
    """The event stored at `seq`, or None (logged) when the row cannot be decoded."""
    try:
        return msgspec.structs.replace(_decode(value), seq=seq)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.warning("event %d: unreadable, passed over: %s", seq, exc)
        return None

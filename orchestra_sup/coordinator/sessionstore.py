"""A session's durable state: where its program resumes from, the lanes it started, the questions
it asked, and its inbox of events.

A session is a plan whose coordinator is a program (`coordinator.context`); the plan itself is
kept like any (`coordinator.planstore`: its spec, and its `outcome` once it ends). What the seat
(`coordinator.seat`, `coordinator.session`) needs to rebuild the program after its process is
gone lives here, in two databases of the coordinator's environment (`DBS`):

- `sessions`: plan id -> `SessionRecord`: the last checkpoint and how many were taken (the
  epoch of the effect ids), the inbox cursor it covers, the next event's sequence number and
  every question asked (by key);
- `session_lanes`: rows under `<plan id>/` (`Store.append`), one `SessionLane` per lane
  started, in the order they started: a start writes its own row, not the session's record
  again (a session of 10,000 lanes would otherwise write its whole list 10,000 times);
- `session_events`: `<plan id>/<seq, 10 digits>` -> `Entry`: one inbox event and its `origin`,
  what caused it ("result:<lane's plan>", "note:<inbox message id>", "answer:<key>",
  "message:<id>"), by which an event is committed once however often its cause is applied again.

Order: an event and the record that counts it are queued together, event first, and the store
commits in queue order (`state.store.Store`), so a record never counts an event that is not
there; an event past the record's count is found again at load (`load` keeps it and moves the
count on).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec

from orchestra_sup.coordinator.context import Event
from orchestra_sup.state.store import Store

log = logging.getLogger(__name__)

SESSIONS = "sessions"
LANES = "session_lanes"
EVENTS = "session_events"
DBS = [SESSIONS, LANES, EVENTS]
"""The databases `SessionStore` needs in the coordinator's environment."""


class SessionLane(msgspec.Struct, kw_only=True):
    """A lane the session started: its effect id (`key`), the one-task plan that runs it
    (`plan`), its command and the revision its sandbox was asked at (None: the head)."""

    key: str
    plan: str
    run: str
    rev: str | None = None


class Question(msgspec.Struct, kw_only=True):
    """A question the session asked a human: `handle` is what `ctl pending` shows as its lane
    and `ctl approve|reject|redirect` takes; `answer` ({"verdict", "text", "responder"}) once
    answered. `asked_at` is Unix seconds."""

    key: str
    handle: str
    question: str
    asked_at: float
    answer: dict[str, Any] | None = None


class SessionRecord(msgspec.Struct, kw_only=True):
    """See the module docstring. `checkpoint` is the msgpack encoding of the last checkpoint's
    value (None: none taken); `cursor` is the sequence number of the last event that checkpoint
    covers; `runs` counts the times the program was built (1 on its first start), `wedges` the
    times the coordinator process died during one of its program's steps (`coordinator.
    stepping`; a program that does it `seat.MAX_WEDGES` times is failed)."""

    id: str
    checkpoint: bytes | None = None
    checkpoints: int = 0
    cursor: int = 0
    next_seq: int = 1
    runs: int = 0
    wedges: int = 0
    questions: dict[str, Question] = {}


class Entry(msgspec.Struct, kw_only=True):
    """One stored inbox event and what caused it (see the module docstring)."""

    origin: str
    event: Event


def event_key(session: str, seq: int) -> bytes:
    return f"{session}/{seq:010d}".encode()


class SessionStore:
    """The sessions of the coordinator's `store` (opened with `DBS`)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._enc = msgspec.msgpack.Encoder()
        self._record = msgspec.msgpack.Decoder(SessionRecord)
        self._lane = msgspec.msgpack.Decoder(SessionLane)
        self._entry = msgspec.msgpack.Decoder(Entry)

    def write(self, rec: SessionRecord) -> asyncio.Future[None]:
        """Queue `rec`; the future resolves once it is committed (`Store.put_durable`)."""
        return self.store.put_durable(SESSIONS, rec.id.encode(), self._enc.encode(rec))

    def append(self, rec: SessionRecord, entry: Entry) -> asyncio.Future[None]:
        """Queue `entry` (its event's `seq` taken from `rec.next_seq`, which moves on) and then
        `rec`; the future resolves once both are committed."""
        self.store.put(EVENTS, event_key(rec.id, entry.event.seq), self._enc.encode(entry))
        return self.write(rec)

    def delete(self, session: str) -> None:
        """Queue the delete of everything of session `session` (retention): its record first,
        then its lanes' rows and its events."""
        self.store.delete(SESSIONS, session.encode())
        self.store.delete_prefix(LANES, f"{session}/".encode())
        self.store.delete_prefix(EVENTS, f"{session}/".encode())

    def add_lane(self, session: str, lane: SessionLane) -> None:
        """Queue `lane`'s row (written behind: the lane's own plan is durable already, and a
        row lost with the process is written again when the replayed start finds that plan)."""
        self.store.append(LANES, f"{session}/".encode(), self._enc.encode(lane))

    def lanes(self, session: str) -> list[SessionLane]:
        """The lanes session `session` started, in order, as committed (unreadable rows are
        logged and skipped)."""
        out: list[SessionLane] = []
        for value in self.store.rows(LANES, f"{session}/".encode()):
            try:
                out.append(self._lane.decode(value))
            except msgspec.DecodeError as exc:
                log.error("session %s: unreadable lane skipped: %s", session, exc)
        return out

    def load(self, live: set[str]) -> dict[str, tuple[SessionRecord | None, list[Entry]]]:
        """The record and the events, oldest first, of each session in `live` (the plan ids of
        sessions not ended): (None, events) for one whose record was never committed. Unreadable
        entries are logged and skipped; one bad entry must not stop the coordinator. Its lanes
        are `lanes`."""
        found: dict[str, tuple[SessionRecord | None, list[Entry]]] = {s: (None, []) for s in live}
        for key, value in self.store.items(SESSIONS):
            session = key.decode(errors="replace")
            if session not in live:
                continue
            try:
                found[session] = (self._record.decode(value), [])
            except msgspec.DecodeError as exc:
                log.error("session %s: unreadable record skipped: %s", session, exc)
        for key, value in self.store.items(EVENTS):
            session = key.decode(errors="replace").partition("/")[0]
            if session not in live:
                continue
            try:
                found[session][1].append(self._entry.decode(value))
            except msgspec.DecodeError as exc:
                log.error("session %s: unreadable event %r skipped: %s", session, key, exc)
        for rec, entries in found.values():
            if rec is not None and entries:
                rec.next_seq = max(rec.next_seq, entries[-1].event.seq + 1)
        return found

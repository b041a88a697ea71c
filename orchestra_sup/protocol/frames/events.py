"""The event log: ctl -> supervisor (`ctl events`, the SDK's `events`) (`Events`).

An `Event` is one row of the tree's one durable, append-only event log (`state.events`). Its
`seq` is the log's own: assigned when its row commits, one more than the last committed by any
writer, never reused; a reader that resumes from the last `seq` it saw misses nothing and sees
nothing twice.
"""

from __future__ import annotations

import msgspec

from orchestra_sup.protocol.frames.frame import Frame

MAX_SEQ = (1 << 63) - 1
"""The largest sequence number a reader may give (`CtlEvents.since`): msgpack's int bound."""


class Event(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the tree did, once.

    - `seq`: the log's sequence number (0 in a row not yet read back: the key holds it);
    - `at`: when it happened, Unix time, seconds;
    - `source`: the process that wrote it ("supervisor", "coordinator", or on a host's
      agent `<host>/supervisor`);
    - `kind`: what happened, dotted ("child.exited", "plan.accepted", "task.running",
      "hitl.answered", ...; `state.events.KINDS` lists every one);
    - `plan`, `task`, `lane`, `child`: what it concerns ("" where none);
    - `who`: for an act of a person or program, the identity the server stamped from the
      authenticated connection (uid, key name or token name; never read from a request);
    - `detail`: one line for people ("exit_code 3", "approve: looks fine", ...).
    """

    seq: int = 0
    at: float
    source: str
    kind: str
    plan: str = ""
    task: str = ""
    lane: str = ""
    child: str = ""
    who: str = ""
    detail: str = ""


class CtlEvents(Frame, tag="ctl_events"):
    """`ctl events`: the events after `since` (a `seq`; 0: from the first kept), at most
    `limit` of them, only those of plan `plan` when given. Answered `EventsPage`."""

    since: int = 0
    limit: int = 500
    plan: str = ""


class EventsPage(Frame, tag="events_page"):
    """Events after the asked `since`, oldest first. `next` is the `since` of the next page:
    the last seq this one looked at (with `plan`, events of other plans are passed over, and
    `next` can be past the last event listed). `last` is the newest seq committed, `first`
    the oldest still kept (retention: `[retention] events_s`); 0 for an empty log."""

    events: list[Event]
    next: int
    first: int
    last: int


Events = CtlEvents | EventsPage

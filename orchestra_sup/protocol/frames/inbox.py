"""The inbox: a shard's durable outbox -> the coordinator's durable inbox (`Inbox`)."""

from __future__ import annotations

from orchestra_sup.protocol.frames.frame import Frame
from orchestra_sup.protocol.frames.values import HitlPause, LaneNote, LaneResult


class InboxPut(Frame, tag="inbox_put"):
    """A durable message for the coordinator; `msg_id` is unique and used to de-duplicate."""

    msg_id: str
    result: LaneResult | None = None
    pause: HitlPause | None = None
    note: LaneNote | None = None
    """Exactly one of `result`, `pause` and `note` is set."""
    received_ns: int | None = None
    """When the coordinator received it (CLOCK_MONOTONIC nanoseconds, `time.monotonic_ns`), set
    by the coordinator as it takes the message and kept with it in its inbox; a sender leaves it
    None. `bench reaction` times from it."""


class InboxAck(Frame, tag="inbox_ack"):
    """The coordinator committed `msg_id` to its inbox; the sender may drop it from its outbox."""

    msg_id: str


Inbox = InboxPut | InboxAck

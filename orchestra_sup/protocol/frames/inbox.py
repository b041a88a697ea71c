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


class InboxAck(Frame, tag="inbox_ack"):
    """The coordinator committed `msg_id` to its inbox; the sender may drop it from its outbox."""

    msg_id: str


Inbox = InboxPut | InboxAck

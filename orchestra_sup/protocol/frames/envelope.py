"""The envelope one ZeroMQ message carries, and `Body`, the union of every channel's frames.

`Envelope` is generic over its body: `Envelope[Body]` is what the wire decodes
(`protocol.codec`), `Envelope[U]` for a channel's union `U` an envelope of that channel. The
parameter is a type only: the bytes are the same whatever it is.
"""

from __future__ import annotations

from typing import Annotated, Generic, TypeVar

import msgspec

from orchestra_sup.protocol.frames.control import Control
from orchestra_sup.protocol.frames.ctl import Ctl
from orchestra_sup.protocol.frames.events import Events
from orchestra_sup.protocol.frames.frame import Ack, Error
from orchestra_sup.protocol.frames.hosts import Cluster
from orchestra_sup.protocol.frames.inbox import Inbox
from orchestra_sup.protocol.frames.lanes import LanePlane
from orchestra_sup.protocol.frames.relay import Relay
from orchestra_sup.protocol.frames.retention import Retention
from orchestra_sup.protocol.frames.rollover import Rollover
from orchestra_sup.protocol.frames.sandbox import Sandbox

Body = (
    Control
    | Sandbox
    | Relay
    | LanePlane
    | Inbox
    | Ctl
    | Rollover
    | Retention
    | Events
    | Cluster
    | Ack
    | Error
)
"""Every frame body; the wire's tags are unique across it."""

B = TypeVar("B", bound=Body)
"""An envelope's body type: `Body` or a union of some of its members."""

ENVELOPE_ID_MAX = 256
"""Characters an envelope's `id`, `corr` and `sender` may hold (ours are a name, a generation
and a counter: tens). A longer one is a `bad_frame`: every answer echoes the id, so an id
near the frame limit would make every answer to it too large to send."""

MessageId = Annotated[str, msgspec.Meta(max_length=ENVELOPE_ID_MAX)]


class Envelope(msgspec.Struct, Generic[B], frozen=True, kw_only=True, array_like=True):
    """The one thing a ZeroMQ message carries.

    - `v`: protocol version of the sender.
    - `id`: message id, unique per sender incarnation.
    - `corr`: the `id` this frame answers, or None for a request or a one-way frame.
    - `sender`, `gen`: who sent it and which generation of it.
    - `id`, `corr` and `sender` hold at most `ENVELOPE_ID_MAX` characters.
    - `ttl_s`: seconds the sender will wait for an answer (None: no reply expected or no limit).
    - `dest_gen`: the generation of the receiver the sender means (None: any); a receiver of another
      generation refuses the frame with `stale_generation`, so a request queued for a process that
      died is never acted on by its replacement.
    """

    v: int
    id: MessageId
    corr: MessageId | None
    sender: MessageId
    gen: int
    ttl_s: float | None
    dest_gen: int | None
    body: B

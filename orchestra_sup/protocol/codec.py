"""Encoding and strict decoding of `Envelope` frames.

One encoder and one typed decoder are built once per process and shared by every socket.
Decoding is strict: garbage bytes, an unknown tag, a wrong field type, an oversized frame, a
value nested too deeply to decode (a `ToolResult` of 100,000 nested arrays is 100 KB) or a
version outside our range raise `ProtocolError` with a stable code, so a receiver can answer
and go on. The error names the frame's message id whenever its head can still be read (every
case but a frame nested too deeply), so the answer reaches the request it refuses: a frame of
a body this release does not know (a newer `ctl` against an older tree) is refused at once,
not left to its caller's timeout.

Sizes (issue 24): a frame is at most `MAX_FRAME_BYTES`, both ways: `encode` refuses to make a
larger one (the ctl client then refuses the request before sending it, an endpoint answers
with an `Error` in place of a reply that large), and `decode` refuses one with code `too_large`,
naming the frame's message id when it can still be read, so the refusal answers the request.
Every socket lets libzmq take messages up to `SOCKET_MAX_BYTES` (twice the frame limit), so a
frame somewhat over the limit reaches `decode` and is answered; one over that is cut off by
libzmq (it drops the connection, and nothing can answer), which bounds what one connection
makes a process buffer.
"""

from __future__ import annotations

import msgspec

from orchestra_sup.errors import ErrorCode, ProtocolError
from orchestra_sup.protocol.frames import Body, Envelope, MessageId
from orchestra_sup.protocol.version import PROTOCOL_MAX, PROTOCOL_MIN

MAX_FRAME_BYTES = 16 * 1024 * 1024
"""Largest frame sent or acted on, in bytes (16 MiB), encoded: a request's body and its
envelope."""
SOCKET_MAX_BYTES = 2 * MAX_FRAME_BYTES
"""Every socket's `zmq.MAXMSGSIZE`, in bytes (32 MiB): larger messages are dropped by libzmq
with their connection, before they are buffered whole."""


class _Head(msgspec.Struct, array_like=True):
    """The first two fields of an `Envelope` (msgspec skips the rest of the array unread)."""

    v: int
    id: MessageId


class _Addressed(msgspec.Struct, array_like=True):
    """An `Envelope`'s fields up to `dest_gen` (the body is skipped unread)."""

    v: int
    id: MessageId
    corr: MessageId | None
    sender: MessageId
    gen: int
    ttl_s: float | None
    dest_gen: int | None


class Codec:
    """Turns `Envelope` values into bytes and back, frames of at most `max_bytes` (default
    `MAX_FRAME_BYTES`).

    `encode` raises `ProtocolError` with code `too_large` for a frame over `max_bytes`.
    `decode` raises it with `too_large` for one over `max_bytes`, `bad_frame` for anything that
    is not a well-formed envelope of a known body type, and `version_skew` for a version outside
    our range; each with `msg_id` set when the frame's id can be read.
    """

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES):
        self.max_bytes = max_bytes
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(Envelope[Body])
        self._head = msgspec.msgpack.Decoder(_Head)
        self._addressed = msgspec.msgpack.Decoder(_Addressed)

    def encode(self, env: Envelope) -> bytes:
        data = self._encoder.encode(env)
        if len(data) > self.max_bytes:
            raise ProtocolError(ErrorCode.TOO_LARGE, self.too_large(len(data)))
        return data

    def too_large(self, size: int) -> str:
        """A frame of `size` bytes is over the limit, in words."""
        mib = f" ({self.max_bytes >> 20} MiB)" if self.max_bytes % (1 << 20) == 0 else ""
        return f"a frame of {size:,} bytes is over the limit of {self.max_bytes:,} bytes{mib}"

    def decode(self, data: bytes | memoryview) -> Envelope[Body]:
        if len(data) > self.max_bytes:
            msg_id = self._id_of(data)  # ~1 ms for 17 MB: the rest is skipped
            raise ProtocolError(ErrorCode.TOO_LARGE, self.too_large(len(data)), msg_id=msg_id)
        try:
            env = self._decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise ProtocolError(ErrorCode.BAD_FRAME, str(exc), msg_id=self._id_of(data)) from exc
        except RecursionError:  # msgspec's answer to arrays or maps nested past the stack
            # not read again for its id: skipping the rest would recurse as deep
            raise ProtocolError(ErrorCode.BAD_FRAME, "frame nested too deeply") from None
        if not PROTOCOL_MIN <= env.v <= PROTOCOL_MAX:
            raise ProtocolError(
                ErrorCode.VERSION_SKEW,
                f"frame speaks protocol {env.v}, this peer speaks {PROTOCOL_MIN}..{PROTOCOL_MAX}",
                msg_id=env.id,
            )
        return env

    def dest_gen_of(self, data: bytes | memoryview) -> int | None:
        """The `dest_gen` frame `data` names, its body not read (a relay's routing: a host's
        data port). Raises `ProtocolError(bad_frame)` when its envelope's head does not
        decode."""
        try:
            return self._addressed.decode(data).dest_gen
        except (msgspec.DecodeError, RecursionError) as exc:
            raise ProtocolError(ErrorCode.BAD_FRAME, f"no envelope head: {exc}") from None

    def _id_of(self, data: bytes | memoryview) -> str | None:
        """The message id of a frame that cannot be decoded whole, when its head still reads
        as a version and an id of at most `ENVELOPE_ID_MAX` characters; else None."""
        try:
            return self._head.decode(data).id
        except (msgspec.DecodeError, RecursionError):
            return None

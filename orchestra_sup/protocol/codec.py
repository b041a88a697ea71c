"""Encoding and strict decoding of `Envelope` frames.

One encoder and one typed decoder are built once per process and shared by every socket.
Decoding is strict: garbage bytes, an unknown tag, a wrong field type, an oversized frame, a
value nested too deeply to decode (a `ToolResult` of 100,000 nested arrays is 100 KB) or a
version outside our range raise `ProtocolError` with a stable code, so a receiver can answer
and go on.
"""

from __future__ import annotations

import msgspec

from orchestra_sup.errors import ErrorCode, ProtocolError
from orchestra_sup.protocol.frames import Envelope
from orchestra_sup.protocol.version import PROTOCOL_MAX, PROTOCOL_MIN

MAX_FRAME_BYTES = 16 * 1024 * 1024
"""Largest frame accepted, in bytes (16 MiB). Sockets also set `zmq.MAXMSGSIZE` to this so libzmq
drops a larger message before it is ever buffered whole."""


class Codec:
    """Turns `Envelope` values into bytes and back.

    `decode` raises `ProtocolError` with code `bad_frame` for anything that is not a well-formed
    envelope of a known body type, and `version_skew` for a version outside our range.
    """

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES):
        self.max_bytes = max_bytes
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(Envelope)

    def encode(self, env: Envelope) -> bytes:
        return self._encoder.encode(env)

    def decode(self, data: bytes | memoryview) -> Envelope:
        if len(data) > self.max_bytes:
            raise ProtocolError(
                ErrorCode.BAD_FRAME, f"frame of {len(data)} bytes exceeds {self.max_bytes}"
            )
        try:
            env = self._decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise ProtocolError(ErrorCode.BAD_FRAME, str(exc)) from exc
        except RecursionError:  # msgspec's answer to arrays or maps nested past the stack
            raise ProtocolError(ErrorCode.BAD_FRAME, "frame nested too deeply") from None
        if not PROTOCOL_MIN <= env.v <= PROTOCOL_MAX:
            raise ProtocolError(
                ErrorCode.VERSION_SKEW,
                f"frame speaks protocol {env.v}, this peer speaks {PROTOCOL_MIN}..{PROTOCOL_MAX}",
            )
        return env

"""The HTTP API's connections, before and around aiohttp (`supervisor.httpserve`): how many may
be open, their TLS handshakes, and clients that stop reading.

aiohttp bounds none of these, and each costs the supervisor a descriptor, which ctl and the
children need too (a breaker shut ctl out with 21,000 silent connections, then with 20,000
TLS handshakes that never finished, then held 256 connections for as long as it liked by never
reading its answers). So:

- every accepted connection counts, from the accept: those aiohttp holds, those handed to it
  whose `connection_made` has not come yet (accepted in one burst, every factory call runs
  before the first of them is made), and those in their TLS handshake (`Gate.pending`); one
  over `most` is answered 503 and closed (plain), or closed at once (TLS: there is no one to
  answer before a handshake);
- TLS is started here on the accepted socket (`loop.start_tls`) rather than by the server, so
  a handshake is a connection the gate sees, bounded by `handshake_s`;
- every `sweep_s` the connections whose outgoing buffer held bytes at the last sweep and has
  not shrunk since are aborted (`sweep`): a client that reads, however slowly, is kept; one
  that stopped is let go, its answer's write included, which no timeout of aiohttp's covers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
import time

from aiohttp import web

log = logging.getLogger("orchestra_sup.supervisor")

FULL_LINGER_S = 1.0
"""Seconds a connection over the bound is held for its request to be read (`_Full`)."""
FULL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nRetry-After: 1\r\nContent-Length: %d\r\n\r\n%s"
)
_FULL_BODY = b'{"error": {"code": "busy", "message": "too many connections to the HTTP API"}}'


class Gate:
    """The protocol factory of the API's listening socket over aiohttp's `server`: at most
    `most` connections open; TLS with `tls` (None: plain), each handshake within
    `handshake_s`; writers stuck for `sweep_s` aborted once `start_sweeping` ran. `refused`
    and `stuck` count the connections turned away and aborted."""

    def __init__(
        self, server: web.Server, most: int, tls: ssl.SSLContext | None, handshake_s: float
    ) -> None:
        self.server, self.most, self.tls, self.handshake_s = server, most, tls, handshake_s
        self.pending: dict[object, float] = {}
        """Connections accepted that aiohttp does not hold yet, and when (monotonic s)."""
        self.refused = 0
        self.stuck = 0
        self._buffered: dict[web.RequestHandler, int] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._handshakes: set[asyncio.Task[None]] = set()
        # A handler leaves `pending` the moment aiohttp holds it: one made and lost between
        # two counts would otherwise stay counted for `grace` (a breaker shut the API out
        # with one short connection at a time). aiohttp's handler reports to its server.
        told = server.connection_made

        def held(handler: web.RequestHandler, transport: asyncio.Transport) -> None:
            self.pending.pop(handler, None)
            told(handler, transport)

        server.connection_made = held  # type: ignore[method-assign]

    def open(self) -> int:
        """Connections open now: aiohttp's, and those accepted it does not hold yet. An entry
        leaves `pending` when aiohttp holds it (`held`) or its handshake ends; one older than
        a handshake may take is an accept that failed before either, and is dropped here."""
        now = time.monotonic()
        grace = self.handshake_s + 1
        if any(now - at >= grace for at in self.pending.values()):
            self.pending = {each: at for each, at in self.pending.items() if now - at < grace}
        return len(self.server.connections) + len(self.pending)

    def __call__(self) -> asyncio.BaseProtocol:
        now = time.monotonic()
        if self.open() >= self.most:
            self.refused += 1
            return _Full() if self.tls is None else _Shut()
        if self.tls is None:
            handler = self.server()
            self.pending[handler] = now
            return handler
        return _Handshake(self, now)

    def start_sweeping(self, every_s: float) -> None:
        """Sweep every `every_s` seconds from now on, until `close`."""
        loop = asyncio.get_running_loop()

        def sweep() -> None:
            self.sweep()
            self._sweeper = loop.call_later(every_s, sweep)

        self._sweeper = loop.call_later(every_s, sweep)

    def sweep(self) -> None:
        """Abort each connection whose outgoing buffer held bytes at the last sweep and has
        not shrunk since; remember the rest that hold bytes now."""
        buffered: dict[web.RequestHandler, int] = {}
        for handler in self.server.connections:
            transport = handler.transport
            if transport is None:  # a closing one too: its close waits on the same buffer
                continue
            size = transport.get_write_buffer_size()  # type: ignore[attr-defined]
            before = self._buffered.get(handler)
            if size and before is not None and size >= before:
                self.stuck += 1
                log.info("HTTP API: a client read none of %d bytes for a sweep: reset", size)
                _reset(transport)
            elif size:
                buffered[handler] = size
        self._buffered = buffered

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for task in self._handshakes:
            task.cancel()


def _reset(transport: asyncio.BaseTransport) -> None:
    """Close `transport` with a reset (SO_LINGER 0): what the kernel still holds to send to a
    client that does not read is dropped with it, not kept until the peer's window opens."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()  # type: ignore[attr-defined]


class _Handshake(asyncio.Protocol):
    """An accepted connection in its TLS handshake: counted in the gate's `pending` until it
    is done, then given to aiohttp's handler; aborted when it fails or takes longer than the
    gate's `handshake_s`."""

    def __init__(self, gate: Gate, at: float) -> None:
        self.gate = gate
        gate.pending[self] = at

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # nothing is read until the TLS layer is in place
        task = asyncio.get_running_loop().create_task(self._upgrade(transport))
        self.gate._handshakes.add(task)
        task.add_done_callback(self.gate._handshakes.discard)

    def connection_lost(self, exc: Exception | None) -> None:
        self.gate.pending.pop(self, None)

    async def _upgrade(self, transport: asyncio.Transport) -> None:
        gate = self.gate
        assert gate.tls is not None
        handler = gate.server()
        try:
            secured = await asyncio.get_running_loop().start_tls(
                transport,
                handler,
                gate.tls,
                server_side=True,
                ssl_handshake_timeout=gate.handshake_s,
            )
        except (OSError, asyncio.CancelledError) as exc:  # SSLError, timeouts are OSErrors
            exc.__traceback__ = None  # its frames hold the TLS layer's buffers in a cycle
            transport.abort()
            return
        finally:
            gate.pending.pop(self, None)
        if secured is None:  # the connection closed meanwhile
            transport.abort()
            return
        handler.connection_made(secured)


class _Full(asyncio.Protocol):
    """A plain connection over the bound: answered 503 at once, closed once the client's
    request is read (closing with it unread would reset the connection, and the answer with
    it), or after `FULL_LINGER_S`, whichever is first."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(FULL % (len(_FULL_BODY), _FULL_BODY))
        self.timer = asyncio.get_running_loop().call_later(FULL_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        self.timer.cancel()
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.timer.cancel()


class _Shut(asyncio.Protocol):
    """A TLS connection over the bound: closed at once, its descriptor given back now."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.abort()

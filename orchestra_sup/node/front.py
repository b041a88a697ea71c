"""A thread that owns a node's public ROUTER and answers cheap requests where they arrive.

Why (ADR 0001): a request served on the node's loop costs a loop wake-up, a task, and for disk
work a hop to a worker thread and back; `bench relay` measured that at about four times the raw
pyzmq round trip for a `stat`. A thread blocked in `zmq_poll` on the socket itself answers a
cheap, independent request with none of those.

Arrangement: the front binds the node's ROUTER at the node's public address, so nothing changes
for peers (same address, same routing ids, `ROUTER_MANDATORY`, the roster's generations), and
binds an inproc PAIR the node's server `Endpoint` connects to. For every frame the ROUTER
receives, the front decodes it and, when it is a request (no `corr`) for this generation (or for
no generation in particular), calls `serve(env)`; a body returned is sent back at once as the
reply. Everything else (`serve` returned None, a frame that does not decode, a stale
generation, a reply) is passed to the loop unchanged as `[peer, frame]`, where the node's
`Endpoint` (created with `routed=True`) handles it exactly as if it came from the ROUTER:
typed `Error` frames, `stale_generation`, counters. The loop's replies come back over the pair
and the front sends them on the ROUTER.

Threading rules: `serve` runs on the front's thread, never on the loop, so it may block on disk
(ARCHITECTURE §11.1 bounds what runs on the loop) but must not touch loop state. Frames are
handled one at a time in arrival order, which bounds what the front has in flight at one.
Idle, the thread sleeps in `zmq_poll` with no timeout: no CPU. `close()` wakes it through a pipe;
it forwards what the loop already replied, closes its sockets (linger 0) and exits.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable

import zmq

from orchestra_sup.errors import ErrorCode, ProtocolError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import MAX_FRAME_BYTES, Codec
from orchestra_sup.protocol.endpoint import error_frame
from orchestra_sup.protocol.version import PROTOCOL_VERSION

log = logging.getLogger(__name__)

Serve = Callable[[f.Envelope], f.Body | None]
"""Called on the front's thread with a request for this generation: the reply body, or None to
leave the request to the node's loop. An exception it raises is answered with the `Error` frame
it maps to (`endpoint.error_frame`)."""


class Front:
    """The thread in front of a node's loop; see the module docstring.

    `start(public, inner)` binds both sockets (on the caller's thread, so the public address is
    bound when it returns) and starts the thread; `close()` stops it and returns once it has
    exited. `on_crash()` is called on the front's thread if it ever dies of an unexpected error
    (the node then stops, so its supervisor restarts it, rather than go on deaf). Counters:
    `answered` (requests `serve` answered), `forwarded` (frames passed to the loop).
    """

    def __init__(
        self,
        ctx: zmq.Context,
        *,
        name: str,
        generation: int,
        serve: Serve,
        on_crash: Callable[[], None],
    ):
        self.name = name
        self.generation = generation
        self.serve = serve
        self.on_crash = on_crash
        self.codec = Codec()  # msgspec encoders are not shared across threads
        self.router: zmq.Socket = ctx.socket(zmq.ROUTER)
        self.router.linger = 0
        self.router.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES + 4096)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.pair: zmq.Socket = ctx.socket(zmq.PAIR)
        self.pair.linger = 0
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._ids = itertools.count(1)
        self._thread = threading.Thread(target=self._run, name=f"{name}-front", daemon=True)
        self.answered = 0
        self.forwarded = 0

    def start(self, public: str, inner: str) -> None:
        self.router.bind(public)
        self.pair.bind(inner)
        self._thread.start()  # hands both sockets over: only the thread uses them from now on

    def close(self) -> None:
        if self._thread.is_alive():
            os.write(self._wake_w, b"x")
            self._thread.join()
        else:  # never started, or crashed: the sockets are this thread's to close
            self._close_sockets()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # --- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:
            log.exception("%s: the front thread failed", self.name)
            self._close_sockets()
            self.on_crash()
            return
        self._close_sockets()

    def _close_sockets(self) -> None:
        self.router.close(linger=0)
        self.pair.close(linger=0)

    def _loop(self) -> None:
        router, pair = self.router, self.pair
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(pair, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while True:
            ready = dict(poller.poll())
            # Replies first, also when woken to stop: what the loop answered still goes out.
            while pair.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._send(pair.recv_multipart(zmq.NOBLOCK))
            if self._wake_r in ready:
                return
            while router.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._receive(router.recv_multipart(zmq.NOBLOCK))

    def _receive(self, parts: list[bytes]) -> None:
        body = self._answer(parts)
        if body is None:
            self.forwarded += 1
            self.pair.send_multipart(parts)
            return
        self.answered += 1

    def _answer(self, parts: list[bytes]) -> f.Body | None:
        """Serve `parts` here if it is a request `serve` takes; None passes it to the loop."""
        if len(parts) != 2:
            return None
        try:
            env = self.codec.decode(parts[1])
        except ProtocolError:
            return None  # the loop answers it and counts it, as for any bad frame
        if env.corr is not None or (env.dest_gen is not None and env.dest_gen != self.generation):
            return None
        try:
            body = self.serve(env)
        except Exception as exc:
            body = error_frame(exc)
            if body.code is ErrorCode.INTERNAL:
                log.exception("%s: serving %s failed", self.name, type(env.body).__name__)
        if body is None:
            return None
        reply = f.Envelope(
            v=PROTOCOL_VERSION,
            id=f"{self.name}.{self.generation}.f{next(self._ids)}",
            corr=env.id,
            sender=self.name,
            gen=self.generation,
            ttl_s=None,
            dest_gen=None,
            body=body,
        )
        self._send([parts[0], self.codec.encode(reply)])
        return body

    def _send(self, parts: list[bytes]) -> None:
        try:
            self.router.send_multipart(parts, zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # Again (its queue is full) or EHOSTUNREACH (gone)
            log.info("%s: reply to %r dropped: %s", self.name, parts[0], exc)

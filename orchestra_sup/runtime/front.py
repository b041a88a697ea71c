"""A thread that owns a node's public ROUTER and answers cheap requests where they arrive.

Why (ADR 0001): a request served on the node's loop costs a loop wake-up, a task, and for disk
work a hop to a worker thread and back; `bench relay` measured that at about four times the raw
pyzmq round trip for a `stat`. A thread blocked in `zmq_poll` on the socket itself answers a
cheap, independent request with none of those.

Arrangement: one ROUTER, owned by the front's thread, bound at the node's public address (so
nothing changes for peers: same address, same routing ids, `ROUTER_MANDATORY`, the roster's
generations) and at an inproc address where the node's server `Endpoint` connects as a DEALER
with the routing id `LOOP_ID` (created with `routed=True`, so it carries `[peer, frame]` like a
ROUTER). For every frame from a peer the front decodes it and, when it is a request (no `corr`)
for this generation (or for no generation in particular), calls `serve(env)`; a body returned is
sent back at once as the reply. Everything else (`serve` returned None, a frame that does not
decode, a stale generation, a reply) goes to the loop unchanged as `[peer, frame]`, where the
node's `Endpoint` handles it exactly as if it came from the public ROUTER: typed `Error` frames,
`stale_generation`, counters. The loop's replies come back on the same socket and the front sends
them on to their peer. One socket means the thread simply blocks in `recv`: no poller.

Busy polling (`busy_poll_s`, `[cpu] busy_poll_s`): after each frame it answered or passed back
from the loop, the thread polls its socket without sleeping for up to that long, yielding its
CPU to any other runnable thread at each poll, and only then blocks (after a frame it passed
to the loop it blocks at once: the loop's reply comes after the loop's work, and a window then
would only take a CPU from that work). A caller's next read, sent within the window (a
coordinator reading file after file), finds the thread running instead of asleep on a vCPU
that halted: on these machines that wake is most of what a relay's `stat` adds to the raw
round trip (ADR 0001, "Busy polling the front"). It costs at most `busy_poll_s` of one CPU
per frame. A thread in a real-time class never busy-polls, whoever put it there (`chrt`, with
or without reset-on-fork): it would keep its CPU from every thread below it and run down
RLIMIT_RTTIME. Nor does one that may run on one CPU only, however it was pinned
(`reserved_cpus`, `taskset`, systemd's `CPUAffinity=`): the peer it waits for could only run
while it yields. `cpupolicy.role_plans` gives such a custodian 0 where it can tell, and
`_may_spin` checks both at every poll.

Threading rules: `serve` runs on the front's thread, never on the loop, so it may block on disk
(ARCHITECTURE §11.1 bounds what runs on the loop) but must not touch loop state. Frames are
handled one at a time in arrival order, which bounds what the front has in flight at one.
Idle, the thread sleeps in `recv` (after its busy-poll window): no CPU. `close()` sends it a
stop frame from `STOP_ID`; it forwards what the loop has already replied, closes its socket
(linger 0) and exits.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable

import zmq

from orchestra_sup.errors import ProtocolError
from orchestra_sup.protocol import curve
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import SOCKET_MAX_BYTES, Codec
from orchestra_sup.protocol.endpoint import error_frame, internal_error, unexpected
from orchestra_sup.protocol.version import PROTOCOL_VERSION
from orchestra_sup.system import cpupolicy

log = logging.getLogger(__name__)

LOOP_ID = b"\0front-loop"
"""Routing id of the node's loop on the front's ROUTER. A leading zero byte is reserved for
libzmq's own ids, and no generated id is this long, so no peer has it; a peer claiming it later
would be refused (it is connected first, and ROUTER ids are never handed over)."""
STOP_ID = b"\0front-stop"
"""Routing id of the socket `close()` stops the thread with."""


def _may_spin() -> bool:
    """Whether the calling thread may busy-poll: it is in SCHED_OTHER (whatever its reset-on-fork
    flag; not FIFO or RR, which would keep its CPU from every thread below it, nor DEADLINE,
    where a yield gives up the rest of its period) and may run on more than one CPU (on one,
    the peer it waits for could only run while it yields)."""
    policy = os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK
    return policy == os.SCHED_OTHER and len(os.sched_getaffinity(0)) > 1


Serve = Callable[[f.Envelope], f.Body | None]
"""Called on the front's thread with a request for this generation: the reply body, or None to
leave the request to the node's loop. An exception it raises is answered with the `Error` frame
it maps to (`endpoint.error_frame`); an unexpected one, and a body that cannot be encoded, are
answered `internal` (`endpoint.internal_error`), counted and logged."""


class Front:
    """The thread in front of a node's loop; see the module docstring.

    Construction binds the ROUTER at `inner` (an `inproc://` address), where the node's server
    must connect (routing id `LOOP_ID`) before `start(public)`; that order makes the loop known
    to the ROUTER before any peer can send. `busy_poll_s` (seconds, default 0: block at once)
    is the busy-poll window after each frame (module docstring). `start` binds `public` (on the
    caller's thread, so it is bound when it returns) and starts the thread. `close()`, from the
    thread that called `start`, stops the thread and returns once it has exited. `on_crash()`
    is called on the front's thread if it ever dies of an unexpected error (the node then
    stops, so its supervisor restarts it, rather than go on deaf). Counters: `answered`
    (requests `serve` answered), `forwarded` (frames passed to the loop), `internal_errors`
    (requests answered `internal`: `serve` raised an unexpected exception, or its reply could
    not be encoded).
    """

    def __init__(
        self,
        ctx: zmq.Context,
        *,
        name: str,
        generation: int,
        serve: Serve,
        on_crash: Callable[[], None],
        inner: str,
        busy_poll_s: float = 0.0,
    ):
        self.name = name
        self.busy_poll_s = busy_poll_s
        self.generation = generation
        self.serve = serve
        self.on_crash = on_crash
        self.codec = Codec()  # msgspec encoders are not shared across threads
        self.router: zmq.Socket = ctx.socket(zmq.ROUTER)
        self.router.linger = 0
        self.router.setsockopt(zmq.MAXMSGSIZE, SOCKET_MAX_BYTES)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._stop: zmq.Socket = ctx.socket(zmq.DEALER)
        self._stop.linger = 0
        self._stop.setsockopt(zmq.IDENTITY, STOP_ID)
        self.router.bind(inner)
        self._stop.connect(inner)
        self._ids = itertools.count(1)
        self._thread = threading.Thread(target=self._run, name=f"{name}-front", daemon=True)
        self._enter_class = cpupolicy.same_class()  # on a turn's path, as the loop is
        self.answered = 0
        self.forwarded = 0
        self.internal_errors = 0

    def start(self, public: str) -> None:
        curve.bind(self.router, public)  # refuses tcp:// (no keys): ADR 0012
        self._thread.start()  # hands the ROUTER over: only the thread uses it from now on

    def close(self) -> None:
        if self._thread.is_alive():
            self._stop.send(b"")
            self._thread.join()
        else:  # never started, or crashed: the ROUTER is this thread's to close
            self.router.close(linger=0)
        self._stop.close(linger=0)

    # --- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        self._enter_class()
        # What the thread will do, found where it runs: a plan cannot see an inherited affinity.
        if self.busy_poll_s and _may_spin():
            log.info(
                "%s: the front busy-polls %g us after each frame", self.name, self.busy_poll_s * 1e6
            )
        else:
            log.info("%s: the front sleeps in recv between frames (no busy polling)", self.name)
        try:
            self._loop()
        except Exception:
            log.exception("%s: the front thread failed", self.name)
            self.on_crash()
        finally:
            self.router.close(linger=0)

    def _loop(self) -> None:
        router = self.router
        poll = False  # after a frame the loop took, its reply comes after its work: no window
        while True:
            parts = self._recv(poll)
            sender = parts[0]
            if sender == STOP_ID:
                # What the loop replied before it asked to stop still goes out.
                while router.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    parts = router.recv_multipart(zmq.NOBLOCK)
                    if parts[0] == LOOP_ID:
                        self._send(parts[1:])
                return
            poll = True
            if sender == LOOP_ID:
                self._send(parts[1:])
            elif not self._answer(parts):
                self.forwarded += 1
                router.send_multipart([LOOP_ID, *parts])  # blocks while the loop is behind
                poll = False

    def _recv(self, poll: bool) -> list[bytes]:
        """The next frame: with `poll`, polled for without sleeping for up to `busy_poll_s`
        while `_may_spin()`, then waited for in `recv`."""
        deadline = time.perf_counter() + self.busy_poll_s
        # Read at every poll: another process may change the class (chrt) at any time.
        while poll and self.busy_poll_s and _may_spin():
            try:
                return self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                if time.perf_counter() >= deadline:
                    break
                os.sched_yield()  # a thread waiting for this CPU runs first
        return self.router.recv_multipart()

    def _answer(self, parts: list[bytes]) -> bool:
        """Serve `parts` here if it is a request `serve` takes; False passes it to the loop."""
        if len(parts) != 2:
            return False
        try:
            env = self.codec.decode(parts[1])
        except ProtocolError:
            return False  # the loop answers it and counts it, as for any bad frame
        if env.corr is not None or (env.dest_gen is not None and env.dest_gen != self.generation):
            return False
        try:
            body = self.serve(env)
        except Exception as exc:
            if unexpected(exc):
                self._failed(env, exc, "in serve")
            body = error_frame(exc)
        if body is None:
            return False
        try:
            data = self.codec.encode(self._reply(env, body))
        except ProtocolError as exc:  # over the frame limit: say so instead
            message = f"the answer ({type(body).__name__}) is not sent: {exc.detail}"
            data = self.codec.encode(self._reply(env, f.Error(code=exc.code, message=message)))
        except Exception as exc:  # e.g. a file name that is not UTF-8, left in a str
            self._failed(env, exc, f"encoding its {type(body).__name__} reply")
            data = self.codec.encode(self._reply(env, internal_error(exc)))
        self.answered += 1  # before the reply leaves: whoever got it can count on the count
        self._send([parts[0], data])
        return True

    def _reply(self, request: f.Envelope, body: f.Body) -> f.Envelope:
        return f.Envelope(
            v=PROTOCOL_VERSION,
            id=f"{self.name}.{self.generation}.f{next(self._ids)}",
            corr=request.id,
            sender=self.name,
            gen=self.generation,
            ttl_s=None,
            dest_gen=None,
            body=body,
        )

    def _failed(self, env: f.Envelope, exc: Exception, doing: str) -> None:
        self.internal_errors += 1
        what = type(env.body).__name__
        log.error("%s: serving %s failed %s", self.name, what, doing, exc_info=exc)

    def _send(self, parts: list[bytes]) -> None:
        try:
            self.router.send_multipart(parts, zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # Again (its queue is full) or EHOSTUNREACH (gone)
            log.info("%s: reply to %r dropped: %s", self.name, parts[0], exc)

"""A host's data port: the one CURVE endpoint the root's processes reach its shards at (ADR 0021,
step 3, root to host).

The agent binds `host --listen tcp://HOST:PORT` as a CURVE server with the host's own keypair
(`<name>.secret`: the root has its public half, `clients/<name>.public`), admitting only the
root's server key (`server.public`, which the host has), so no key is made for it. A caller on
the root connects a DEALER as CURVE client with the root's server keypair, pinning the host's
key, with routing id `<caller id>>shard-K`: its own routing id (`coordinator.3`), then the shard
it calls. The port splits that id, reads the frame's `dest_gen` (its envelope's head only) and
forwards the frame to the `ipc://` socket of shard-K's process at that generation (`route`:
during a rollover's surge two run, each at its own socket), through a DEALER whose routing id
is the caller's own, one per routing id and socket. The answer comes back on that DEALER and
goes out to the caller. So the shard sees the caller as it would see a local one: generations,
`dest_gen` and its stale-frame checks hold unchanged.

A frame whose routing id names no shard of this host is answered `Error(peer_down)` (its
envelope read only for its id) and counted (`refused`), as is a frame that does not decode.
The forwarding runs on a thread of its own with a `zmq.Poller`, so frames never wait for the
agent's event loop. Its sockets are that thread's: only the ZAP handler (`curve.Gate`) and its
monitor run on the loop. A DEALER no frame went through for `IDLE_S` seconds is closed (a
caller of a past generation), so the port keeps no more sockets than it has live callers.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

import zmq

from orchestra_sup.errors import ErrorCode, ProtocolError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.curve import Gate, bind
from orchestra_sup.protocol.keys import ClientKeys, ServerKeys
from orchestra_sup.protocol.version import PROTOCOL_VERSION
from orchestra_sup.runtime.remote import SEPARATOR

log = logging.getLogger("orchestra_sup.supervisor")

IDLE_S = 300.0
"""Seconds after which a DEALER no frame went through is closed."""
SWEEP_S = 10.0
"""Seconds between two looks for idle DEALERs (the poller's longest wait)."""
ROOT = "root"
"""The name the root's server key is admitted under."""


Link = tuple[bytes, str]
"""A forwarding DEALER's key: the caller's routing id, and the shard socket it is connected to."""
Route = Callable[[str, int | None], str | None]
"""Where shard `name`'s process at generation `dest_gen` listens (None: at the generation that
stands for the shard now), its `ipc://` endpoint; None when the host has no shard `name`."""


class DataPort:
    """The data port of a host whose keys are `keys` (its own keypair, the root's public key),
    at `address`, forwarding to the shards `route` finds (called on the port's thread: it only
    reads). `open()` binds it (on the loop: raises `zmq.ZMQError` when the address cannot be
    bound) and starts the thread; `close()` stops both. Counters, read from any thread:
    `forwarded` (frames to a shard), `returned` (answers to a caller), `refused`."""

    def __init__(self, ctx: zmq.Context, address: str, keys: ClientKeys, route: Route):
        self.ctx = ctx
        self.address = address
        self.route = route
        self.server_keys = ServerKeys(server=keys.client, clients={keys.server_public: ROOT})
        self.forwarded = 0
        self.returned = 0
        self.refused = 0
        self._gate: Gate | None = None
        self._router: zmq.Socket | None = None
        self._stop: zmq.Socket | None = None
        self._thread: threading.Thread | None = None
        self._codec = Codec()

    def open(self) -> None:
        self._gate = Gate(self.ctx, self.server_keys)
        self._gate.start()  # before the bind: a CURVE socket with no ZAP handler admits all
        router = self.ctx.socket(zmq.ROUTER)
        router.linger = 0
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            bind(router, self.address, self.server_keys)
        except zmq.ZMQError:
            router.close()
            self._gate.close()
            raise
        self._gate.watch(router)
        self._router = router
        wake = f"inproc://dataport-{id(self)}"
        self._stop = self.ctx.socket(zmq.PAIR)
        self._stop.bind(wake)
        stopped = self.ctx.socket(zmq.PAIR)
        stopped.connect(wake)
        self._thread = threading.Thread(
            target=self._run, args=(router, stopped), name="dataport", daemon=True
        )
        self._thread.start()
        log.info("data port at %s (CURVE, the root's key only)", self.address)

    def close(self) -> None:
        """Stop the thread (it closes its sockets) and the gate."""
        if self._stop is not None and self._thread is not None:
            self._stop.send(b"")
            self._thread.join()
            self._stop.close(linger=0)
            self._stop = self._thread = None
        if self._gate is not None:
            self._gate.close()
            self._gate = None

    @property
    def refused_at_handshake(self) -> int:
        """Peers the gate refused: no CURVE, or a key that is not the root's."""
        return self._gate.refused if self._gate is not None else 0

    # --- the forwarding thread --------------------------------------------------------------------

    def _run(self, router: zmq.Socket, stop: zmq.Socket) -> None:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(stop, zmq.POLLIN)
        dealers: dict[Link, zmq.Socket] = {}
        callers: dict[zmq.Socket, Link] = {}
        used: dict[Link, float] = {}
        swept = time.monotonic()
        try:
            while True:
                ready = dict(poller.poll(SWEEP_S * 1000))
                if stop in ready:
                    return
                for sock in ready:
                    if sock is router:
                        self._inbound(router, poller, dealers, callers, used)
                    elif sock in callers:
                        self._outbound(router, sock, callers[sock][0])
                        used[callers[sock]] = time.monotonic()
                now = time.monotonic()
                if now - swept >= SWEEP_S:
                    swept = now
                    for link in [k for k, at in used.items() if now - at > IDLE_S]:
                        sock = dealers.pop(link)
                        poller.unregister(sock)
                        del callers[sock], used[link]
                        sock.close(linger=0)
        finally:
            for sock in dealers.values():
                sock.close(linger=0)
            router.close(linger=0)
            stop.close(linger=0)

    def _inbound(
        self,
        router: zmq.Socket,
        poller: zmq.Poller,
        dealers: dict[Link, zmq.Socket],
        callers: dict[zmq.Socket, Link],
        used: dict[Link, float],
    ) -> None:
        while True:
            try:
                parts = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            ident, data = parts[0], parts[-1]
            caller, sep, shard = ident.partition(SEPARATOR)
            endpoint = None
            if sep and caller and len(parts) == 2:
                endpoint = self._endpoint(shard.decode(errors="replace"), data)
            if endpoint is None:
                self._refuse(router, ident, data, shard)
                continue
            link = (ident, endpoint)
            dealer = dealers.get(link)
            if dealer is None:
                dealer = self.ctx.socket(zmq.DEALER)
                dealer.linger = 0
                dealer.setsockopt(zmq.IDENTITY, caller)
                dealer.connect(endpoint)
                dealers[link], callers[dealer] = dealer, link
                poller.register(dealer, zmq.POLLIN)
            used[link] = time.monotonic()
            try:
                dealer.send(data, zmq.NOBLOCK)
                self.forwarded += 1
            except zmq.Again:  # the shard's queue is full: the caller times out, as locally
                self.refused += 1

    def _endpoint(self, shard: str, data: bytes) -> str | None:
        """Where the frame `data` for `shard` goes: its process at the frame's `dest_gen`; None
        for no shard of this host, or a frame that does not decode."""
        try:
            return self.route(shard, self._codec.dest_gen_of(data))
        except ProtocolError:
            return None

    def _outbound(self, router: zmq.Socket, dealer: zmq.Socket, ident: bytes) -> None:
        while True:
            try:
                data = dealer.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                router.send_multipart([ident, data], zmq.NOBLOCK)
                self.returned += 1
            except zmq.ZMQError:  # the caller went away (EHOSTUNREACH) or cannot take it
                self.refused += 1

    def _refuse(self, router: zmq.Socket, ident: bytes, data: bytes, shard: bytes) -> None:
        """Answer a frame for no shard of this host with `Error(peer_down)`, when it can be
        read; count it either way."""
        self.refused += 1
        try:
            request = self._codec.decode(data)
        except ProtocolError:
            return
        name = shard.decode(errors="replace") or "(none)"
        answer = f.Envelope(
            v=PROTOCOL_VERSION,
            id=f"dataport.{self.refused}",
            corr=request.id,
            sender="dataport",
            gen=1,
            ttl_s=None,
            dest_gen=None,
            body=f.Error(
                code=ErrorCode.PEER_DOWN,
                message=f"this host has no shard {name!r} (routing id: CALLER>SHARD)",
            ),
        )
        with contextlib.suppress(zmq.ZMQError):  # the caller went away meanwhile
            router.send_multipart([ident, self._codec.encode(answer)], zmq.NOBLOCK)

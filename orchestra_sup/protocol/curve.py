"""CURVE on `tcp://` endpoints: the one rule, the socket options, and the gate that admits only
the tree's client keys (ADR 0012).

The rule (ARCHITECTURE.md §3): an `ipc://` socket lives in the 0700 run directory and its
peers are known by their uid; a `tcp://` socket has no such wall, so it is bound or connected
only with CURVE. `bind` and `connect` are the only way the product puts a socket on an
address: both refuse `tcp://` without keys (`ConfigError`), and set the CURVE options when
keys are given.

A CURVE server socket admits a client only if the context's ZAP handler says so. `Gate` is that
handler for one context: bound at `inproc://zeromq.zap.01` before any CURVE socket is, it admits
exactly the public keys in `ServerKeys.clients`, hosts' keys only on a socket bound in the
`CLUSTER_DOMAIN` and operators' keys only on the others (ADR 0022: a host's key steers nothing),
and tells libzmq the client's name as its user id, `key:<name>`, which every message from that
connection then carries as its `User-Id` property (`endpoint.frame_caller`). A peer without
CURVE fails the ZMTP greeting (mechanism mismatch), a peer with an unknown key (or a key on the
wrong endpoint) is denied by the gate: neither gets a frame through, and
both are counted (`Gate.refused`, from the socket's monitor) and logged, at most once every
`LOG_EVERY_S` seconds (a refused libzmq client reconnects every 100 ms by default).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import zmq
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from orchestra_sup.errors import ConfigError
from orchestra_sup.protocol.keys import ClientKeys, ServerKeys

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
CLUSTER_DOMAIN = "cluster"
"""The ZAP domain of the root's cluster endpoint, where hosts' keys, and only they, are admitted."""
KEY_USER_PREFIX = "key:"
"""A connection admitted by the gate carries `User-Id` `key:<client name>`."""
HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 5000
"""ZMTP heartbeats of the tree's long-lived tcp links (a host's to its root, both ends): a
connection silent this long is closed, and a DEALER makes it again."""
HANDSHAKE_IVL_MS = 3000
"""How long a tcp peer has to finish its ZMTP and CURVE handshake: a connection that opens and
says nothing is closed then, instead of holding a descriptor (libzmq's default is 30 s)."""
LOG_EVERY_S = 10.0
REFUSALS = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


def needs_curve(addr: str) -> bool:
    """True for an address that must use CURVE: `tcp://`."""
    return addr.startswith("tcp://")


def bind(sock: zmq.Socket, addr: str, keys: ServerKeys | None = None, domain: str = "") -> None:
    """Bind `sock` at `addr`, serving CURVE with `keys` when given, its handshakes put to the
    `Gate` in ZAP `domain` ("": operators; `CLUSTER_DOMAIN`: hosts). The context must already
    have a `Gate` started, or libzmq admits every CURVE client.

    Raises `ConfigError` for a `tcp://` address without `keys`; `zmq.ZMQError` when the
    address cannot be bound."""
    if keys is not None:
        if domain:  # libzmq refuses an empty one; unset is the "" domain
            sock.zap_domain = domain.encode()
        sock.curve_server = True
        sock.curve_secretkey = keys.server.secret
        sock.curve_publickey = keys.server.public
    elif needs_curve(addr):
        raise ConfigError(f"{addr}: a tcp:// endpoint needs CURVE keys (see `keys init`)")
    sock.bind(addr)


def connect(sock: zmq.Socket, addr: str, keys: ClientKeys | None = None) -> None:
    """Connect `sock` to `addr`, as CURVE client `keys.name` pinning the server key when
    `keys` is given. Raises `ConfigError` for a `tcp://` address without `keys`."""
    if keys is not None:
        sock.curve_serverkey = keys.server_public
        sock.curve_publickey = keys.client.public
        sock.curve_secretkey = keys.client.secret
    elif needs_curve(addr):
        raise ConfigError(f"{addr}: a tcp:// endpoint needs CURVE keys (--keys DIR)")
    sock.connect(addr)


class Gate:
    """The ZAP handler of `ctx`, admitting the client keys of `keys`, and the watch that counts
    the handshakes refused on the CURVE sockets given to `watch`.

    `start()` binds the handler and must come before binding any CURVE socket on `ctx`; both
    run on the calling thread's event loop (`start` and `watch` are called from it). Counters:
    `admitted` (handshakes the handler allowed), `denied` (keys the handler refused: unknown,
    or a host's and an operator's each on the other's endpoint),
    `refused` (every failed handshake the monitors saw: no CURVE, an unknown key, garbage).
    Raises `zmq.ZMQError` from `start` when another ZAP handler is bound on `ctx`.
    """

    def __init__(self, ctx: zmq.Context, keys: ServerKeys):
        self.ctx = ctx
        self.keys = keys
        self.admitted = 0
        self.denied = 0
        self.refused = 0
        self._zap: zmq.Socket | None = None
        self._monitors: list[tuple[zmq.Socket, zmq.Socket]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._logged_at = -LOG_EVERY_S
        self._unlogged = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._zap = self.ctx.socket(zmq.REP)
        self._zap.linger = 0
        self._zap.bind(ZAP_ENDPOINT)
        self._watch_fd(self._zap, self._on_zap)

    def watch(self, sock: zmq.Socket) -> None:
        """Count and log the handshakes `sock` refuses."""
        monitor = sock.get_monitor_socket(REFUSALS)
        self._monitors.append((sock, monitor))
        self._watch_fd(monitor, lambda: self._on_event(monitor))

    def close(self) -> None:
        """Stop the handler and the watches (the watched sockets are the caller's to close)."""
        for sock, monitor in self._monitors:
            self._unwatch_fd(monitor)
            if not sock.closed:
                sock.disable_monitor()
            monitor.close(linger=0)
        self._monitors.clear()
        if self._zap is not None:
            self._unwatch_fd(self._zap)
            self._zap.close(linger=0)
            self._zap = None

    def _watch_fd(self, sock: zmq.Socket, drain: Callable[[], None]) -> None:
        assert self._loop is not None

        def drained() -> None:
            # edge-triggered FD: drain everything waiting on each wake-up (as `Endpoint` does)
            while not sock.closed and sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                drain()

        self._loop.add_reader(sock.getsockopt(zmq.FD), drained)
        self._loop.call_soon(drained)

    def _unwatch_fd(self, sock: zmq.Socket) -> None:
        if self._loop is not None and not sock.closed:
            self._loop.remove_reader(sock.getsockopt(zmq.FD))

    def _on_zap(self) -> None:
        assert self._zap is not None
        request = self._zap.recv_multipart(zmq.NOBLOCK)
        # ZAP 1.0 (rfc.zeromq.org/spec/27): version, request id, domain, address, identity,
        # mechanism, credentials...; for CURVE the one credential is the client's public key.
        # A REP socket must answer before it can receive again, so even a short request is.
        request_id = request[1] if len(request) > 1 else b""
        cluster = len(request) > 2 and request[2] == CLUSTER_DOMAIN.encode()
        address = request[3].decode(errors="replace") if len(request) > 3 else "?"
        mechanism, credentials = (request[5], request[6:]) if len(request) > 5 else (b"", [])
        key = credentials[0] if mechanism == b"CURVE" and len(credentials) == 1 else b""
        name = self.keys.clients.get(z85.encode(key)) if len(key) == 32 else None
        refusal = None
        if name is None:
            offered = z85.encode(key).decode() if len(key) == 32 else "none"
            refusal = f"unknown client key {offered}"
        elif cluster and name not in self.keys.hosts:
            refusal = f"operator key {name!r} on the cluster endpoint (a host's is made --host)"
        elif not cluster and name in self.keys.hosts:
            refusal = f"host key {name!r} on the ctl endpoint (a host's key steers nothing)"
        if refusal is not None:
            self.denied += 1
            self._log(f"{refusal} from {address}")
            self._zap.send_multipart([b"1.0", request_id, b"400", b"refused", b"", b""])
            return
        self.admitted += 1
        user = f"{KEY_USER_PREFIX}{name}".encode()
        self._zap.send_multipart([b"1.0", request_id, b"200", b"OK", user, b""])

    def _on_event(self, monitor: zmq.Socket) -> None:
        event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
        self.refused += 1
        kind = zmq.Event(event["event"]).name.lower()
        self._log(f"tcp peer refused at the handshake on {event['endpoint'].decode()}: {kind}")

    def _log(self, what: str) -> None:
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY_S:
            self._unlogged += 1
            return
        more = f" (and {self._unlogged} more since the last)" if self._unlogged else ""
        log.warning("curve: %s%s", what, more)
        self._logged_at, self._unlogged = now, 0

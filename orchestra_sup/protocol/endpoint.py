"""One ZeroMQ socket driven from an asyncio event loop.

This is the lean integration `notes/performance.md` points at, instead of `zmq.asyncio`: the socket
stays a plain (non-blocking) pyzmq socket, its edge-triggered `FD` is watched with
`loop.add_reader`, and every wake-up drains all queued messages with `recv_multipart(NOBLOCK)` while
`zmq.EVENTS` says one is waiting. Because a send can consume the FD's edge, a send after which a
message is waiting schedules one more drain.

Topology (circus-style): every process binds one ROUTER (with `ROUTER_MANDATORY`, so a send to a
peer that is not connected fails at once); peers connect DEALERs whose routing id is
`<name>.<generation>` (`routing_id`). A new generation therefore connects under a new routing id,
and no handover is allowed: a second connection claiming a routing id that is connected is
refused by libzmq, so nobody can take over a live peer's id and cut it off.

Requests carry a message id and replies carry it back as `corr`; a reply whose request is no
longer pending is stale and dropped.

Caller identity (ARCHITECTURE.md §11 invariant 9): a handler marked with `needs_caller` learns
who sent each frame from the connection, never from the frame. Its endpoint receives with
`copy=False` and reads the message's properties: `User-Id`, which only the process's own ZAP
handler sets (`curve.Gate`: `key:<name>` for an admitted CURVE client key), else `Peer-Address`,
which libzmq fills on `ipc://` from the kernel's `SO_PEERCRED` at connect time as
`localhost:<uid>:<gid>:<pid>` (`notes/isolation.md`). `Endpoint.caller` holds it, parsed
(`PeerCredentials` or `KeyIdentity`), for the duration of each synchronous handler call.
Unmarked endpoints (the relay's hot path) receive plain bytes and pay nothing for it.

Addresses: `bind` and `connect` go through `protocol.curve`, so a `tcp://` address is refused
without CURVE keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import zmq

from orchestra_sup.errors import (
    CallTimeout,
    ErrorCode,
    OrchestraError,
    PeerDown,
    ProtocolError,
    RemoteError,
)
from orchestra_sup.protocol import curve
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import SOCKET_MAX_BYTES, Codec
from orchestra_sup.protocol.keys import ClientKeys, ServerKeys
from orchestra_sup.protocol.version import PROTOCOL_VERSION

log = logging.getLogger(__name__)

Handler = Callable[["Endpoint", bytes | None, f.Envelope], None]
"""Called on the loop for every request or one-way frame: (endpoint, peer routing id or None for a
DEALER, envelope). It must not block; slow work goes to a task that replies when done. One
marked with `needs_caller` also finds the sender's credentials in `Endpoint.caller`."""

H = TypeVar("H", bound=Callable[..., None])

_NEEDS_CALLER = "needs_caller"


def needs_caller(handler: H) -> H:
    """Mark `handler` (a function or a method) as needing each frame's caller identity.

    An `Endpoint` constructed with a marked handler receives with `copy=False` (a `zmq.Frame`
    per part, copied to bytes after the property is read: a few microseconds a message, which is
    why nothing else pays it) and sets `Endpoint.caller` to the sender's `PeerCredentials`, or
    None when the connection has none (`inproc://`, `tcp://`, a malformed property), for the
    duration of each handler call; a CURVE client admitted by a key is a `KeyIdentity`.
    Returns `handler` itself.
    """
    setattr(handler, _NEEDS_CALLER, True)
    return handler


@dataclass(frozen=True, slots=True)
class PeerCredentials:
    """Who is at the other end of an `ipc://` connection, as the kernel said when it connected
    (`SO_PEERCRED`): user id, group id and process id. Unforgeable by the sender's frames."""

    uid: int
    gid: int
    pid: int


def parse_peer_address(address: object) -> PeerCredentials | None:
    """`localhost:<uid>:<gid>:<pid>` (decimal, non-negative) -> `PeerCredentials`; anything
    else (a `tcp://` peer's IP address, a missing part, a sign, a non-ASCII digit) -> None.
    Never raises: no identity is the answer to whatever cannot be read as one."""
    if not isinstance(address, str):
        return None
    host, *numbers = address.split(":")
    if host != "localhost" or len(numbers) != 3:
        return None
    if not all(n.isascii() and n.isdigit() for n in numbers):
        return None
    uid, gid, pid = (int(n) for n in numbers)
    return PeerCredentials(uid=uid, gid=gid, pid=pid)


@dataclass(frozen=True, slots=True)
class KeyIdentity:
    """A CURVE client the process's ZAP handler admitted (`curve.Gate`): `name` is the name its
    public key is allowed under (`keys.py`: `clients/<name>.public`). A key, not a user: who
    holds the secret half is whoever it was given to."""

    name: str


@dataclass(frozen=True, slots=True)
class TokenIdentity:
    """An HTTP API client whose bearer token the supervisor's web server checked
    (`protocol.tokens`): `name` is the token's, `role` what it may do ("read", "operate")."""

    name: str
    role: str


Caller = PeerCredentials | KeyIdentity | TokenIdentity


def frame_caller(frame: zmq.Frame) -> Caller | None:
    """Who sent `frame` (received with `copy=False`) as its connection says: the client key
    the ZAP handler admitted, else the `ipc://` peer's credentials, else None (`inproc://` has
    no properties at all; a plain `tcp://` peer only an IP address)."""
    user = _property(frame, "User-Id")
    if user is not None and user.startswith(curve.KEY_USER_PREFIX):
        return KeyIdentity(name=user.removeprefix(curve.KEY_USER_PREFIX))
    return parse_peer_address(_property(frame, "Peer-Address"))


def frame_connection(frame: zmq.Frame) -> int | None:
    """The descriptor of the connection `frame` (received with `copy=False`) came on
    (`ZMQ_SRCFD`, which libzmq 4.3 still serves though it marks it deprecated), or None when
    it came on none (`inproc://`)."""
    try:
        fd = frame.get(zmq.SRCFD)
    except zmq.ZMQError:
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None


def _property(frame: zmq.Frame, name: str) -> str | None:
    try:
        return frame.get(name)
    except zmq.ZMQError:  # EINVAL: no such property on this message
        return None


class Endpoint:
    """A ROUTER or DEALER socket on the running loop.

    `routed=True` makes a DEALER (the node's behind a `runtime.front.Front`) carry
    `[peer routing id, frame]` like a ROUTER: the handler gets the peer, replies go back to it,
    and an undecodable frame is answered. Counters `bad_frames`, `stale_frames` (requests meant
    for another generation, `Envelope.dest_gen`) and `stale_replies` count what was refused or
    dropped, and `internal_errors` the requests answered `internal` because serving them raised
    an unexpected exception (`failed`). Construction does not touch the loop; `start()` must be
    called from the loop thread.

    `caller` is the sender's `Caller` while a `needs_caller` handler runs (None when
    its connection has none); it is None at every other time and on every other endpoint, so a
    task the handler spawns must take it as an argument, not read it later. `connection` is,
    likewise, the descriptor of the connection the frame came on (`frame_connection`), which
    `protocol.connections.ConnectionGuard` knows its connections by.
    """

    def __init__(
        self,
        ctx: zmq.Context,
        kind: int,
        *,
        name: str,
        generation: int,
        codec: Codec,
        handler: Handler | None = None,
        identity: str | None = None,
        routed: bool = False,
    ):
        self.name = name
        self.generation = generation
        self.kind = kind
        self.routed = routed or kind == zmq.ROUTER
        self.codec = codec
        self.handler = handler
        self.reads_caller = bool(getattr(handler, _NEEDS_CALLER, False))
        self.caller: Caller | None = None
        self.connection: int | None = None
        self.sock: zmq.Socket = ctx.socket(kind)
        self.sock.linger = 0
        self.sock.setsockopt(zmq.MAXMSGSIZE, SOCKET_MAX_BYTES)  # over the frame limit: answered
        if kind == zmq.ROUTER:
            self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if identity is not None:
            self.sock.setsockopt(zmq.IDENTITY, identity.encode())
        self.sock.setsockopt(zmq.RECONNECT_IVL, 10)
        self.sock.setsockopt(zmq.RECONNECT_IVL_MAX, 200)
        self._ids = itertools.count(1)
        self._pending: dict[str, tuple[asyncio.Future[f.Envelope], bytes | None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_scheduled = False
        self.bad_frames = 0
        self.stale_frames = 0
        self.stale_replies = 0
        self.internal_errors = 0

    # --- lifecycle -------------------------------------------------------------------------------

    def bind(self, addr: str, keys: ServerKeys | None = None, domain: str = "") -> None:
        """Bind at `addr`, serving CURVE with `keys` in ZAP `domain` (`curve.bind`: a `tcp://`
        address needs them, and a started `curve.Gate` on the context). Raises `ConfigError`
        for `tcp://` without keys, `zmq.ZMQError` when the address cannot be bound."""
        curve.bind(self.sock, addr, keys, domain)

    def connect(self, addr: str, keys: ClientKeys | None = None) -> None:
        """Connect to `addr`, as a CURVE client with `keys` (`curve.connect`). Raises
        `ConfigError` for `tcp://` without keys."""
        curve.connect(self.sock, addr, keys)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.sock.getsockopt(zmq.FD), self._drain)
        self._schedule_drain()

    def close(self, linger_s: float = 0.0) -> None:
        """Close the socket; pending requests fail with `PeerDown`, and so does any later send.
        Frames already sent are dropped, unless `linger_s` (seconds) gives them that long to
        leave: the context's `term()` then waits for them (a supervisor about to re-exec)."""
        if self._loop is not None and not self.sock.closed:
            self._loop.remove_reader(self.sock.getsockopt(zmq.FD))
        for fut, _peer in self._pending.values():
            if not fut.done():
                fut.set_exception(PeerDown(self.name))
        self._pending.clear()
        self.sock.close(linger=round(linger_s * 1000))

    # --- sending ---------------------------------------------------------------------------------

    def next_id(self) -> str:
        return f"{self.name}.{self.generation}.{next(self._ids)}"

    def send(
        self,
        body: f.Body,
        *,
        to: bytes | None = None,
        corr: str | None = None,
        ttl_s: float | None = None,
        dest_gen: int | None = None,
        msg_id: str | None = None,
    ) -> str:
        """Send one frame without blocking; returns its message id.

        Raises `PeerDown` when a ROUTER has no connection to `to`, when a DEALER's queue is full,
        or when the endpoint was closed (a reply finishing after its socket went away), and
        `ProtocolError` (`too_large`) when the frame would be over `codec.MAX_FRAME_BYTES`
        (nothing is sent).
        """
        if self.sock.closed:
            raise PeerDown(_peer_name(to))
        msg_id = msg_id or self.next_id()
        env = f.Envelope(
            v=PROTOCOL_VERSION,
            id=msg_id,
            corr=corr,
            sender=self.name,
            gen=self.generation,
            ttl_s=ttl_s,
            dest_gen=dest_gen,
            body=body,
        )
        data = self.codec.encode(env)
        try:
            if to is None:
                self.sock.send(data, zmq.NOBLOCK)
            else:
                self.sock.send_multipart([to, data], zmq.NOBLOCK)
        except (zmq.Again, zmq.error.ZMQError) as exc:
            if isinstance(exc, zmq.Again) or exc.errno == zmq.EHOSTUNREACH:
                raise PeerDown(_peer_name(to)) from exc
            raise
        finally:
            # A send can consume the FD's edge; pyzmq's own asyncio layer checks EVENTS for the
            # same reason. Only a message actually waiting needs a drain.
            if not self.sock.closed and self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._schedule_drain()
        return msg_id

    def reply(self, request: f.Envelope, peer: bytes | None, body: f.Body) -> None:
        """Answer `request`; a peer that has gone away is logged and forgotten. An answer over
        the frame limit is replaced by an `Error(too_large)` saying so. Never raises: a body
        that cannot be sent for another reason (one that cannot be encoded, such as a str
        holding a lone surrogate from a file name) is answered as `failed` says instead."""
        try:
            self.send(body, to=peer, corr=request.id)
        except PeerDown:
            log.info("%s: reply to %s dropped, peer gone", self.name, request.sender)
        except ProtocolError as exc:
            log.warning("%s: answer to %s not sent: %s", self.name, request.sender, exc)
            if isinstance(body, f.Error):  # even the refusal does not fit: nothing will
                return
            message = f"the answer ({type(body).__name__}) is not sent: {exc.detail}"
            self.reply(request, peer, f.Error(code=exc.code, message=message))
        except Exception as exc:
            self.failed(request, peer, exc, f"sending its {type(body).__name__} reply")

    def failed(self, request: f.Envelope, peer: bytes | None, exc: Exception, doing: str) -> None:
        """`exc`, an unexpected exception, was raised serving `request` (`doing` says where, as
        "in its handler"): count it in `internal_errors`, log it with its traceback, and answer
        `request` with `internal_error(exc)`. Never raises; a peer gone is logged and forgotten."""
        self.internal_errors += 1
        what = type(request.body).__name__
        log.error("%s: serving %s failed %s", self.name, what, doing, exc_info=exc)
        try:
            self.send(internal_error(exc), to=peer, corr=request.id)
        except Exception as again:  # gone, or the socket closed under us: nobody to tell
            log.info("%s: internal error reply to %s dropped: %s", self.name, request.sender, again)

    async def request(
        self,
        body: f.Body,
        *,
        to: bytes | None = None,
        timeout_s: float,
        dest_gen: int | None = None,
    ) -> f.Body:
        """Send a request and wait for its reply body.

        Raises `PeerDown` if it cannot be delivered (or the peer is declared down while waiting),
        `CallTimeout` after `timeout_s` seconds without a reply (outcome unknown), and
        `RemoteError` when the peer answers with an `Error` frame.
        """
        loop = self._loop
        assert loop is not None, "endpoint not started"
        fut: asyncio.Future[f.Envelope] = loop.create_future()
        msg_id = self.next_id()
        self._pending[msg_id] = (fut, to)
        # A timer handle on the future, not `asyncio.timeout`: measured on an await of a future
        # resolved at once, the scope (its reschedule, task cancellation and uncancel
        # bookkeeping) costs ~8 us per call, the handle ~4 us; this is the relay's hot path.
        timer = None
        try:
            self.send(body, to=to, ttl_s=timeout_s, dest_gen=dest_gen, msg_id=msg_id)
            timer = loop.call_at(loop.time() + timeout_s, _expire, fut)
            env = await fut
        except _Expired as exc:
            raise CallTimeout(_peer_name(to), type(body).__name__, timeout_s) from exc
        finally:
            if timer is not None:
                timer.cancel()
            self._pending.pop(msg_id, None)  # close() may have cleared it
        if isinstance(env.body, f.Error):
            raise RemoteError(env.body.code, env.body.message)
        return env.body

    def fail_pending(self, to: bytes | None, exc: Exception) -> None:
        """Fail every pending request addressed to `to` (None: all of them) with `exc`."""
        for _msg_id, (fut, peer) in list(self._pending.items()):
            if (to is None or peer == to) and not fut.done():
                fut.set_exception(exc)

    # --- receiving -------------------------------------------------------------------------------

    def _schedule_drain(self) -> None:
        if self._loop is not None and not self._drain_scheduled:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_scheduled = False
        sock = self.sock
        # Receive first, then ask EVENTS whether another message waits. A wake-up nearly always
        # has one (one per wake-up on the relay, measured), and each EVENTS question costs ~3 us
        # (libzmq processes its commands for it): asking before every receive paid it twice per
        # reply. A wake-up with nothing waiting pays one zmq.Again instead; receiving until
        # Again would pay that on every wake-up.
        copy = not self.reads_caller
        dispatch = self._dispatch if copy else self._dispatch_with_caller
        while not sock.closed:
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=copy)
            except zmq.Again:
                return
            dispatch(parts)
            if sock.closed or not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                return

    def _dispatch_with_caller(self, parts: list[zmq.Frame]) -> None:
        self.caller = frame_caller(parts[-1])
        self.connection = frame_connection(parts[-1])
        try:
            self._dispatch([part.bytes for part in parts])
        finally:
            self.caller = self.connection = None

    def _dispatch(self, parts: list[bytes]) -> None:
        peer = parts[0] if self.routed and len(parts) > 1 else None
        try:
            env = self.codec.decode(parts[-1])
        except ProtocolError as exc:
            self.bad_frames += 1
            log.warning("%s: refused frame from %r: %s", self.name, peer, exc)
            # Only the serving (ROUTER) side answers: if both sides answered what they cannot
            # decode, two peers that refuse each other's frames (a version skew) would bounce
            # Error frames at each other forever.
            if self.routed and peer is not None:
                with contextlib.suppress(PeerDown, ProtocolError):  # ProtocolError: too large
                    self.send(f.Error(code=exc.code, message=str(exc)), to=peer, corr=exc.msg_id)
            return
        if env.corr is not None:
            pending = self._pending.get(env.corr)
            if pending is None:
                self.stale_replies += 1
                return
            fut = pending[0]
            if not fut.done():
                fut.set_result(env)
            return
        if env.dest_gen is not None and env.dest_gen != self.generation:
            self.stale_frames += 1
            message = (
                f"frame for {self.name} generation {env.dest_gen}, "
                f"this is generation {self.generation}"
            )
            self.reply(env, peer, f.Error(code=ErrorCode.STALE_GENERATION, message=message))
            return
        if self.handler is None:
            return
        try:
            self.handler(self, peer, env)
        except Exception as exc:  # a handler bug must not stop the loop for everyone else
            self.failed(env, peer, exc, "in its handler")


class _Expired(OrchestraError):
    """A request's deadline passed (set on its future by its timer)."""


def _expire(fut: asyncio.Future[f.Envelope]) -> None:
    if not fut.done():
        fut.set_exception(_Expired())


def routing_id(name: str, generation: int) -> bytes:
    """The routing id a process of `name` at `generation` connects its DEALERs with."""
    return f"{name}.{generation}".encode()


def _peer_name(routing: bytes | None) -> str:
    if routing is None:
        return "peer"
    return routing.decode(errors="replace").rsplit(".", 1)[0]


async def reply_when_done(
    ep: Endpoint, peer: bytes | None, request: f.Envelope, work: Awaitable[f.Body]
) -> None:
    """Await `work` (off the receive loop, in a task the caller owns) and answer `request` with
    its result, or with the `Error` frame its exception maps to (`error_frame`); an unexpected
    one is counted and logged as well (`Endpoint.failed`). Never raises but `CancelledError`."""
    try:
        body = await work
    except Exception as exc:
        if unexpected(exc):
            ep.failed(request, peer, exc, "in the task serving it")
            return
        body = error_frame(exc)
    ep.reply(request, peer, body)


INTERNAL_MESSAGE_MAX = 2000
"""An `internal` error's message is cut to this many characters."""


def unexpected(exc: BaseException) -> bool:
    """True for an exception nothing raises on purpose: not an `OrchestraError` (a bug, or an
    input nobody foresaw). `error_frame` answers it `internal`, naming its type."""
    return not isinstance(exc, OrchestraError)


def internal_error(exc: BaseException) -> f.Error:
    """The `internal` Error answering unexpected `exc`: message `"<type>: <str(exc)>"`, cut to
    `INTERNAL_MESSAGE_MAX` characters, with what UTF-8 cannot carry (a lone surrogate) escaped,
    so this frame itself always encodes."""
    message = f"{type(exc).__name__}: {exc}"
    if len(message) > INTERNAL_MESSAGE_MAX:
        message = message[: INTERNAL_MESSAGE_MAX - 3] + "..."
    return f.Error(code=ErrorCode.INTERNAL, message=_encodable(message))


def error_frame(exc: BaseException) -> f.Error:
    """Map an exception raised while serving a request to the `Error` frame that answers it:
    its own `code` (an `OrchestraError` that has one), `peer_down`, `timeout`, `internal` for
    any other `OrchestraError` (its message as is); an unexpected one is `internal_error`.
    The message never holds a character UTF-8 cannot carry."""
    if unexpected(exc):
        return internal_error(exc)
    code: Any = getattr(exc, "code", None)
    if isinstance(exc, PeerDown):
        code = ErrorCode.PEER_DOWN
    elif isinstance(exc, CallTimeout):
        code = ErrorCode.TIMEOUT
    if not isinstance(code, ErrorCode):
        code = ErrorCode.INTERNAL
    return f.Error(code=code, message=_encodable(str(exc)))


def _encodable(text: str) -> str:
    """`text` with every lone surrogate (what `os.fsdecode` makes of a byte that is not UTF-8)
    written as its `\\udcXX` escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")

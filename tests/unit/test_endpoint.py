"""Tests for `orchestra_sup.protocol.endpoint.Endpoint` over real ZeroMQ `inproc://` sockets.

Each test runs its own event loop (`asyncio.run`) and its own `zmq.Context`, terminated at the end
after every socket is closed. Waits are on futures and events under `asyncio.timeout` deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from orchestra_sup.errors import (
    CallTimeout,
    ErrorCode,
    GitError,
    PeerDown,
    ProtocolError,
    RemoteError,
)
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.endpoint import (
    Endpoint,
    Handler,
    PeerCredentials,
    frame_caller,
    needs_caller,
    parse_peer_address,
    reply_when_done,
)
from orchestra_sup.protocol.version import PROTOCOL_VERSION

ADDR = "inproc://router"
DEADLINE_S = 5.0
"""Upper bound for anything that should happen promptly; only reached when a test fails."""


class Net:
    """One context and the sockets made on it, all on `addr`; `close()` closes them all and
    terminates it."""

    def __init__(self, addr: str = ADDR) -> None:
        self.addr = addr
        self.ctx = zmq.Context()
        self.endpoints: list[Endpoint] = []
        self.raw: list[zmq.Socket] = []

    def router(
        self, handler: Handler | None = None, *, name: str = "router", generation: int = 1
    ) -> Endpoint:
        ep = Endpoint(
            self.ctx,
            zmq.ROUTER,
            name=name,
            generation=generation,
            codec=Codec(),
            handler=handler,
        )
        self.endpoints.append(ep)
        ep.bind(self.addr)
        ep.start()
        return ep

    def dealer(
        self,
        identity: str,
        handler: Handler | None = None,
        *,
        codec: Codec | None = None,
        generation: int = 1,
    ) -> Endpoint:
        ep = Endpoint(
            self.ctx,
            zmq.DEALER,
            name=identity,
            generation=generation,
            codec=codec or Codec(),
            handler=handler,
            identity=identity,
        )
        self.endpoints.append(ep)
        ep.connect(self.addr)
        ep.start()
        return ep

    def raw_dealer(self) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.linger = 0
        self.raw.append(sock)
        sock.connect(self.addr)
        return sock

    def close(self) -> None:
        for ep in self.endpoints:
            ep.close()
        for sock in self.raw:
            sock.close(linger=0)
        self.ctx.term()


@contextlib.asynccontextmanager
async def _net(addr: str = ADDR) -> AsyncIterator[Net]:
    net = Net(addr)
    try:
        yield net
    finally:
        net.close()


def _run(coro_fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run one test body on a fresh loop."""
    asyncio.run(coro_fn())


def _replying(
    answer: Callable[[f.Envelope], f.Body | None],
    calls: list[f.Envelope] | None = None,
) -> Handler:
    """A handler that records each envelope and replies with `answer(env)` unless it is None."""

    def handler(ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
        if calls is not None:
            calls.append(env)
        body = answer(env)
        if body is not None:
            ep.reply(env, peer, body)

    return handler


async def _routed(router: Endpoint, dealer: Endpoint) -> None:
    """Wait until `router` can address `dealer`: one handler-free round trip (a stale-generation
    refusal, which the router answers itself) proves the connection is up both ways."""
    with pytest.raises(RemoteError) as info:
        await dealer.request(f.Ack(), timeout_s=DEADLINE_S, dest_gen=router.generation + 100)
    assert info.value.code is ErrorCode.STALE_GENERATION


async def _recv_raw(sock: zmq.Socket) -> list[bytes]:
    """Receive one message on a plain socket without blocking the loop, using the same
    edge-triggered FD protocol as `Endpoint` (arm the reader, then re-check EVENTS)."""
    loop = asyncio.get_running_loop()
    fd = sock.getsockopt(zmq.FD)
    while True:
        try:
            return sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            pass
        woke: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, lambda w=woke: w.done() or w.set_result(None))
        try:
            if not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                await woke
        finally:
            loop.remove_reader(fd)


# --- request / reply -----------------------------------------------------------------------------


def test_request_reply_round_trip() -> None:
    """A DEALER's request reaches the ROUTER's handler with the DEALER's identity and the reply
    body comes back to the caller."""

    async def main() -> None:
        async with _net() as net:
            calls: list[f.Envelope] = []
            peers: list[bytes | None] = []

            def handler(ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
                calls.append(env)
                peers.append(peer)
                assert isinstance(env.body, f.CtlPlan)
                ep.reply(env, peer, f.PlanAccepted(id=f"got-{env.body.id}"))

            net.router(handler)
            dealer = net.dealer("d1", generation=4)
            async with asyncio.timeout(DEADLINE_S):
                body = await dealer.request(f.CtlPlan(id="p1"), timeout_s=DEADLINE_S)
            assert body == f.PlanAccepted(id="got-p1")
            assert peers == [b"d1"]
            [env] = calls
            assert env.sender == "d1"
            assert env.gen == 4
            assert env.v == PROTOCOL_VERSION
            assert env.corr is None
            assert env.ttl_s == DEADLINE_S
            assert env.id.startswith("d1.4.")

    _run(main)


def test_router_request_to_dealer_round_trip() -> None:
    """A ROUTER can request a connected DEALER by its routing id and gets the DEALER's reply."""

    async def main() -> None:
        async with _net() as net:
            router = net.router()
            dealer = net.dealer("d1", _replying(lambda env: f.Welcome(generation=9)))
            await _routed(router, dealer)
            async with asyncio.timeout(DEADLINE_S):
                body = await router.request(f.Ack(), to=b"d1", timeout_s=DEADLINE_S)
            assert body == f.Welcome(generation=9)

    _run(main)


def test_concurrent_requests_get_their_own_replies() -> None:
    """Replies are matched to requests by id, not by order: each caller gets its own answer."""

    async def main() -> None:
        async with _net() as net:
            held: list[tuple[bytes | None, f.Envelope]] = []
            all_in = asyncio.Event()

            def handler(ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
                held.append((peer, env))
                if len(held) == 3:
                    # answer in reverse order of arrival
                    for p, e in reversed(held):
                        assert isinstance(e.body, f.CtlPlan)
                        ep.reply(e, p, f.PlanAccepted(id=e.body.id))
                    all_in.set()

            net.router(handler)
            dealer = net.dealer("d1")
            async with asyncio.timeout(DEADLINE_S):
                bodies = await asyncio.gather(
                    *(dealer.request(f.CtlPlan(id=str(i)), timeout_s=DEADLINE_S) for i in range(3))
                )
            assert bodies == [f.PlanAccepted(id=str(i)) for i in range(3)]
            assert all_in.is_set()

    _run(main)


def test_error_reply_raises_remote_error() -> None:
    """An `Error` reply raises `RemoteError` carrying the frame's code and message."""

    async def main() -> None:
        async with _net() as net:
            net.router(_replying(lambda env: f.Error(code=ErrorCode.NOT_FOUND, message="no p9")))
            dealer = net.dealer("d1")
            with pytest.raises(RemoteError) as info:
                async with asyncio.timeout(DEADLINE_S):
                    await dealer.request(f.CtlPlan(id="p9"), timeout_s=DEADLINE_S)
            assert info.value.code is ErrorCode.NOT_FOUND
            assert info.value.message == "no p9"

    _run(main)


# --- failures of delivery ------------------------------------------------------------------------


def test_request_to_unconnected_router_peer_is_peer_down_at_once() -> None:
    """ROUTER_MANDATORY: a request to a routing id with no connection raises PeerDown at once
    (long before its timeout) and leaves nothing pending."""

    async def main() -> None:
        async with _net() as net:
            router = net.router()
            with pytest.raises(PeerDown) as info:
                async with asyncio.timeout(DEADLINE_S):
                    await router.request(f.Ack(), to=b"ghost", timeout_s=3600.0)
            assert info.value.peer == "ghost"
            assert "ghost" in str(info.value)
            assert router._pending == {}

    _run(main)


def test_send_to_unconnected_router_peer_is_peer_down() -> None:
    """A one-way send to a routing id with no connection raises PeerDown synchronously."""

    async def main() -> None:
        async with _net() as net:
            router = net.router()
            with pytest.raises(PeerDown):
                router.send(f.Ack(), to=b"ghost")

    _run(main)


def test_request_without_reply_times_out() -> None:
    """A request nobody answers raises CallTimeout after its timeout and is no longer pending."""

    async def main() -> None:
        async with _net() as net:
            calls: list[f.Envelope] = []
            net.router(_replying(lambda env: None, calls))
            dealer = net.dealer("d1")
            with pytest.raises(CallTimeout) as info:
                async with asyncio.timeout(DEADLINE_S):
                    await dealer.request(f.CtlStatus(), timeout_s=0.05)
            assert "CtlStatus" in str(info.value)
            assert "0.05" in str(info.value)
            assert dealer._pending == {}
            assert len(calls) == 1

    _run(main)


def test_a_finished_request_leaves_no_timer_and_nothing_pending() -> None:
    """A request answered, and one cancelled by its caller, leave nothing pending and no live
    timer on the loop (each request's deadline is a timer handle it must cancel)."""

    async def main() -> None:
        async with _net() as net:
            net.router(_replying(lambda env: f.Ack() if env.id.endswith(".1") else None))
            dealer = net.dealer("d1")
            loop = asyncio.get_running_loop()

            def live_timers() -> int:
                return sum(not h.cancelled() for h in loop._scheduled)  # type: ignore[attr-defined]

            before = live_timers()
            assert await dealer.request(f.CtlStatus(), timeout_s=30.0) == f.Ack()
            waiting = asyncio.ensure_future(dealer.request(f.CtlStatus(), timeout_s=30.0))
            async with asyncio.timeout(DEADLINE_S):
                while not dealer._pending:  # one turn of the loop: the task sends, then waits
                    await asyncio.sleep(0)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert dealer._pending == {}
            assert live_timers() == before

    _run(main)


def test_late_reply_is_counted_stale_and_dropped() -> None:
    """A reply that arrives after its request timed out is counted in stale_replies and dropped;
    the endpoint still serves the next request."""

    async def main() -> None:
        async with _net() as net:
            held: list[tuple[bytes | None, f.Envelope]] = []

            def handler(ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
                if isinstance(env.body, f.CtlStatus):
                    held.append((peer, env))  # answered late, by the test
                else:
                    ep.reply(env, peer, f.Ack())

            router = net.router(handler)
            dealer = net.dealer("d1")
            with pytest.raises(CallTimeout):
                async with asyncio.timeout(DEADLINE_S):
                    await dealer.request(f.CtlStatus(), timeout_s=0.05)
            [(peer, late)] = held
            router.reply(late, peer, f.PlanAccepted(id="late"))
            # The next reply travels the same pipe after the late one, so once it is in, the late
            # one has been handled.
            async with asyncio.timeout(DEADLINE_S):
                assert await dealer.request(f.CtlStop(), timeout_s=DEADLINE_S) == f.Ack()
            assert dealer.stale_replies == 1
            assert dealer.bad_frames == 0

    _run(main)


def test_fail_pending_fails_all_pending_requests() -> None:
    """fail_pending(None, exc) fails every pending request with exactly that exception."""

    async def main() -> None:
        async with _net() as net:
            arrived = asyncio.Event()
            seen: list[f.Envelope] = []

            def handler(ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
                seen.append(env)
                if len(seen) == 2:
                    arrived.set()

            net.router(handler)
            dealer = net.dealer("d1")
            calls = [
                asyncio.create_task(dealer.request(f.CtlStatus(), timeout_s=DEADLINE_S))
                for _ in range(2)
            ]
            async with asyncio.timeout(DEADLINE_S):
                await arrived.wait()
            boom = PeerDown("router")
            dealer.fail_pending(None, boom)
            async with asyncio.timeout(DEADLINE_S):
                results = await asyncio.gather(*calls, return_exceptions=True)
            assert results == [boom, boom]
            assert dealer._pending == {}

    _run(main)


def test_fail_pending_only_fails_requests_to_that_peer() -> None:
    """fail_pending(peer, exc) on a ROUTER fails the requests addressed to `peer` and leaves the
    ones to other peers pending."""

    async def main() -> None:
        async with _net() as net:
            arrived = {name: asyncio.Event() for name in ("d1", "d2")}

            def silent(name: str) -> Handler:
                def handler(ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
                    arrived[name].set()

                return handler

            router = net.router()
            d1 = net.dealer("d1", silent("d1"))
            d2 = net.dealer("d2", silent("d2"))
            await _routed(router, d1)
            await _routed(router, d2)
            to_d1 = asyncio.create_task(router.request(f.Ack(), to=b"d1", timeout_s=DEADLINE_S))
            to_d2 = asyncio.create_task(router.request(f.Ack(), to=b"d2", timeout_s=DEADLINE_S))
            async with asyncio.timeout(DEADLINE_S):
                await arrived["d1"].wait()
                await arrived["d2"].wait()
            gone = PeerDown("d1")
            router.fail_pending(b"d1", gone)
            async with asyncio.timeout(DEADLINE_S):
                with pytest.raises(PeerDown) as info:
                    await to_d1
            assert info.value is gone
            assert not to_d2.done()
            router.fail_pending(b"d2", PeerDown("d2"))
            async with asyncio.timeout(DEADLINE_S):
                with pytest.raises(PeerDown):
                    await to_d2

    _run(main)


def test_close_fails_pending_requests_with_peer_down() -> None:
    """Closing an endpoint fails its pending requests with PeerDown instead of leaving them."""

    async def main() -> None:
        async with _net() as net:
            arrived = asyncio.Event()
            net.router(lambda ep, peer, env: arrived.set())
            dealer = net.dealer("d1")
            call = asyncio.create_task(dealer.request(f.CtlStatus(), timeout_s=DEADLINE_S))
            async with asyncio.timeout(DEADLINE_S):
                await arrived.wait()
            dealer.close()
            net.endpoints.remove(dealer)
            with pytest.raises(PeerDown):
                async with asyncio.timeout(DEADLINE_S):
                    await call

    _run(main)


# --- refusals ------------------------------------------------------------------------------------


def test_garbage_from_raw_dealer_is_answered_bad_frame() -> None:
    """Garbage bytes are answered with an Error(bad_frame) frame, counted in bad_frames, and the
    endpoint keeps serving well-formed requests."""

    async def main() -> None:
        async with _net() as net:
            calls: list[f.Envelope] = []
            router = net.router(_replying(lambda env: f.Ack(), calls))
            raw = net.raw_dealer()
            raw.send(b"\xc1\xc1 this is not msgpack")
            async with asyncio.timeout(DEADLINE_S):
                [data] = await _recv_raw(raw)
            env = Codec().decode(data)
            assert isinstance(env.body, f.Error)
            assert env.body.code is ErrorCode.BAD_FRAME
            assert env.sender == "router"
            assert env.corr is None
            assert calls == []

            dealer = net.dealer("d1")
            async with asyncio.timeout(DEADLINE_S):
                assert await dealer.request(f.CtlStatus(), timeout_s=DEADLINE_S) == f.Ack()
            assert router.bad_frames == 1
            assert len(calls) == 1

    _run(main)


def test_version_skew_from_raw_dealer_is_answered_version_skew() -> None:
    """A well-formed frame of an unsupported protocol version is answered with version_skew."""

    async def main() -> None:
        async with _net() as net:
            calls: list[f.Envelope] = []
            router = net.router(_replying(lambda env: f.Ack(), calls))
            raw = net.raw_dealer()
            env = f.Envelope(
                v=PROTOCOL_VERSION + 1,
                id="raw.1.1",
                corr=None,
                sender="raw",
                gen=1,
                ttl_s=None,
                dest_gen=None,
                body=f.Ack(),
            )
            raw.send(Codec().encode(env))
            async with asyncio.timeout(DEADLINE_S):
                [data] = await _recv_raw(raw)
            reply = Codec().decode(data)
            assert isinstance(reply.body, f.Error)
            assert reply.body.code is ErrorCode.VERSION_SKEW
            assert router.bad_frames == 1
            assert calls == []

    _run(main)


def test_stale_generation_is_refused_without_calling_handler() -> None:
    """A frame whose dest_gen is not the endpoint's generation is answered stale_generation and
    never reaches the handler; the matching generation does."""

    async def main() -> None:
        async with _net() as net:
            calls: list[f.Envelope] = []
            router = net.router(_replying(lambda env: f.Ack(), calls), generation=7)
            dealer = net.dealer("d1")
            with pytest.raises(RemoteError) as info:
                async with asyncio.timeout(DEADLINE_S):
                    await dealer.request(f.CtlStop(), timeout_s=DEADLINE_S, dest_gen=6)
            assert info.value.code is ErrorCode.STALE_GENERATION
            assert "6" in info.value.message
            assert "7" in info.value.message
            assert calls == []
            async with asyncio.timeout(DEADLINE_S):
                body = await dealer.request(f.CtlStop(), timeout_s=DEADLINE_S, dest_gen=7)
            assert body == f.Ack()
            assert [type(env.body) for env in calls] == [f.CtlStop]
            assert router.bad_frames == 0

    _run(main)


def test_handler_exception_is_answered_internal_and_serving_continues() -> None:
    """A handler that raises gets its request answered with an `internal` Error naming the
    exception, and the endpoint keeps dispatching later frames."""

    async def main() -> None:
        async with _net() as net:

            def answer(env: f.Envelope) -> f.Body:
                if isinstance(env.body, f.CtlStop):
                    raise RuntimeError("handler bug")
                return f.Ack()

            router = net.router(_replying(answer))
            dealer = net.dealer("d1")
            with pytest.raises(RemoteError) as info:
                async with asyncio.timeout(DEADLINE_S):
                    await dealer.request(f.CtlStop(), timeout_s=DEADLINE_S)
            assert info.value.code is ErrorCode.INTERNAL
            assert info.value.message == "RuntimeError: handler bug"
            assert router.internal_errors == 1
            async with asyncio.timeout(DEADLINE_S):
                assert await dealer.request(f.CtlStatus(), timeout_s=DEADLINE_S) == f.Ack()
            assert router.internal_errors == 1

    _run(main)


UNENCODABLE = f.ToolResult(value={"name": "caf\udce9.txt"})
"""A reply msgpack cannot encode: the str `os.fsdecode` makes of the name b"caf\xe9.txt"."""


def test_a_reply_that_cannot_be_encoded_is_answered_internal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handler whose reply cannot be encoded (a lone surrogate) gets its request answered
    `internal` naming `UnicodeEncodeError`, counted and logged, and serving goes on."""

    async def main() -> None:
        async with _net() as net:

            def answer(env: f.Envelope) -> f.Body:
                return UNENCODABLE if isinstance(env.body, f.CtlStop) else f.Ack()

            router = net.router(_replying(answer))
            dealer = net.dealer("d1")
            with pytest.raises(RemoteError) as info:
                async with asyncio.timeout(DEADLINE_S):
                    await dealer.request(f.CtlStop(), timeout_s=DEADLINE_S)
            assert info.value.code is ErrorCode.INTERNAL
            assert info.value.message.startswith("UnicodeEncodeError: ")
            assert router.internal_errors == 1
            async with asyncio.timeout(DEADLINE_S):
                assert await dealer.request(f.CtlStatus(), timeout_s=DEADLINE_S) == f.Ack()

    _run(main)
    assert "serving CtlStop failed sending its ToolResult reply" in caplog.text


@pytest.mark.parametrize(
    ("work", "code", "message", "counted"),
    [
        (ValueError("task bug"), ErrorCode.INTERNAL, "ValueError: task bug", 1),
        (UNENCODABLE, ErrorCode.INTERNAL, "UnicodeEncodeError: ", 1),
        (RemoteError(ErrorCode.NOT_FOUND, "no such thing"), ErrorCode.NOT_FOUND, "no such", 0),
        (GitError(["diff"], 1, "fatal: caf\udce9"), ErrorCode.GIT, "git diff failed: fatal", 0),
    ],
    ids=["exception", "unencodable", "typed", "typed-surrogate"],
)
def test_a_task_serving_a_request_answers_whatever_it_raises(
    work: BaseException | f.Body, code: ErrorCode, message: str, counted: int
) -> None:
    """`reply_when_done` answers an unexpected exception of its work (or a result that cannot
    be encoded) `internal` with the exception's type, and counts it; a typed error keeps its
    code, uncounted, its message made encodable."""

    async def serve() -> f.Body:
        await asyncio.sleep(0)
        if isinstance(work, BaseException):
            raise work
        return work

    async def main() -> None:
        async with _net() as net:
            tasks: set[asyncio.Task[None]] = set()

            def handler(ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
                task = asyncio.get_running_loop().create_task(
                    reply_when_done(ep, peer, env, serve())
                )
                tasks.add(task)

            router = net.router(handler)
            dealer = net.dealer("d1")
            with pytest.raises(RemoteError) as info:
                async with asyncio.timeout(DEADLINE_S):
                    await dealer.request(f.CtlStatus(), timeout_s=DEADLINE_S)
            assert info.value.code is code
            assert info.value.message.startswith(message)
            assert router.internal_errors == counted
            assert all(task.done() and task.exception() is None for task in tasks)

    _run(main)


# --- draining ------------------------------------------------------------------------------------


def test_many_queued_messages_are_all_drained() -> None:
    """1,000 one-way frames queued before the receiving loop wakes are all dispatched, in order,
    from one edge of the socket's FD."""

    async def main() -> None:
        async with _net() as net:
            total = 1000
            got: list[str] = []
            all_in = asyncio.Event()

            def handler(ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
                got.append(env.id)
                if len(got) == total:
                    all_in.set()

            net.router(handler)
            dealer = net.dealer("d1")
            beat = f.Heartbeat(loop_lag_p50_ms=1.0, loop_lag_p99_ms=2.0, loop_lag_max_ms=3.0)
            sent = [dealer.send(beat) for _ in range(total)]  # no await: all queued at once
            async with asyncio.timeout(DEADLINE_S):
                await all_in.wait()
            assert got == sent

    _run(main)


# --- known bugs ----------------------------------------------------------------------------------


class SkewedCodec(Codec):
    """A codec of a peer that speaks only protocol version `v`, and counts what it decodes."""

    def __init__(self, v: int, *, flood_at: int) -> None:
        super().__init__()
        self.v = v
        self.seen = 0
        self.flood_at = flood_at
        self.flooded = asyncio.Event()

    def encode(self, env: f.Envelope) -> bytes:
        return super().encode(msgspec.structs.replace(env, v=self.v))

    def decode(self, data: bytes | memoryview) -> f.Envelope:
        self.seen += 1
        if self.seen >= self.flood_at:
            self.flooded.set()
        env = msgspec.msgpack.decode(data, type=f.Envelope)
        if env.v != self.v:
            raise ProtocolError(ErrorCode.VERSION_SKEW, f"speaks {env.v}, not {self.v}")
        return env


def test_refused_frames_are_not_echoed_forever() -> None:
    """Two endpoints with disjoint protocol versions exchange a bounded number of refusals, not an
    endless ping-pong of Error frames."""

    async def main() -> None:
        async with _net() as net:
            router = net.router(lambda ep, peer, env: None)
            skewed = SkewedCodec(PROTOCOL_VERSION + 1, flood_at=50)
            dealer = net.dealer("d1", codec=skewed)
            dealer.send(f.Ack())
            # A deadline, not a synchronisation point: the flood, if any, shows up in microseconds.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await skewed.flooded.wait()
            assert skewed.seen < 50, (router.bad_frames, dealer.bad_frames)

    _run(main)


# --- caller identity -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("localhost:0:0:26655", PeerCredentials(uid=0, gid=0, pid=26655)),
        ("localhost:1000:100:7", PeerCredentials(uid=1000, gid=100, pid=7)),
        ("localhost:4294967294:4294967294:1", PeerCredentials(4294967294, 4294967294, 1)),
        ("127.0.0.1", None),  # a tcp:// peer: an address, no credentials
        ("localhost:0:0", None),
        ("localhost:0:0:1:2", None),
        ("localhost:-1:0:1", None),
        ("localhost:+1:0:1", None),
        ("localhost: 1:0:1", None),
        ("localhost::0:1", None),
        ("localhost:0:0:\u0661", None),  # ARABIC-INDIC DIGIT ONE: isdigit() but not ASCII
        ("otherhost:0:0:1", None),
        ("", None),
        (None, None),
        (b"localhost:0:0:1", None),
    ],
)
def test_parse_peer_address(address: object, expected: PeerCredentials | None) -> None:
    """Only `localhost:<uid>:<gid>:<pid>` in ASCII decimals is an identity; the rest is none."""
    assert parse_peer_address(address) == expected


def test_a_message_with_no_peer_address_has_no_credentials() -> None:
    """`inproc://` messages have no `Peer-Address` property at all: no identity, no error."""
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        pull.bind("inproc://nopeer")
        push.connect("inproc://nopeer")
        push.send(b"x")
        assert pull.poll(int(DEADLINE_S * 1000))
        assert frame_caller(pull.recv(copy=False)) is None
    finally:
        push.close(linger=0)
        pull.close(linger=0)
        ctx.term()


def _recording_caller(seen: list[PeerCredentials | None]) -> Handler:
    def handler(ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
        seen.append(ep.caller)
        ep.reply(env, peer, f.Ack())

    return handler


def test_needs_caller_handler_sees_the_connection_credentials_over_ipc(tmp_path: Path) -> None:
    """Over a real `ipc://` socket a `needs_caller` handler sees this process's uid, gid and
    pid, whatever the frame says; `caller` is None again once the handler returns."""

    async def main() -> None:
        async with _net(f"ipc://{tmp_path / 'ctl.ipc'}") as net:
            seen: list[PeerCredentials | None] = []
            router = net.router(needs_caller(_recording_caller(seen)))
            assert router.reads_caller
            dealer = net.dealer("uid-4242")  # a name is not an identity
            async with asyncio.timeout(DEADLINE_S):
                assert await dealer.request(f.CtlStatus(), timeout_s=DEADLINE_S) == f.Ack()
                assert await dealer.request(f.CtlStatus(), timeout_s=DEADLINE_S) == f.Ack()
            me = PeerCredentials(uid=os.getuid(), gid=os.getgid(), pid=os.getpid())
            assert seen == [me, me]
            assert router.caller is None

    _run(main)


def test_unmarked_handler_gets_no_caller_over_ipc(tmp_path: Path) -> None:
    """An endpoint whose handler is not marked (the relay's) receives plain bytes: no caller,
    even on `ipc://` where one could be read."""

    async def main() -> None:
        async with _net(f"ipc://{tmp_path / 'relay.ipc'}") as net:
            seen: list[PeerCredentials | None] = []
            router = net.router(_recording_caller(seen))
            assert not router.reads_caller
            dealer = net.dealer("d1")
            async with asyncio.timeout(DEADLINE_S):
                assert await dealer.request(f.CtlStatus(), timeout_s=DEADLINE_S) == f.Ack()
            assert seen == [None]

    _run(main)


def test_needs_caller_over_inproc_is_served_without_a_caller() -> None:
    """A marked handler behind `inproc://` is still served; it just has no identity to see."""

    async def main() -> None:
        async with _net() as net:
            seen: list[PeerCredentials | None] = []
            net.router(needs_caller(_recording_caller(seen)))
            dealer = net.dealer("d1")
            async with asyncio.timeout(DEADLINE_S):
                assert await dealer.request(f.CtlStatus(), timeout_s=DEADLINE_S) == f.Ack()
            assert seen == [None]

    _run(main)


def test_caller_is_cleared_when_the_handler_raises(tmp_path: Path) -> None:
    """A handler that raises leaves no stale caller behind for whatever runs next."""

    async def main() -> None:
        async with _net(f"ipc://{tmp_path / 'ctl.ipc'}") as net:

            @needs_caller
            def handler(ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
                assert ep.caller is not None
                raise RuntimeError("handler bug")

            router = net.router(handler)
            dealer = net.dealer("d1")
            with pytest.raises(RemoteError) as info:
                async with asyncio.timeout(DEADLINE_S):
                    await dealer.request(f.CtlStatus(), timeout_s=DEADLINE_S)
            assert "handler bug" in info.value.message
            assert router.caller is None

    _run(main)


# --- sizes and connections (issue 24) ------------------------------------------------------------


def test_an_oversized_request_is_answered_too_large_with_its_id() -> None:
    """A request over the frame limit (under the socket's) is answered `Error(too_large)`
    correlated with its id, so the caller's `request` raises at once rather than time out; the
    handler never sees it."""

    async def main() -> None:
        async with _net() as net:
            calls: list[f.Envelope] = []
            router = Endpoint(
                net.ctx,
                zmq.ROUTER,
                name="router",
                generation=1,
                codec=Codec(max_bytes=1000),
                handler=_replying(lambda env: f.Ack(), calls),
            )
            net.endpoints.append(router)
            router.bind(net.addr)
            router.start()
            dealer = net.dealer("d1")
            with pytest.raises(RemoteError) as info:
                async with asyncio.timeout(DEADLINE_S):
                    await dealer.request(f.Reject(reason="x" * 2000), timeout_s=DEADLINE_S)
            assert info.value.code is ErrorCode.TOO_LARGE
            assert "over the limit of 1,000 bytes" in info.value.message
            assert calls == [] and router.bad_frames == 1

    _run(main)


def test_an_answer_over_the_limit_becomes_a_too_large_error() -> None:
    """A handler whose answer would be over the frame limit: the caller gets `Error(too_large)`
    naming the answer's type, never silence."""

    async def main() -> None:
        async with _net() as net:
            router = Endpoint(
                net.ctx,
                zmq.ROUTER,
                name="router",
                generation=1,
                codec=Codec(max_bytes=1000),
                handler=_replying(lambda env: f.Reject(reason="x" * 2000)),
            )
            net.endpoints.append(router)
            router.bind(net.addr)
            router.start()
            dealer = net.dealer("d1")
            with pytest.raises(RemoteError) as info:
                async with asyncio.timeout(DEADLINE_S):
                    await dealer.request(f.CtlStatus(), timeout_s=DEADLINE_S)
            assert info.value.code is ErrorCode.TOO_LARGE
            assert "Reject" in info.value.message

    _run(main)


def test_a_refusal_that_does_not_fit_either_is_dropped_once() -> None:
    """An answer over the limit whose `too_large` refusal is over it too (a `corr` echoing a
    long id, here under a 170-byte limit): the endpoint drops it after one try instead of
    refusing its refusal again, and goes on serving (the caller times out)."""

    async def main() -> None:
        async with _net() as net:
            router = Endpoint(
                net.ctx,
                zmq.ROUTER,
                name="router",
                generation=1,
                codec=Codec(max_bytes=170),  # the request fits (~156 bytes), the refusal not
                handler=_replying(lambda env: f.Reject(reason="x" * 400)),
            )
            net.endpoints.append(router)
            router.bind(net.addr)
            router.start()
            dealer = net.dealer("d" * 60)  # a long sender: the refusal's `corr` echoes it
            with pytest.raises(CallTimeout):
                await dealer.request(f.CtlStatus(), timeout_s=0.5)
            assert router.internal_errors == 0  # no RecursionError became `internal`

    _run(main)


def test_send_refuses_a_frame_over_the_limit() -> None:
    """`send` of a frame over the limit raises `ProtocolError(too_large)` and sends nothing."""

    async def main() -> None:
        async with _net() as net:
            calls: list[f.Envelope] = []
            net.router(_replying(lambda env: f.Ack(), calls))
            dealer = net.dealer("d1", codec=Codec(max_bytes=1000))
            with pytest.raises(ProtocolError) as info:
                dealer.send(f.Reject(reason="x" * 2000))
            assert info.value.code is ErrorCode.TOO_LARGE
            async with asyncio.timeout(DEADLINE_S):
                assert await dealer.request(f.CtlStatus(), timeout_s=DEADLINE_S) == f.Ack()
            assert len(calls) == 1

    _run(main)


def test_a_needs_caller_handler_sees_each_connections_descriptor(tmp_path: Path) -> None:
    """Over `ipc://` each connection's frames carry its own descriptor (`Endpoint.connection`),
    the same for every frame of one connection; it is None once the handler returns and over
    `inproc://`."""

    async def main() -> None:
        seen: list[int | None] = []

        @needs_caller
        def handler(ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
            seen.append(ep.connection)
            ep.reply(env, peer, f.Ack())

        async with _net(f"ipc://{tmp_path / 'ctl.ipc'}") as net:
            router = net.router(handler)
            one, two = net.dealer("d1"), net.dealer("d2")
            async with asyncio.timeout(DEADLINE_S):
                for dealer in (one, two, one):
                    assert await dealer.request(f.CtlStatus(), timeout_s=DEADLINE_S) == f.Ack()
            assert router.connection is None
        assert all(isinstance(fd, int) and fd >= 0 for fd in seen)
        assert seen[0] == seen[2] != seen[1]

        del seen[:]
        async with _net() as net:  # inproc://
            net.router(handler)
            async with asyncio.timeout(DEADLINE_S):
                assert await net.dealer("d1").request(f.CtlStatus(), timeout_s=DEADLINE_S)
        assert seen == [None]

    _run(main)

"""Tests for `protocol.connections.ConnectionGuard` and `descriptors` over real `ipc://` sockets:
the bound, the refusal near the open-file limit, the door, and the monitor that never blocks
libzmq. Each test runs its own loop and context; waits are under deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import zmq

from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.connections import REFUSE_BELOW, ConnectionGuard, shut_path
from orchestra_sup.protocol.endpoint import Endpoint, needs_caller
from orchestra_sup.system import descriptors
from orchestra_sup.system.descriptors import Usage

DEADLINE_S = 5.0


class Served:
    """A ROUTER at `path` whose `needs_caller` handler answers `Ack`, or `Error(busy)` on a
    connection its guard refuses, as the ctl service does; and DEALERs connected to it."""

    def __init__(self, path: Path, guard: Callable[[zmq.Socket], ConnectionGuard]):
        self.ctx = zmq.Context()
        self.path = path
        self.router = Endpoint(
            self.ctx, zmq.ROUTER, name="ctl", generation=1, codec=Codec(), handler=self.handle
        )
        self.guard = guard(self.router.sock)
        self.guard.start()
        self.router.bind(f"ipc://{path}")
        self.router.start()
        self.dealers: list[Endpoint] = []
        self.connections: list[int | None] = []

    @needs_caller
    def handle(self, ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
        self.connections.append(ep.connection)
        busy = self.guard.refusal(ep.connection)
        if busy is not None:
            ep.reply(env, peer, f.Error(code=ErrorCode.BUSY, message=busy))
        else:
            ep.reply(env, peer, f.Ack())

    def dealer(self) -> Endpoint:
        ep = Endpoint(
            self.ctx, zmq.DEALER, name=f"d{len(self.dealers)}", generation=1, codec=Codec()
        )
        ep.connect(f"ipc://{self.path}")
        ep.start()
        self.dealers.append(ep)
        return ep

    async def ask(self, dealer: Endpoint, timeout_s: float = DEADLINE_S) -> f.Body:
        return await dealer.request(f.CtlStatus(), timeout_s=timeout_s)

    def close(self) -> None:
        for ep in [*self.dealers, self.router]:
            ep.close()
        self.guard.close()
        self.ctx.term()


@contextlib.asynccontextmanager
async def served(path: Path, **options: object) -> AsyncIterator[Served]:
    def guard(sock: zmq.Socket) -> ConnectionGuard:
        return ConnectionGuard(sock, path, name="ctl", process="the test", **options)  # type: ignore[arg-type]

    net = Served(path, guard)
    try:
        yield net
    finally:
        net.close()


async def until(pred: Callable[[], bool], what: str) -> None:
    """Let the loop run (the guard drains its monitor on it) until `pred()`; fail naming `what`."""
    try:
        async with asyncio.timeout(DEADLINE_S):
            while not pred():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def test_usage_counts_this_processs_descriptors() -> None:
    """`usage` sees a descriptor opened and closed, and the soft limit as getrlimit says."""
    before = descriptors.usage()
    r, w = os.pipe()
    try:
        assert descriptors.usage().open == before.open + 2
    finally:
        os.close(r)
        os.close(w)
    assert descriptors.usage().open == before.open
    assert before.limit == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert Usage(open=1030, limit=1024).free == 0


def test_raise_limit_lifts_the_soft_limit_to_the_hard_one() -> None:
    """A process started with a low soft limit ends with soft == hard; said as (before, now)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(soft, 256)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        assert descriptors.raise_limit() == ((low, hard) if low != hard else (low, low))
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_connections_beyond_the_bound_are_refused_and_counted(tmp_path: Path) -> None:
    """With `max_connections` 2 the third connection's requests are answered busy, saying the
    bound, while the first two are served; once one closes, a new one is served again."""

    async def main() -> None:
        async with served(tmp_path / "ctl.ipc", answers=True, max_connections=lambda: 2) as net:
            first, second, third = net.dealer(), net.dealer(), net.dealer()
            async with asyncio.timeout(DEADLINE_S):
                assert await net.ask(first) == f.Ack()
                assert await net.ask(second) == f.Ack()
                with pytest.raises(RemoteError) as info:
                    await net.ask(third)
                assert await net.ask(first) == f.Ack()  # still served
            assert info.value.code is ErrorCode.BUSY
            assert "at most 2 connections" in info.value.message
            assert net.guard.refused == 1
            assert net.guard.served == 2
            assert len(set(net.connections)) == 3 and None not in net.connections

            first.close()
            net.dealers.remove(first)
            await until(lambda: net.guard.served == 1, "the closed connection to be seen gone")
            async with asyncio.timeout(DEADLINE_S):
                assert await net.ask(net.dealer()) == f.Ack()
            assert net.guard.refused == 1

    asyncio.run(main())


def test_a_connection_near_the_open_file_limit_is_refused(tmp_path: Path) -> None:
    """With fewer than `REFUSE_BELOW` descriptors free (this process's soft limit lowered for
    the test), a new connection is answered busy naming the figures; one already open is still
    served."""

    async def main() -> None:
        async with served(tmp_path / "ctl.ipc", answers=True, shut_below=4) as net:
            early = net.dealer()
            async with asyncio.timeout(DEADLINE_S):
                assert await net.ask(early) == f.Ack()
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (descriptors.usage().open + REFUSE_BELOW // 2, hard)
            )
            try:
                late = net.dealer()
                async with asyncio.timeout(DEADLINE_S):
                    with pytest.raises(RemoteError) as info:
                        await net.ask(late)
                    assert await net.ask(early) == f.Ack()
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            assert info.value.code is ErrorCode.BUSY
            assert "near its open-file limit" in info.value.message
            assert "descriptors in use" in info.value.message
            assert net.guard.refused == 1

    asyncio.run(main())


def test_the_door_shuts_near_the_limit_and_opens_again(tmp_path: Path) -> None:
    """Under `shut_below` free the socket file moves aside: a connection already open is still
    served, a new one finds nothing to connect to; with twice that free it is back, and a new
    connection is served. `closings` counts the shutting."""

    async def main() -> None:
        path = tmp_path / "ctl.ipc"
        async with served(path, shut_below=10) as net:
            early = net.dealer()
            async with asyncio.timeout(DEADLINE_S):
                assert await net.ask(early) == f.Ack()
            net.guard.check(Usage(open=95, limit=100))
            assert net.guard.shut and not path.exists() and shut_path(path).exists()
            net.guard.check(Usage(open=85, limit=100))  # 15 free: not yet twice 10
            assert net.guard.shut
            async with asyncio.timeout(DEADLINE_S):
                assert await net.ask(early) == f.Ack()
            with pytest.raises(FileNotFoundError):
                os.stat(path)
            net.guard.check(Usage(open=80, limit=100))
            assert not net.guard.shut and path.exists() and not shut_path(path).exists()
            async with asyncio.timeout(DEADLINE_S):
                assert await net.ask(net.dealer()) == f.Ack()
            assert net.guard.closings == 1

    asyncio.run(main())


def test_closing_a_shut_guard_leaves_no_shut_file(tmp_path: Path) -> None:
    """A guard closed while its door is shut removes the file it moved aside."""

    async def main() -> None:
        path = tmp_path / "ctl.ipc"
        async with served(path, shut_below=10) as net:
            net.guard.check(Usage(open=100, limit=100))
            assert shut_path(path).exists()
        assert not shut_path(path).exists()

    asyncio.run(main())


def test_an_unread_monitor_never_stalls_libzmq(tmp_path: Path) -> None:
    """1,500 connections accepted while the loop never runs (so the guard reads none of its
    events) are all served: the monitor's pipe has no high-water mark at which libzmq's I/O
    thread would block (it did at about 1,000 events with the default one)."""

    async def main() -> None:
        path = tmp_path / "flood.ipc"
        ctx = zmq.Context()
        router = ctx.socket(zmq.ROUTER)
        router.linger = 0
        guard = ConnectionGuard(router, path, name="flood", process="the test")
        guard.start()
        router.bind(f"ipc://{path}")
        clients = zmq.Context()
        try:
            for i in range(1500):  # no await in here: the loop (and the guard) never runs
                dealer = clients.socket(zmq.DEALER)
                dealer.linger = 0
                dealer.connect(f"ipc://{path}")
                dealer.send(b"hello")
                assert router.poll(int(DEADLINE_S * 1000)), f"stalled at connection {i}"
                router.recv_multipart()
                dealer.close()
        finally:
            router.close()
            guard.close()
            ctx.term()
            clients.term()

    asyncio.run(main())

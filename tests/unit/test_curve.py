"""CURVE on `tcp://` (`protocol.curve`) over real ZeroMQ on 127.0.0.1: the gate admits only the
tree's client keys, names the caller by its key, and counts every refused handshake.

Each test runs its own event loop and context; waits are on conditions under a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import zmq

from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.errors import CallTimeout, ConfigError, TreeUnreachable
from orchestra_sup.protocol import curve
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.endpoint import Caller, Endpoint, KeyIdentity, needs_caller
from orchestra_sup.protocol.keys import (
    ClientKeys,
    Keypair,
    ServerKeys,
    init_keys,
    load_client_keys,
    load_server_keys,
)

DEADLINE_S = 5.0
"""Upper bound for anything that should happen promptly; only reached when a test fails."""
NO_REPLY_S = 1.0
"""How long a refused client waits to prove no reply comes (an admitted one is answered in
milliseconds)."""


async def until(pred: Callable[[], bool], what: str) -> None:
    """Re-check `pred` on the loop until it holds, or fail after `DEADLINE_S`."""
    try:
        async with asyncio.timeout(DEADLINE_S):
            while not pred():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


class Server:
    """A CURVE ROUTER on 127.0.0.1 behind a `Gate`, answering every request with `Ack` and
    recording who the connection said sent it."""

    def __init__(self, ctx: zmq.Context, keys: ServerKeys) -> None:
        self.seen: list[Caller | None] = []
        self.gate = curve.Gate(ctx, keys)
        self.gate.start()

        @needs_caller
        def handle(ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
            self.seen.append(ep.caller)
            ep.reply(env, peer, f.Ack())

        self.ep = Endpoint(ctx, zmq.ROUTER, name="srv", generation=1, codec=Codec(), handler=handle)
        self.ep.bind("tcp://127.0.0.1:*", keys)
        self.gate.watch(self.ep.sock)
        self.ep.start()
        self.addr = self.ep.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def close(self) -> None:
        self.gate.close()
        self.ep.close()


def client(ctx: zmq.Context, addr: str, keys: ClientKeys | None) -> Endpoint:
    ep = Endpoint(ctx, zmq.DEALER, name="cli", generation=1, codec=Codec(), identity="cli")
    if keys is None:
        ep.sock.connect(addr)  # around `curve.connect`, as a plain tcp peer would
    else:
        ep.connect(addr, keys)
    ep.start()
    return ep


def run(
    test: Callable[[zmq.Context, Server, Path], Coroutine[Any, Any, None]], tmp_path: Path
) -> None:
    init_keys(tmp_path / "keys", ["operator"])

    async def main() -> None:
        ctx = zmq.Context()
        server = Server(ctx, load_server_keys(tmp_path / "keys"))
        try:
            await test(ctx, server, tmp_path)
        finally:
            server.close()
            ctx.destroy(linger=0)

    asyncio.run(main())


def test_an_allowed_key_gets_through_and_is_the_caller(tmp_path: Path) -> None:
    """The operator's keypair is admitted, and the handler sees `KeyIdentity("operator")`."""

    async def test(ctx: zmq.Context, server: Server, tmp: Path) -> None:
        cli = client(ctx, server.addr, load_client_keys(tmp / "keys", "operator"))
        try:
            assert await cli.request(f.CtlStatus(), timeout_s=DEADLINE_S) == f.Ack()
        finally:
            cli.close()
        assert server.seen == [KeyIdentity(name="operator")]
        assert (server.gate.admitted, server.gate.denied, server.gate.refused) == (1, 0, 0)

    run(test, tmp_path)


def test_a_plain_tcp_peer_is_refused_at_the_handshake(tmp_path: Path) -> None:
    """A peer without CURVE fails the greeting: counted, and its request never reaches the
    handler nor gets an answer."""

    async def test(ctx: zmq.Context, server: Server, tmp: Path) -> None:
        cli = client(ctx, server.addr, None)
        try:
            with pytest.raises(CallTimeout):
                await cli.request(f.CtlStatus(), timeout_s=NO_REPLY_S)
        finally:
            cli.close()
        await until(lambda: server.gate.refused >= 1, "the refusal to be counted")
        assert server.seen == []
        assert server.gate.admitted == 0

    run(test, tmp_path)


@pytest.mark.parametrize("wrong", ["client key", "server key"])
def test_a_peer_with_a_wrong_key_is_refused(tmp_path: Path, wrong: str) -> None:
    """A client key the tree does not allow is denied by the gate; a client pinning another
    server key never completes the handshake: either way the handler hears nothing and the
    server counts the refusal."""

    async def test(ctx: zmq.Context, server: Server, tmp: Path) -> None:
        right = load_client_keys(tmp / "keys", "operator")
        public, secret = zmq.curve_keypair()
        if wrong == "client key":
            keys = ClientKeys(right.server_public, Keypair(public, secret), "operator")
        else:
            keys = ClientKeys(public, right.client, "operator")
        cli = client(ctx, server.addr, keys)
        try:
            with pytest.raises(CallTimeout):
                await cli.request(f.CtlStatus(), timeout_s=NO_REPLY_S)
        finally:
            cli.close()
        await until(lambda: server.gate.refused >= 1, "the refusal to be counted")
        assert server.seen == []
        assert server.gate.admitted == 0
        assert server.gate.denied >= (1 if wrong == "client key" else 0)

    run(test, tmp_path)


def test_a_ctl_client_refused_before_it_asks_is_told_so(tmp_path: Path) -> None:
    """A refused handshake takes the connection's pipe with it, so a request made after it has
    nothing to queue on: `CtlClient.request` still says the handshake was refused (from its
    monitor), where a blocking send would wait for ever."""

    async def test(ctx: zmq.Context, server: Server, tmp: Path) -> None:
        right = load_client_keys(tmp / "keys", "operator")
        keys = ClientKeys(right.server_public, Keypair(*zmq.curve_keypair()), "operator")
        with CtlClient(tmp, connect=server.addr, keys=keys) as ctl:
            await until(lambda: server.gate.refused >= 1, "the handshake to be refused")
            with pytest.raises(TreeUnreachable, match="refused the CURVE handshake"):
                await asyncio.to_thread(ctl.request, f.CtlStatus(), DEADLINE_S)

    run(test, tmp_path)


def test_tcp_without_keys_is_refused_before_any_socket_call() -> None:
    """`bind` and `connect` refuse a `tcp://` address without keys, with one line; `ipc://`
    and `inproc://` need none."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    try:
        with pytest.raises(ConfigError, match="needs CURVE keys"):
            curve.bind(sock, "tcp://127.0.0.1:*")
        with pytest.raises(ConfigError, match="needs CURVE keys"):
            curve.connect(sock, "tcp://127.0.0.1:9")
        assert sock.getsockopt_string(zmq.LAST_ENDPOINT) == ""
        curve.bind(sock, "inproc://fine")
        assert not sock.curve_server
    finally:
        sock.close(linger=0)
        ctx.term()

"""A shard's call to the custodian after a PeerDown trusts the roster, not the stale failure."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from orchestra_sup.errors import PeerDown
from orchestra_sup.protocol import frames as f
from orchestra_sup.shards.role import Shard


class RosterSaysUp:
    """The minimum of `Node` that `Shard._custodian` uses: the custodian died mid-call (the
    first call fails) and its next generation was up before the failed call's task ran again."""

    def __init__(self) -> None:
        self.calls = 0
        self.args = SimpleNamespace(sandboxes="custodian")

    async def call(self, name: str, body: f.Body, *, timeout_s: float) -> f.Body:
        self.calls += 1
        if self.calls == 1:
            raise PeerDown(name)
        return f.Ack()

    def peer_up(self, name: str) -> bool:
        return True


def test_a_custodian_back_before_the_failure_is_seen_is_called_again() -> None:
    """The roster already said "up" (the event was set and will not be set again); waiting for
    the event after a stale PeerDown would hang the lane for CUSTODIAN_WAIT_S (seen in chaos
    runs once children restart in milliseconds)."""

    async def go() -> f.Body:
        shard = Shard()
        shard.node = RosterSaysUp()  # type: ignore[assignment]
        async with asyncio.timeout(5):
            return await shard._custodian(f.ListLanes())

    assert asyncio.run(go()) == f.Ack()

"""Membership and leases on a real three-member etcd cluster (issue 21, ADR 0021;
`cluster.etcd`, `cluster.lease`, `cluster.membership`): members SIGKILLed one and two at a
time, a host process SIGKILLed, and what the host and the root each see."""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestra_sup.cluster.etcd import Etcd, EtcdUnavailable
from orchestra_sup.cluster.lease import HostLease
from orchestra_sup.cluster.membership import Membership
from tests.integration.etcd_cluster import EtcdCluster, needs_etcd

pytestmark = [pytest.mark.integration, needs_etcd]

PREFIX = b"/orchestra-sup/test/hosts/"
TTL_S = 3
EVERY_S = 0.5


@pytest.fixture
def cluster(etcd_cluster: EtcdCluster) -> EtcdCluster:
    return etcd_cluster


async def until(check, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        await asyncio.sleep(0.05)


def test_a_watch_from_a_read_sees_each_change_once_across_a_killed_member(
    cluster: EtcdCluster,
) -> None:
    """Read a prefix, watch from the revision after the read at m0, SIGKILL m0 mid-watch: the
    watch goes on at the next member, every change after the read seen once, in order."""

    async def main() -> list[tuple[str, bytes]]:
        async with Etcd(cluster.endpoints) as watcher, Etcd(cluster.endpoints[1:]) as writer:
            await writer.put(PREFIX + b"a", b"1")
            revision, kvs = await watcher.get_prefix(PREFIX)
            assert [(kv.key, kv.value) for kv in kvs] == [(PREFIX + b"a", b"1")]
            seen: list[tuple[str, bytes]] = []

            async def follow() -> None:
                async for event in watcher.watch_prefix(PREFIX, revision + 1):
                    seen.append((event.kind, event.kv.key[len(PREFIX) :]))

            task = asyncio.create_task(follow())
            await writer.put(PREFIX + b"b", b"2")
            await until(lambda: len(seen) == 1, 10, "the first change")
            cluster.kill("m0")
            await writer.delete(PREFIX + b"a")
            await writer.put(PREFIX + b"c", b"3")
            await until(lambda: len(seen) == 3, 20, f"three changes, seen {seen}")
            await asyncio.sleep(0.5)  # a repeat, if any, would arrive now
            task.cancel()
            return seen

    assert asyncio.run(main()) == [("PUT", b"b"), ("DELETE", b"a"), ("PUT", b"c")]


ONE_DOWN_TTL_S = 6
"""The lease of the one-member-down test: when m0 led, the others elect a leader first (an
election timeout of 1 s, more on a loaded machine: CI once saw m1 silent and m2 without a
leader past TTL 3 s minus the margin), and the lease must outlast an election."""


def test_one_member_killed_the_lease_holds(cluster: EtcdCluster) -> None:
    """A host's lease through m0 first: m0 SIGKILLed, the keep-alives go to the others; for two
    leases' time nothing is lost and the registration stays under the same lease."""

    async def main() -> None:
        lost: list[float] = []
        async with Etcd(cluster.endpoints) as etcd, Etcd(cluster.endpoints[1:]) as root:
            lease = HostLease(
                etcd, PREFIX + b"host-a", b"{}", on_lost=lambda: lost.append(time.monotonic()),
                ttl_s=ONE_DOWN_TTL_S, every_s=EVERY_S,
            )  # fmt: skip
            task = asyncio.create_task(lease.run())
            await until(lambda: lease.lease is not None, 10, "joined")
            held = lease.lease
            cluster.kill("m0")
            await asyncio.sleep(2 * ONE_DOWN_TTL_S)
            kv = await root.get(PREFIX + b"host-a")
            assert lost == [] and lease.lease == held
            assert kv is not None and kv.lease == held
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert await root.get(PREFIX + b"host-a") is None  # revoked on the way out

    asyncio.run(main())


def test_quorum_lost_the_host_stops_in_time_and_joins_again_when_it_is_back(
    cluster: EtcdCluster,
) -> None:
    """Two of three members SIGKILLed: no keep-alive is answered, and the host calls `on_lost`
    before etcd's side of its lease could end (the send time of its last answered keep-alive
    plus the TTL). The members back: the host joins under a new lease, and the root's watch
    sees the old registration leave and the new one join."""

    async def main() -> None:
        events: list[str] = []
        lost: list[tuple[float, float]] = []
        joined: list[int] = []
        async with Etcd(cluster.endpoints) as etcd, Etcd(cluster.endpoints) as root_etcd:
            lease: HostLease

            def on_lost() -> None:
                assert lease.renewed_at is None  # it says no lease is held before the call
                lost.append((lease.clock(), last_renewed[0]))  # the lease's own clock

            last_renewed = [0.0]
            lease = HostLease(
                etcd, PREFIX + b"host-a", b"{}", on_lost=on_lost, on_joined=joined.append,
                ttl_s=TTL_S, every_s=EVERY_S,
            )  # fmt: skip
            membership = Membership(
                root_etcd, PREFIX,
                on_join=lambda name, kv: events.append(f"join {name} {kv.lease}"),
                on_leave=lambda name: events.append(f"leave {name}"),
            )  # fmt: skip
            tasks = [asyncio.create_task(lease.run())]
            await until(lambda: joined, 10, "joined")
            tasks.append(asyncio.create_task(_watching(membership)))
            await until(lambda: events == [f"join host-a {joined[0]}"], 10, f"seen: {events}")

            async def track() -> None:
                while True:
                    if lease.renewed_at is not None:
                        last_renewed[0] = lease.renewed_at
                    await asyncio.sleep(0.01)

            tasks.append(asyncio.create_task(track()))
            cluster.kill("m1")
            cluster.kill("m2")
            await until(lambda: lost, 3 * TTL_S, "on_lost")
            lost_at, renewed = lost[0]
            assert lost_at < renewed + TTL_S, (lost_at - renewed, TTL_S)
            await asyncio.to_thread(cluster.start, "m1", "m2")
            await until(lambda: len(joined) == 2, 30, f"joined again: {joined}")
            assert joined[1] != joined[0]
            want = [f"join host-a {joined[0]}", "leave host-a", f"join host-a {joined[1]}"]
            await until(lambda: events == want, 30, f"seen: {events}")
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


async def _watching(membership: Membership) -> None:
    """`membership.run()`, read again after each time no endpoint answered (what the root's
    side does)."""
    while True:
        try:
            await membership.run()
        except EtcdUnavailable:
            await asyncio.sleep(EVERY_S)


HOST = """
import asyncio, sys
from orchestra_sup.cluster.etcd import Etcd
from orchestra_sup.cluster.lease import HostLease

async def main():
    async with Etcd(sys.argv[1].split(",")) as etcd:
        lease = HostLease(etcd, sys.argv[2].encode(), b"{}", on_lost=lambda: None,
                          on_joined=lambda lease: print(lease, flush=True), ttl_s=3, every_s=0.5)
        await lease.run()

asyncio.run(main())
"""


def test_a_host_sigkilled_leaves_within_its_lease(cluster: EtcdCluster) -> None:
    """A host process SIGKILLed, so nothing revokes its lease: etcd ends it and the root's watch
    sees the host leave within the TTL (plus the time an expiry takes to be seen)."""

    async def main() -> None:
        events: list[str] = []
        host = subprocess.Popen(
            [
                sys.executable,
                "-c",
                HOST,
                ",".join(cluster.endpoints),
                (PREFIX + b"host-b").decode(),
            ],
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        )
        try:
            assert host.stdout is not None
            lease_id = int(await asyncio.to_thread(host.stdout.readline))
            async with Etcd(cluster.endpoints) as etcd:
                membership = Membership(
                    etcd, PREFIX,
                    on_join=lambda name, kv: events.append(f"join {name} {kv.lease}"),
                    on_leave=lambda name: events.append(f"leave {name}"),
                )  # fmt: skip
                task = asyncio.create_task(_watching(membership))
                await until(lambda: events == [f"join host-b {lease_id}"], 10, f"seen {events}")
                host.send_signal(signal.SIGKILL)
                killed = time.monotonic()
                await until(lambda: "leave host-b" in events, TTL_S + 5, f"seen {events}")
                assert time.monotonic() - killed >= 1.0  # the lease ran out: not a revoke
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        finally:
            host.kill()
            host.communicate()

    asyncio.run(main())


class Recording(Etcd):
    """An `Etcd` that keeps each write request it sends, to send one again later: what a
    member frozen with the request queued does when it wakes."""

    def __init__(self, endpoints: list[str]) -> None:
        super().__init__(endpoints)
        self.writes: list[tuple[str, dict[str, Any], type[Any]]] = []

    async def _call(self, path, body, kind, timeout_s=None):  # type: ignore[no-untyped-def]
        if path in ("/v3/kv/put", "/v3/kv/txn"):
            self.writes.append((path, copy.deepcopy(body), kind))
        return await super()._call(path, body, kind, timeout_s)


def test_a_late_registration_request_cannot_move_the_key_off_the_lease_kept(
    cluster: EtcdCluster,
) -> None:
    """The host joins under L1, loses it, joins under L2. Its first join's registration
    request, applied by etcd only now (seen with a member SIGSTOPped with it queued), changes
    nothing: the key stays under L2, the lease the host keeps alive. A plain put there moved
    the key to L1, which no one renews: etcd deleted it while the host went on, and the root
    placed its lanes elsewhere."""

    async def main() -> None:
        joined: list[int] = []
        async with Recording(cluster.endpoints) as etcd:
            key = PREFIX + b"host-a"
            lease = HostLease(
                etcd, key, b"{}", on_lost=lambda: None, on_joined=joined.append,
                ttl_s=TTL_S, every_s=EVERY_S,
            )  # fmt: skip
            task = asyncio.create_task(lease.run())
            await until(lambda: joined, 10, "joined")
            first_join = etcd.writes[0]
            await etcd.revoke(joined[0])  # the first lease gone: the host joins again
            await until(lambda: len(joined) == 2, 10, "joined again")
            await etcd._call(*first_join)  # the late request
            kv = await etcd.get(key)
            assert kv is not None and kv.lease == joined[1], (kv, joined)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def test_keys_that_name_no_host_are_ignored_not_merged(cluster: EtcdCluster) -> None:
    """Two registrations whose names are not UTF-8 must not read as one host (decoded with
    replacement they were both "\\ufffd", and one's leave took the other's away)."""

    async def main() -> list[str]:
        events: list[str] = []
        async with Etcd(cluster.endpoints) as etcd:
            for name in (b"\xff", b"\xfe", b"host-c"):
                await etcd.put(PREFIX + name, b"{}")
            membership = Membership(
                etcd, PREFIX, on_join=lambda name, kv: events.append(f"join {name}"),
                on_leave=lambda name: events.append(f"leave {name}"),
            )  # fmt: skip
            task = asyncio.create_task(membership.run())
            await until(lambda: events == ["join host-c"], 10, f"seen {events}")
            await etcd.delete(PREFIX + b"\xff")
            await etcd.put(PREFIX + b"host-d", b"{}")
            await until(lambda: len(events) == 2, 10, f"seen {events}")
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return events

    assert asyncio.run(main()) == ["join host-c", "join host-d"]


def test_a_second_agent_of_one_name_waits_and_takes_nothing_while_the_first_lives(
    cluster: EtcdCluster,
) -> None:
    """Two agents started with one name (an operator's mistake): the second does not move the
    first's registration off its live lease, so the first never runs shards the root no longer
    knows of; once the first's lease is revoked, the second joins. The mutation of taking any
    key (`put_if_lease` on whatever lease it is under) moves the key to the second agent while
    the first goes on, and this test fails."""

    async def main() -> None:
        first_joined: list[int] = []
        second_joined: list[int] = []
        lost: list[str] = []
        key = PREFIX + b"host-a"
        async with Etcd(cluster.endpoints) as etcd:
            first = HostLease(
                etcd, key, b'{"agent": 1}', on_lost=lambda: lost.append("first"),
                on_joined=first_joined.append, ttl_s=TTL_S, every_s=EVERY_S,
            )  # fmt: skip
            one = asyncio.create_task(first.run())
            await until(lambda: first_joined, 10, "the first agent joined")
            second = HostLease(
                etcd, key, b'{"agent": 2}', on_lost=lambda: lost.append("second"),
                on_joined=second_joined.append, ttl_s=TTL_S, every_s=EVERY_S,
            )  # fmt: skip
            two = asyncio.create_task(second.run())
            await asyncio.sleep(2 * TTL_S)  # a lease's worth and more for the second to try
            kv = await etcd.get(key)
            assert kv is not None and (kv.lease, kv.value) == (first_joined[0], b'{"agent": 1}')
            assert second_joined == [] and lost == []
            one.cancel()
            await asyncio.gather(one, return_exceptions=True)  # revoked: the key goes at once
            await until(lambda: second_joined, 10, "the second agent joined")
            kv = await etcd.get(key)
            assert kv is not None and kv.value == b'{"agent": 2}'
            two.cancel()
            await asyncio.gather(two, return_exceptions=True)

    asyncio.run(main())

"""Lanes' fences on a real three-member etcd cluster (`cluster.fences`, ADR 0021): a lane's
token is the revision that created its key under its host's lease, the same for the same
placement, and no longer held once the key goes, by a revoke, a sweep or the lease's end."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from orchestra_sup.cluster.etcd import Etcd, KeyValue
from orchestra_sup.cluster.fences import FenceRefused, Fences
from tests.integration.etcd_cluster import EtcdCluster, needs_etcd

pytestmark = [pytest.mark.integration, needs_etcd]

PREFIX = "/osup-fences/"


def run(cluster: EtcdCluster, body: Callable[[Etcd, Fences], Awaitable[None]]) -> None:
    async def main() -> None:
        async with Etcd(cluster.endpoints) as etcd:
            await body(etcd, Fences(etcd, PREFIX))

    asyncio.run(main())


def test_a_token_is_held_until_its_key_goes(etcd_cluster: EtcdCluster) -> None:
    async def body(etcd: Etcd, fences: Fences) -> None:
        lease = await etcd.grant(30)
        token = await fences.grant("p-t-1", "host-a", lease)
        assert token > 0
        assert await fences.grant("p-t-1", "host-a", lease) == token  # a LaneStart sent again
        assert await fences.holds("p-t-1", "host-a", token)
        assert not await fences.holds("p-t-1", "host-b", token)  # another host's mirror
        assert not await fences.holds("p-t-1", "host-a", token + 1)
        assert not await fences.holds("p-t-1", "host-a", 0)
        await fences.revoke("p-t-1", "host-a")
        assert not await fences.holds("p-t-1", "host-a", token)
        again = await fences.grant("p-t-1", "host-a", lease)  # placed anew: a new token
        assert again > token and not await fences.holds("p-t-1", "host-a", token)

    run(etcd_cluster, body)


def test_a_lease_that_ends_fences_its_hosts_lanes(etcd_cluster: EtcdCluster) -> None:
    """What a partition does: the host's lease ends, etcd deletes its lanes' keys."""

    async def body(etcd: Etcd, fences: Fences) -> None:
        lease = await etcd.grant(30)
        token = await fences.grant("p-t-1", "host-a", lease)
        await etcd.revoke(lease)
        assert not await fences.holds("p-t-1", "host-a", token)

    run(etcd_cluster, body)


def test_a_placement_that_never_started_gives_way(etcd_cluster: EtcdCluster) -> None:
    """The same lane id placed on host-a again under its next lease (it joined again after
    refusing it, `PlanRecord.unplace`): the old key goes and its token is no longer held.
    On host-b it is a key of its own: host-a's is fenced by the coordinator (`LaneFences`)."""

    async def body(etcd: Etcd, fences: Fences) -> None:
        lease_a, lease_next, lease_b = [await etcd.grant(30) for _ in range(3)]
        token_a = await fences.grant("p-t-1", "host-a", lease_a)
        token_next = await fences.grant("p-t-1", "host-a", lease_next)
        assert token_next > token_a
        assert await fences.holds("p-t-1", "host-a", token_next)
        assert not await fences.holds("p-t-1", "host-a", token_a)
        token_b = await fences.grant("p-t-1", "host-b", lease_b)
        assert await fences.holds("p-t-1", "host-b", token_b)
        assert not await fences.holds("p-t-1", "host-a", token_b)
        with pytest.raises(FenceRefused, match="holds no lease"):
            await fences.grant("p-t-2", "host-a", 0)

    run(etcd_cluster, body)


def test_a_sweep_takes_the_keys_of_lanes_not_live(etcd_cluster: EtcdCluster) -> None:
    """Keys of lanes that ended go, and so does the key of a lane live on another host now."""

    async def body(etcd: Etcd, fences: Fences) -> None:
        lease, lease_b = await etcd.grant(30), await etcd.grant(30)
        tokens = {lane: await fences.grant(lane, "host-a", lease) for lane in ("a-1", "b-1")}
        moved = await fences.grant("b-1", "host-b", lease_b)
        assert (
            await fences.sweep(
                lambda lane, host: (lane, host) in {("a-1", "host-a"), ("b-1", "host-b")}
            )
            == 1
        )
        assert await fences.holds("a-1", "host-a", tokens["a-1"])
        assert not await fences.holds("b-1", "host-a", tokens["b-1"])
        assert await fences.holds("b-1", "host-b", moved)

    run(etcd_cluster, body)


def test_a_sweep_leaves_a_key_made_again_since_it_read_it(etcd_cluster: EtcdCluster) -> None:
    """The lane is placed anew between the sweep's read and its delete: the new key stays."""

    async def body(etcd: Etcd, fences: Fences) -> None:
        lease = await etcd.grant(30)
        await fences.grant("a-1", "host-a", lease)
        fresh: list[int] = []
        read = etcd.get_prefix

        async def read_then_replace(prefix: bytes) -> tuple[int, list[KeyValue]]:
            seen = await read(prefix)
            await fences.revoke("a-1", "host-a")
            fresh.append(await fences.grant("a-1", "host-a", lease))
            return seen

        etcd.get_prefix = read_then_replace  # type: ignore[method-assign]
        assert await fences.sweep(lambda lane, host: False) == 0
        assert await fences.holds("a-1", "host-a", fresh[0])

    run(etcd_cluster, body)


def test_the_coordinators_sweep_and_release_delete_what_ended(etcd_cluster: EtcdCluster) -> None:
    """`LaneFences` as the coordinator runs it: its sweep loop (here every 0.2 s) deletes the key
    of a lane not live and keeps a live one's; a release deletes a key at once."""
    from orchestra_sup.cluster.settings import ClusterSettings
    from orchestra_sup.coordinator.fencing import LaneFences

    async def main() -> None:
        lane_fences = LaneFences(ClusterSettings(etcd=tuple(etcd_cluster.endpoints), prefix=PREFIX))
        async with Etcd(etcd_cluster.endpoints) as etcd:
            fences = Fences(etcd, PREFIX)
            lease = await etcd.grant(30)
            live, ended, released = [await fences.grant(n, "host-a", lease) for n in "abc"]
            sweeping = asyncio.create_task(
                lane_fences.run(lambda lane, host: lane == "a", every_s=0.2)
            )
            lane_fences.release("c", "host-a")
            for _ in range(100):
                if not await fences.holds("b", "host-a", ended):
                    break
                await asyncio.sleep(0.1)
            sweeping.cancel()
            await asyncio.gather(sweeping, return_exceptions=True)
            assert sweeping.cancelled(), sweeping  # the loop itself never failed
            assert await fences.holds("a", "host-a", live)
            assert not await fences.holds("b", "host-a", ended)
            assert not await fences.holds("c", "host-a", released)
            assert not lane_fences.unreleased
        await lane_fences.close()

    asyncio.run(main())

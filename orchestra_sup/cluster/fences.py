"""Lanes' fences: one etcd key per lane placed on a host, under that host's lease (ADR 0021).

The coordinator makes `<prefix>lanes/<host>/<lane>` before it sends the lane's `LaneStart`, its
value the host's name, under the lease the host's registration is under. The revision that
created it is the lane's fencing token (`LaneStart.fence`). Each host's lanes are under a
prefix of its own, so an etcd role per host can allow it its own keys only: etcd revokes a
lease only for a user that may write every key under it (etcd-io/etcd#8031), and a host
revokes its lease when it stops. The key goes when

- the host's lease ends (etcd deletes every key under it: the host stopped its lanes a
  keep-alive before, `cluster.lease`), or
- the coordinator places the task again (`revoke`, before the next attempt starts), or
- its lane has ended and the coordinator sweeps the keys of lanes no longer live (`sweep`).

A host's mirror's `SandboxLand` carries the token, and the custodian lands the commit only
while the key exists with that token and names that host (`holds`): a commit of an attempt
cut off by a partition, arriving once the link is back, never lands. Lane ids name attempts
(`PlanRecord.place`), so a key is one attempt's.
"""

from __future__ import annotations

from collections.abc import Callable

from orchestra_sup.cluster.etcd import Etcd
from orchestra_sup.errors import OrchestraError

LANES_KEY = "lanes/"
"""Where, under `[cluster] prefix`, each lane placed on a host has its key."""


class FenceRefused(OrchestraError):
    """A lane's key could not be made for this host and lease (another placement's key stayed
    in the way)."""


class Fences:
    """The lane keys under `prefix` (`[cluster] prefix`) of the cluster `etcd` (open: used
    within its `async with`). Every method raises `EtcdUnavailable` when no member answers
    with a quorum, and `EtcdRefused` when etcd refuses the request."""

    def __init__(self, etcd: Etcd, prefix: str) -> None:
        self.etcd = etcd
        self.prefix = f"{prefix}{LANES_KEY}".encode()

    def key(self, host: str, lane: str) -> bytes:
        return self.prefix + f"{host}/{lane}".encode()

    async def grant(self, lane: str, host: str, lease: int) -> int:
        """Lane `lane`'s key for `host` under `lease`; returns its token (the revision that
        created it). The same lane granted again (its `LaneStart` sent again) gets the same
        token. A key of this lane id on this host under another lease is a placement that
        never started (its shard refused it, `PlanRecord.unplace`): it is deleted, and the key
        made anew. Raises `FenceRefused` for no lease (0), or when that key comes back in the
        way."""
        if lease <= 0:  # a key under no lease would outlive its host
            raise FenceRefused(f"lane {lane}: host {host} holds no lease")
        key = self.key(host, lane)
        for _ in range(2):
            kv = await self.etcd.create(key, host.encode(), lease=lease)
            if kv.value == host.encode() and kv.lease == lease:
                return kv.create_revision
            await self.etcd.delete(key)
        raise FenceRefused(f"lane {lane}: another placement's key stays in etcd")

    async def revoke(self, lane: str, host: str) -> None:
        """Fence lane `lane`'s attempt on `host`: its key goes (nothing when it is already
        gone)."""
        await self.etcd.delete(self.key(host, lane))

    async def holds(self, lane: str, host: str, token: int) -> bool:
        """Whether lane `lane`'s key exists now, names `host`, and was created at `token`: the
        attempt that carries `token` still owns the lane. A linearizable read (through the
        leader), so a key deleted before it is never seen."""
        kv = await self.etcd.get(self.key(host, lane))
        if kv is None or token <= 0:
            return False
        return kv.create_revision == token and kv.value == host.encode()

    async def sweep(self, live: Callable[[str, str], bool]) -> int:
        """Delete the key of every lane for which `live(lane, host)` is False when its turn
        comes (lanes that ended, or that run on another host now, whose keys would otherwise
        stay as long as their host's lease: months); returns how many went. A key made again
        since it was read (its lane placed anew meanwhile) is not the one read, and stays."""
        _revision, kvs = await self.etcd.get_prefix(self.prefix)
        gone = 0
        for kv in kvs:
            host, _, lane = kv.key[len(self.prefix) :].decode(errors="replace").partition("/")
            if not live(lane, host):
                gone += await self.etcd.delete_created(kv.key, kv.create_revision)
        return gone

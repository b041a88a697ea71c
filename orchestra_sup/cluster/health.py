"""How a tree's etcd cluster is doing, as `doctor` says it: each member on its own, and whether
the cluster has a quorum (ADR 0021).

A member is asked for its status alone (no failover): it answers with its version and the
leader it follows, or it does not answer. The quorum is a linearizable read that requires a
leader, with failover: answered, the cluster can renew leases and place lanes on hosts; not,
hosts stop their lanes within their lease and no lane is placed on a host.
"""

from __future__ import annotations

import msgspec

from orchestra_sup.cluster.etcd import Etcd, EtcdRefused, EtcdUnavailable


class MemberHealth(msgspec.Struct, frozen=True):
    """One endpoint: `ok` when it answered; `detail` is its version and leader, or why not."""

    endpoint: str
    ok: bool
    detail: str


class ClusterHealth(msgspec.Struct, frozen=True):
    """Each member's health, and `quorum`: a read that needs a leader was answered (`detail`
    says why not when it was not)."""

    members: list[MemberHealth]
    quorum: bool
    detail: str


async def check(etcd: Etcd, prefix: str) -> ClusterHealth:
    """Ask each of `etcd`'s endpoints for its status, then read `prefix` through the cluster.
    Raises nothing: what failed is in the answer."""
    members = []
    for url in etcd.endpoints:
        try:
            status = await etcd.status(url)
        except (EtcdUnavailable, EtcdRefused) as exc:
            members.append(MemberHealth(endpoint=url, ok=False, detail=str(exc)))
            continue
        leader = f"follows leader {status.leader:x}" if status.leader else "has no leader"
        members.append(MemberHealth(url, True, f"etcd {status.version}, {leader}"))
    try:
        await etcd.get(prefix.encode())
    except (EtcdUnavailable, EtcdRefused) as exc:
        return ClusterHealth(members=members, quorum=False, detail=str(exc))
    return ClusterHealth(members=members, quorum=True, detail="a read that needs a leader")

"""The cluster channel: a host's agent <-> the root supervisor (`Cluster`), over the root's CURVE
`[cluster] listen` endpoint (ADR 0022).

A host's agent opens as a child does, with `Hello(role="host", name=<host>, generation=1, ...)`
answered `HostWelcome` or `Reject`. The root welcomes it only from the connection whose CURVE
key is the one allowed under the host's own name, so a host cannot speak for another, and tells
it the etcd cluster, prefix and lease its registration goes under. Then the agent sends a
`HostReport` every report interval: what it runs and under which etcd lease. The root answers
`Ack`, or `Error(not_found)` when it does not know the host (it restarted since): the agent
then says `Hello` again. Only control crosses this channel (ARCHITECTURE.md §2: the
supervisor is off the data path); lanes' frames go to the host's data address.
"""

from __future__ import annotations

import msgspec

from orchestra_sup.protocol.frames.control import Hello, Reject
from orchestra_sup.protocol.frames.frame import Frame
from orchestra_sup.protocol.frames.values import PeerState

HOST_ROLE = "host"
"""The role a host's agent says in its `Hello`."""


class HostWelcome(Frame, tag="host_welcome"):
    """The root accepts a host's `Hello`: register under `prefix` + "hosts/" + the host's name in
    the etcd cluster at `etcd`, under a lease of `lease_ttl_s` seconds (whole) kept alive every
    `keepalive_s` seconds (ADR 0021). `coordinator` and `custodian` are where the host's
    processes reach those two (`[cluster] coordinator_listen` and `custodian_listen`; a
    wildcard host there means the address the agent joined at)."""

    etcd: list[str]
    prefix: str
    lease_ttl_s: int
    keepalive_s: float
    coordinator: str = ""
    custodian: str = ""


class HostShard(msgspec.Struct, frozen=True, kw_only=True):
    """One shard of a host as its agent's supervisor has it: its name on the host ("shard-0"),
    state (a `supervisor.spec.ChildState` value), generation, process id (None when down),
    live lanes and the lanes it takes at most. `up`, `stopping` and `draining` are as the
    agent's own roster has the shard (`PeerState`): during a rollover's surge the old
    generation stands for it, stopping, until the new one runs; then the new one does, and the
    old one is listed as draining until it retires."""

    name: str
    state: str
    generation: int
    pid: int | None = None
    lanes: int = 0
    capacity: int = 0
    up: bool = False
    stopping: bool = False
    draining: list[int] = []


class HostReport(Frame, tag="host_report"):
    """A host's agent to the root: what the host runs now (answered `RootPeers`, or
    `Error(not_found)` when the root does not know the host).

    `boot` is the agent's run (a new one after every start of it: work placed under an older
    boot is not this run's). `lease` is the etcd lease its registration is under (0 while it
    holds none). `data` is the address its lanes are reached at ("" until it serves one).
    `loop_lag_ms` is the agent's event-loop lag, (p50, p99, max) in milliseconds."""

    boot: str
    shards: list[HostShard]
    capabilities: list[str] = []
    tenants: list[str] = []
    lease: int = 0
    data: str = ""
    loop_lag_ms: tuple[float, float, float] | None = None


class RootPeers(Frame, tag="root_peers"):
    """The root's answer to a `HostReport`: its coordinator and custodian as its roster has
    them (generation, up), which the agent puts in the roster of its own children, at the
    addresses its welcome gave."""

    peers: list[PeerState]


class HostInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One host as the root has it, for `ctl status` and `ctl tree`. `state`: "unregistered"
    while etcd holds no registration of it (not yet, or its lease ended: its lanes are not its
    own any more); "joining" while its last report does not name the lease etcd holds it under
    (it has just taken it, or lost it); else "silent" once no report came for the root's
    `watchdog_s`; else "draining" while `ctl stop-host` drains it (its shards take no new
    lane); else "joined": only then do its shards take lanes. `heard_s` is seconds
    since its last frame, `joined_s` seconds since its `Hello` was welcomed; `lease` is the
    etcd lease its registration is under (0: none). The rest is its last `HostReport` and its
    `Hello`'s version and process id."""

    name: str
    state: str
    boot: str
    version: str
    pid: int
    heard_s: float
    joined_s: float
    shards: list[HostShard] = []
    capabilities: list[str] = []
    tenants: list[str] = []
    lease: int = 0
    data: str = ""


Cluster = Hello | HostWelcome | Reject | HostReport | RootPeers

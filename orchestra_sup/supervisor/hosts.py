"""The hosts that joined the root: who they are, what they run, when last heard (ADR 0022).

A host's agent connects to the root's `[cluster] listen` endpoint (`sockets.RootSockets`), a
CURVE ROUTER where the `curve.Gate` admits hosts' keys only. It says `Hello(role="host",
name=...)`, and `Hosts.handle` welcomes it only when

- the connection's CURVE key is the one allowed under that name (`User-Id` `key:<name>`): a host
  holding host-b's key cannot join as host-a, and
- its protocol range meets the root's (`release.skew`).

An agent sets no routing id: the listener gives each connection one of its own, and the table
keeps the one the `Hello` came on. So no connection can hold a host's name (a routing id a peer
picks is its to squat on: without `ROUTER_HANDOVER` a second connection with it is refused,
and with it libzmq hands the id over before the key is checked, cutting the first off).

Anything else is refused with `Reject` and counted (`refused`). The welcome (`HostWelcome`)
tells the host where to register: the root's etcd cluster, prefix and lease. Its
`HostReport`s then keep its entry: shards, capabilities, tenants, data address. A report from
a connection that was not welcomed, or from a name whose key it does not hold, changes nothing
and is answered `not_found`, which makes an agent say `Hello` again (the root restarted). A
host whose agent restarts says `Hello` again on its new connection and replaces its entry (a
new `boot`).

Whether a host holds its lease is etcd's to say (ADR 0021): `follow` watches the hosts'
registrations (`cluster.membership`), and a host whose registration is gone is "unregistered".

The root's roster lists each host's shards as `host-a/shard-0` (`peers`), up while the host is
registered and its report says the shard runs, at the host's data address. A change of that
list is told to the root (`on_change`), which sends its roster out again. A report is answered
with the root's coordinator and custodian as its roster has them (`RootPeers`): the host's own
children call them at the addresses the welcome gave.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestra_sup.cluster.settings import ClusterSettings, connect
from orchestra_sup.errors import ErrorCode
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.endpoint import Endpoint, KeyIdentity, needs_caller
from orchestra_sup.release import skew
from orchestra_sup.runtime.remote import qualified

if TYPE_CHECKING:  # aiohttp is imported by a root that follows etcd, not by every one
    from orchestra_sup.cluster.etcd import KeyValue
    from orchestra_sup.cluster.membership import Membership

log = logging.getLogger("orchestra_sup.supervisor")

HOSTS_KEY = "hosts/"
"""Where, under `[cluster] prefix`, each host registers as its name."""
LOG_EVERY_S = 10.0
"""At most one line this often of who joined or was refused."""
FORGET_S = 3600.0
"""Seconds after which a host neither heard nor registered leaves the table."""


def shown(name: str) -> str:
    """A name a peer gave, for a line: quoted, cut at 64 characters."""
    return repr(name[:64]) + ("..." if len(name) > 64 else "")


@dataclass(slots=True)
class Host:
    """One welcomed host: its `Hello`, its last `HostReport` (None before the first), when
    (`time.monotonic()` seconds) it was welcomed and last heard, and on which connection."""

    hello: f.Hello
    joined_at: float
    heard_at: float
    peer: bytes | None
    """The routing id of the connection its `Hello` came on: a report on another is not its."""
    report: f.HostReport | None = None


class Hosts:
    """The root's table of hosts, served on the cluster endpoint by `handle` (a `needs_caller`
    handler). `silent_after` gives the seconds of silence after which a host shows "silent"
    (the root's `watchdog_s`), `cluster` the `[cluster]` settings in force; both are read at
    each use. `refused` counts the `Hello`s refused; `registered` is what etcd holds under the
    hosts' prefix, by host name (`follow`)."""

    def __init__(
        self,
        silent_after: Callable[[], float],
        cluster: Callable[[], ClusterSettings],
        root_peers: Callable[[], list[f.PeerState]] = list,
        on_change: Callable[[], None] = lambda: None,
    ):
        self.silent_after = silent_after
        self.cluster = cluster
        self.root_peers = root_peers
        """The root's coordinator and custodian, as its roster has them now."""
        self.on_change = on_change
        """Called when `peers()` changed (a host's shard came, went, or changed generation)."""
        self._published: list[f.PeerState] = []
        self.by_name: dict[str, Host] = {}
        self.registered: dict[str, KeyValue] = {}
        self.refused = 0
        self.draining: set[str] = set()
        """Hosts `ctl stop-host` drains: their shards take no new lane (`drain`)."""
        self._heard = asyncio.Event()
        """Set at each report, for `drained`."""
        self._membership: Membership | None = None
        self._logged_at = -LOG_EVERY_S
        self._unlogged = 0

    async def follow(self) -> None:
        """Keep `registered` as etcd has it, until cancelled (`cluster.membership.Membership`:
        it reads again and retries by itself). Returns at once for a tree no host joins (a
        host's agent's own `[cluster]` names etcd for its lease only)."""
        from orchestra_sup.cluster.membership import Membership  # aiohttp: only with etcd

        settings = self.cluster()
        if not settings.etcd or not settings.listen:
            return
        async with connect(settings) as etcd:
            membership = Membership(
                etcd,
                f"{settings.prefix}{HOSTS_KEY}".encode(),
                on_join=self._registered,
                on_leave=self._unregistered,
            )
            self.registered = membership.hosts  # the same dict: Membership keeps it
            self._membership = membership
            await membership.run()

    def quorum(self) -> bool | None:
        """Whether the root reaches an etcd quorum now (`Membership.answering`); None for a
        tree without etcd, or before the first answer."""
        return self._membership.answering if self._membership is not None else None

    def _registered(self, name: str, kv: KeyValue) -> None:
        log.info("cluster: host %s registered under lease %x", name, kv.lease)
        self._publish()

    def _unregistered(self, name: str) -> None:
        log.warning("cluster: host %s's registration is gone (its lease ended)", name)
        self._publish()

    def peers(self) -> list[f.PeerState]:
        """Every shard of every host that joined, as the root's roster lists it: named
        `<host>/<shard>`, up while the host is registered in etcd, its last report names the
        lease it holds, the root reaches an etcd quorum (issue 21: losing it stops new
        placements on hosts) and the agent's roster has the shard up; stopping and draining as
        there (a rollover on the host) or while the host drains; at the host's data address,
        with the host's capabilities and tenants."""
        out = []
        for name, host in sorted(self.by_name.items()):
            report = host.report
            if report is None or not report.data:
                continue
            # Its lanes are its own only under a lease etcd can vouch for now: without a
            # quorum no registration read is current, and no new lane goes to a host.
            held = self._holds(name, report) and self.quorum() is not False
            for shard in report.shards:
                out.append(
                    f.PeerState(
                        name=qualified(name, shard.name),
                        role="shard",
                        generation=shard.generation,
                        up=held and shard.up,
                        endpoint=report.data,
                        capacity=shard.capacity,
                        capabilities=list(report.capabilities),
                        tenants=list(report.tenants),
                        boot=report.boot,
                        lease=report.lease if held else 0,
                        stopping=shard.stopping or name in self.draining,
                        draining=list(shard.draining),
                    )
                )
        return out

    def drain(self, name: str) -> None:
        """Host `name` takes no new lane: its shards are `stopping` in the roster until it
        says `Hello` again (a new start of its agent)."""
        self.draining.add(name)
        self._publish()

    async def drained(self, name: str, timeout_s: float) -> bool:
        """Whether a report of host `name` heard from now on, within `timeout_s` seconds, says
        its shards run no lane and drain no generation (a rollover's, whose lanes the report
        does not count), True too for a host gone from the table."""
        since = time.monotonic()
        deadline = since + timeout_s
        while True:
            host = self.by_name.get(name)
            if host is None:
                return True
            report = host.report
            idle = report is not None and not any(s.lanes or s.draining for s in report.shards)
            if host.heard_at > since and idle:  # a draining generation holds lanes too
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._heard.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._heard.wait()

    def _holds(self, name: str, report: f.HostReport) -> bool:
        """Whether host `name`'s last report names the lease etcd holds its registration
        under: a host that lost its lease says 0 (or a new one) at once, while etcd may keep
        the old registration for up to a TTL."""
        registration = self.registered.get(name)
        return registration is not None and report.lease == registration.lease != 0

    def _publish(self) -> None:
        peers = self.peers()
        if peers != self._published:
            self._published = peers
            self.on_change()

    @needs_caller
    def handle(self, ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
        caller = ep.caller
        name = caller.name if isinstance(caller, KeyIdentity) else None
        match env.body:
            case f.Hello() as hello:
                self._hello(ep, peer, env, hello, name)
            case f.HostReport() as report if name is not None:
                host = self.by_name.get(name)
                if host is None or host.peer != peer:
                    message = f"host {name!r} has not said Hello to this root"
                    ep.reply(env, peer, f.Error(code=ErrorCode.NOT_FOUND, message=message))
                    return
                host.report, host.heard_at = report, time.monotonic()
                self._heard.set()
                ep.reply(env, peer, f.RootPeers(peers=self.root_peers()))
                self._publish()
            case body:  # a report from a connection with no key, or another frame
                message = f"the cluster endpoint does not serve {type(body).__name__} here"
                ep.reply(env, peer, f.Error(code=ErrorCode.UNEXPECTED, message=message))

    def _hello(
        self, ep: Endpoint, peer: bytes | None, env: f.Envelope, hello: f.Hello, key: str | None
    ) -> None:
        reason: str | None
        if hello.role != f.HOST_ROLE:
            reason = f"the cluster endpoint welcomes hosts, not role {hello.role!r}"
        elif key != hello.name:
            reason = f"host {shown(hello.name)} must connect with its own key, not with {key!r}"
        else:
            reason = skew(shown(hello.name), hello.version[:64], hello.proto_min, hello.proto_max)
        now = time.monotonic()
        if reason is not None:
            self.refused += 1
            self._log(now, logging.WARNING, f"cluster: refused a host: {reason}")
            ep.reply(env, peer, f.Reject(reason=reason))
            return
        was = self.by_name.get(hello.name)
        self.draining.discard(hello.name)  # a new start of its agent: it takes lanes again
        self.by_name[hello.name] = Host(hello=hello, joined_at=now, heard_at=now, peer=peer)
        again = f", again (pid {was.hello.pid} before)" if was is not None else ""
        self._log(now, logging.INFO, f"cluster: host {hello.name} joined (pid {hello.pid}){again}")
        cluster = self.cluster()
        welcome = f.HostWelcome(
            etcd=list(cluster.etcd),
            prefix=f"{cluster.prefix}{HOSTS_KEY}",
            lease_ttl_s=cluster.lease_ttl_s,
            keepalive_s=cluster.keepalive_s,
            coordinator=cluster.coordinator_listen or "",
            custodian=cluster.custodian_listen or "",
        )
        ep.reply(env, peer, welcome)
        self._publish()  # a new boot: its shards' generations begin again

    def _log(self, now: float, level: int, line: str) -> None:
        """`line`, unless one was logged less than `LOG_EVERY_S` ago (a flood of `Hello`s
        would be a flood of lines); then it is counted into the next."""
        if now - self._logged_at < LOG_EVERY_S:
            self._unlogged += 1
            return
        more = f" (and {self._unlogged} more since the last)" if self._unlogged else ""
        log.log(level, "%s%s", line, more)
        self._logged_at, self._unlogged = now, 0

    def infos(self) -> list[f.HostInfo]:
        """Every host that joined, by name, as `ctl status` shows it. A host unregistered and
        not heard for `FORGET_S` is forgotten first: its agent is gone."""
        now, limit = time.monotonic(), self.silent_after()
        for name in [n for n, h in self.by_name.items() if now - h.heard_at > FORGET_S]:
            if name not in self.registered:
                del self.by_name[name]
                self._publish()
        out = []
        for name, host in sorted(self.by_name.items()):
            report = host.report or f.HostReport(boot="", shards=[])
            registration = self.registered.get(name)
            state = "joined" if now - host.heard_at <= limit else "silent"
            if registration is not None and not self._holds(name, report):
                state = "joining"
            elif state == "joined" and name in self.draining:
                state = "draining"
            out.append(
                f.HostInfo(
                    name=name,
                    state=state if registration is not None else "unregistered",
                    boot=report.boot,
                    version=host.hello.version,
                    pid=host.hello.pid,
                    heard_s=round(now - host.heard_at, 3),
                    joined_s=round(now - host.joined_at, 3),
                    shards=report.shards,
                    capabilities=report.capabilities,
                    tenants=report.tenants,
                    lease=registration.lease if registration is not None else 0,
                    data=report.data,
                )
            )
        return out

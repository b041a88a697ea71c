"""The hosts that joined the root: who they are, what they run, when last heard (ADR 0022).

A host's agent connects to the root's `[cluster] listen` endpoint (`sockets.RootSockets`), a
CURVE ROUTER where the `curve.Gate` admits hosts' keys only. It says `Hello(role="host",
name=...)`, and `Hosts.handle` welcomes it only when

- the connection's CURVE key is the one allowed under that name (`User-Id` `key:<name>`): a host
  holding host-b's key cannot join as host-a, and
- its routing id is its name, so the root's requests reach the connection that said it, and
- its protocol range meets the root's (`release.skew`).

Anything else is refused with `Reject` and counted (`refused`). Its `HostReport`s then keep its
entry: shards, capabilities, tenants, lease, data address. A report from a connection that was
not welcomed, or from a name whose key it does not hold, changes nothing. A host whose agent
restarts says `Hello` again and replaces its entry (a new `boot`); the listener hands the name's
routing id to the newest connection (`ROUTER_HANDOVER`).

Whether a host is alive for placement is its etcd lease's to say (ADR 0021); what is here is
what `ctl status` and `ctl tree` show of it, "silent" once nothing came from it for
`silent_after()` seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from orchestra_sup.errors import ErrorCode
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.endpoint import Endpoint, KeyIdentity, needs_caller
from orchestra_sup.release import skew

log = logging.getLogger("orchestra_sup.supervisor")


@dataclass(slots=True)
class Host:
    """One welcomed host: its `Hello`, its last `HostReport` (None before the first), and when
    (`time.monotonic()` seconds) it was welcomed and last heard."""

    hello: f.Hello
    joined_at: float
    heard_at: float
    report: f.HostReport | None = None


class Hosts:
    """The root's table of hosts, served on the cluster endpoint by `handle` (a `needs_caller`
    handler). `silent_after` gives the seconds of silence after which a host shows "silent"
    (the root's `watchdog_s`, read at each look: a reload changes it). `refused` counts the
    `Hello`s refused."""

    def __init__(self, silent_after: Callable[[], float]):
        self.silent_after = silent_after
        self.by_name: dict[str, Host] = {}
        self.refused = 0

    @needs_caller
    def handle(self, ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
        caller = ep.caller
        name = caller.name if isinstance(caller, KeyIdentity) else None
        match env.body:
            case f.Hello() as hello:
                self._hello(ep, peer, env, hello, name)
            case f.HostReport() as report if name is not None and peer == name.encode():
                host = self.by_name.get(name)
                if host is not None:
                    host.report, host.heard_at = report, time.monotonic()
            case f.HostReport():
                pass  # from a connection never welcomed, or not the one its key names
            case body:
                message = f"the cluster endpoint does not serve {type(body).__name__}"
                ep.reply(env, peer, f.Error(code=ErrorCode.UNEXPECTED, message=message))

    def _hello(
        self, ep: Endpoint, peer: bytes | None, env: f.Envelope, hello: f.Hello, key: str | None
    ) -> None:
        reason: str | None
        if hello.role != f.HOST_ROLE:
            reason = f"the cluster endpoint welcomes hosts, not role {hello.role!r}"
        elif key != hello.name:
            reason = f"host {hello.name!r} must connect with its own key, not {key!r}'s"
        elif peer != hello.name.encode():
            reason = f"host {hello.name!r} must connect with routing id {hello.name!r}"
        else:
            reason = skew(hello.name, hello.version, hello.proto_min, hello.proto_max)
        if reason is not None:
            self.refused += 1
            log.warning("cluster: refused a host: %s", reason)
            ep.reply(env, peer, f.Reject(reason=reason))
            return
        now = time.monotonic()
        was = self.by_name.get(hello.name)
        self.by_name[hello.name] = Host(hello=hello, joined_at=now, heard_at=now)
        again = f", again (pid {was.hello.pid} before)" if was is not None else ""
        log.info("cluster: host %s joined (pid %d)%s", hello.name, hello.pid, again)
        ep.reply(env, peer, f.Welcome(generation=hello.generation))

    def infos(self) -> list[f.HostInfo]:
        """Every host that joined, by name, as `ctl status` shows it."""
        now, limit = time.monotonic(), self.silent_after()
        out = []
        for name, host in sorted(self.by_name.items()):
            report = host.report or f.HostReport(boot="", shards=[])
            out.append(
                f.HostInfo(
                    name=name,
                    state="silent" if now - host.heard_at > limit else "joined",
                    boot=report.boot,
                    version=host.hello.version,
                    pid=host.hello.pid,
                    heard_s=round(now - host.heard_at, 3),
                    joined_s=round(now - host.joined_at, 3),
                    shards=report.shards,
                    capabilities=report.capabilities,
                    tenants=report.tenants,
                    lease=report.lease,
                    data=report.data,
                )
            )
        return out

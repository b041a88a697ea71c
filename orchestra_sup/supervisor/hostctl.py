"""What a root's operator asks of a host's agent (issue 21): `ctl restart host-a/shard-0`, and
`ctl stop-host host-a` (drain, then leave).

The root cannot signal a host's processes: it asks the agent, over the agent's own connection to
`[cluster] listen` (the one its `Hello` came on, `Hosts.by_name[...].peer`), and the agent does
it as its own ctl would (`HostLink`). The root's roster names a host's shard `host-a/shard-0`;
the agent knows it as `shard-0`.

`stop-host` first drains: the host's shards stay up but take no new lane (`Hosts.drain`: the
roster says they are stopping), until a report heard since says they run none, or the drain
timeout passes. Then the agent is asked to stop: it stops its shards (a lane still running is
interrupted and runs again elsewhere, as on a lost shard) and revokes its lease, so etcd and
the root see it leave at once. Its unit does not restart it (exit 0).
"""

from __future__ import annotations

import logging

from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.supervisor.views import CtlHost

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 15.0
"""Seconds an agent has to answer a request of its root (a restart waits for the shard)."""


async def ask_host(host: CtlHost, name: str, body: f.Body) -> f.Body:
    """Ask host `name`'s agent `body`: its answer, an `Error` of the agent's as a body. Raises
    `RemoteError(not_found)` for a host that has not joined (or this is not a root that hosts
    join), `PeerDown`/`CallTimeout` when its agent cannot be reached or does not answer."""
    joined = host.hosts.by_name.get(name)
    cluster = host.sockets.cluster
    if joined is None or joined.peer is None or cluster is None:
        known = ", ".join(sorted(host.hosts.by_name)) or "none"
        raise RemoteError(ErrorCode.NOT_FOUND, f"no host {name!r} joined (hosts: {known})")
    try:
        return await cluster.request(body, to=joined.peer, timeout_s=ASK_TIMEOUT_S)
    except RemoteError as exc:
        return f.Error(code=exc.code, message=f"{name}: {exc.message}")


async def stop_host(host: CtlHost, req: f.CtlStopHost) -> f.Body:
    """Drain host `req.name`, then ask its agent to stop (module docstring). Answers what the
    agent answers (`Ack`); raises `RemoteError(bad_request)` for a drain timeout outside
    (0, 3600] seconds, and what `ask_host` raises."""
    drain_s = host.settings.supervisor.drain_timeout_s
    if req.drain_timeout_s is not None:
        if not 0 < req.drain_timeout_s <= 3600:
            raise RemoteError(
                ErrorCode.BAD_REQUEST,
                f"drain timeout {req.drain_timeout_s:g} s: expected seconds in (0, 3600]",
            )
        drain_s = req.drain_timeout_s
    if req.name not in host.hosts.by_name:
        return await ask_host(host, req.name, f.CtlStop())  # not_found, naming the hosts
    host.hosts.drain(req.name)
    log.info("stop-host %s: draining (at most %g s)", req.name, drain_s)
    if not await host.hosts.drained(req.name, drain_s):
        log.warning("stop-host %s: lanes still run after %g s; they stop", req.name, drain_s)
    return await ask_host(host, req.name, f.CtlStop())

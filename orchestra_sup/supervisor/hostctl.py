"""What a root's operator asks of a host's agent (issue 21): `ctl restart host-a/shard-0`,
`ctl rollover host-a` and `ctl stop-host host-a` (drain, then leave).

The root cannot signal a host's processes: it asks the agent, over the agent's own connection to
`[cluster] listen` (the one its `Hello` came on, `Hosts.by_name[...].peer`), and the agent does
it as its own ctl would (`HostLink`). The root's roster names a host's shard `host-a/shard-0`;
the agent knows it as `shard-0`.

`rollover host-a` (each of its shards) or `host-a/shard-0` is run by the agent, surge and drain
as on the root (`supervisor.rollover`; `--release` names an interpreter on the host). Its report
comes back with the host's name put before the rollover's id and each shard's name, so that
`ctl rollover`'s polls of `host-a/<id>` go to the agent too. The agent does not re-execute
itself in place (`seam.pinned`): it moves onto a release when its unit restarts.

`stop-host` first drains: the host's shards stay up but take no new lane (`Hosts.drain`: the
roster says they are stopping), until a report heard since says they run none, or the drain
timeout passes. Then the agent is asked to stop: it stops its shards (a lane still running is
interrupted and runs again elsewhere, as on a lost shard) and revokes its lease, so etcd and
the root see it leave at once. Its unit does not restart it (exit 0).
"""

from __future__ import annotations

import logging

import msgspec

from orchestra_sup.errors import CallTimeout, ErrorCode, PeerDown, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.runtime.remote import HOST_SEPARATOR, qualified
from orchestra_sup.supervisor.views import CtlHost

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 15.0
"""Seconds an agent has to answer a request of its root (a restart waits for the shard)."""
POLL_MARGIN_S = 0.25
"""Seconds a forwarded rollover poll holds less than `ctl rollover` asked, so that the
agent's answer is back through the root before the poll's own deadline."""


async def ask_host(
    host: CtlHost, name: str, body: f.Body, timeout_s: float = ASK_TIMEOUT_S
) -> f.Body:
    """Ask host `name`'s agent `body`, waiting `timeout_s` seconds: its answer, an `Error` of
    the agent's as a body. Raises `RemoteError(not_found)` for a host that has not joined (or
    this is not a root that hosts join), `RemoteError(peer_down)` naming the host when its
    agent cannot be reached or does not answer."""
    joined = host.hosts.by_name.get(name)
    cluster = host.sockets.cluster
    if joined is None or joined.peer is None or cluster is None:
        known = ", ".join(sorted(host.hosts.by_name)) or "none"
        raise RemoteError(ErrorCode.NOT_FOUND, f"no host {name!r} joined (hosts: {known})")
    try:
        return await cluster.request(body, to=joined.peer, timeout_s=timeout_s)
    except RemoteError as exc:
        return f.Error(code=exc.code, message=f"{name}: {exc.message}")
    except (PeerDown, CallTimeout) as exc:  # named by its connection's routing id: bytes
        why = "did not answer in time" if isinstance(exc, CallTimeout) else "is not connected"
        raise RemoteError(
            ErrorCode.PEER_DOWN, f"host {name}'s agent {why} (it stopped, or its link is down)"
        ) from None


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


def is_host_target(host: CtlHost, name: str) -> bool:
    """Whether rollover target `name` is a host's: `host-a/shard-0`, or a joined host's name
    that is no target of the root's own."""
    if HOST_SEPARATOR in name:
        return True
    own = name in host.children.by_name or name in ("supervisor", "shards", "all")
    return not own and name in host.hosts.by_name


async def rollover_host(host: CtlHost, req: f.CtlRollover, timeout_s: float | None) -> f.Body:
    """Ask the agent of the host `req.name` names to roll over its shards (`host-a`) or one
    (`host-a/shard-0`), as its own ctl would, waiting the ctl request's `timeout_s` seconds
    (at least `ASK_TIMEOUT_S`; the agent probes the release first); its first report, with
    the host's name put in (module docstring). The agent answers as `Rollovers.begin` does;
    raises `RemoteError(bad_request)` for a target that is not `host` or `host/shard`, and
    what `ask_host` raises."""
    name, sep, local = req.name.partition(HOST_SEPARATOR)
    if not name or HOST_SEPARATOR in local or (sep and not local):
        raise RemoteError(
            ErrorCode.BAD_REQUEST,
            f"rollover target {req.name[:64]!r}: give a host (host-a) or one of its shards "
            "(host-a/shard-0)",
        )
    asked = msgspec.structs.replace(req, name=local or "shards")
    wait_s = max(timeout_s or 0.0, ASK_TIMEOUT_S)
    return _qualified(name, await ask_host(host, name, asked, wait_s))


async def rollover_status(host: CtlHost, req: f.CtlRolloverStatus) -> f.Body:
    """A poll of a host's rollover (`req.id` is `host-a/<id>`), asked of the agent; raises
    what `ask_host` raises."""
    name, _, local = req.id.partition(HOST_SEPARATOR)
    wait_s = max(0.0, req.wait_s - POLL_MARGIN_S)
    asked = msgspec.structs.replace(req, id=local, wait_s=wait_s)
    return _qualified(name, await ask_host(host, name, asked, wait_s + ASK_TIMEOUT_S))


def _qualified(name: str, answer: f.Body) -> f.Body:
    """Host `name`'s rollover report as the root's operator sees it: the rollover
    `name/<id>` of `name/<target>`, each shard's events as `name/<shard>`'s."""
    if not isinstance(answer, f.RolloverReport):
        return answer
    events = [
        msgspec.structs.replace(e, child=qualified(name, e.child) if e.child else "")
        for e in answer.events
    ]
    target = name if answer.target == "shards" else qualified(name, answer.target)
    return msgspec.structs.replace(
        answer, id=qualified(name, answer.id), target=target, events=events
    )

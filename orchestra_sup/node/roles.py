"""The roles a node can play, by the name a `ChildArgs.role` gives."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import uvloop

from orchestra_sup.runtime.node import Role

ROLES = ("coordinator", "custodian", "shard", "mirror")

UVLOOP_ROLES = frozenset({"coordinator"})
"""The roles whose own process runs on uvloop's event loop; the others run on asyncio's.

The coordinator waits on its loop for every relayed reply, which uvloop wakes for sooner
(`bench relay`, ADR 0001). The custodian answers the relay's reads on its front thread, off the
loop: its loop measured no gain there, so its git and search children stay asyncio's. A shard
cannot: uvloop's `subprocess_exec` refuses `process_group`, with which `shards.shell` makes each
lane's command the leader of the group it kills. A colocated tree runs every role on the
supervisor's loop, asyncio's (docs/adr/0001-loop-driven-zeromq.md, issue 20)."""


def loop_factory(role: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the event loop of a child playing `role` (for `asyncio.Runner`): uvloop's for
    the roles in `UVLOOP_ROLES`, None (asyncio's default) for the others."""
    return uvloop.new_event_loop if role in UVLOOP_ROLES else None


def make_role(role: str) -> Role:
    """A fresh role object for `role`. Raises `ValueError` naming it when it is not in `ROLES`.

    Each role's module is imported here, on first use, so a process imports only its own."""
    if role == "coordinator":
        from orchestra_sup.coordinator.role import Coordinator

        return Coordinator()
    if role == "custodian":
        from orchestra_sup.custodian.role import Custodian

        return Custodian()
    if role == "mirror":
        from orchestra_sup.custodian.hostmirror import HostMirror

        return HostMirror()
    if role == "shard":
        from orchestra_sup.shards.role import Shard

        return Shard()
    raise ValueError(f"unknown role {role!r} (known: {', '.join(ROLES)})")

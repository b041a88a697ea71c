"""The roles a node can play, by the name a `ChildArgs.role` gives."""

from __future__ import annotations

from orchestra_sup.runtime.node import Role

ROLES = ("coordinator", "custodian", "shard")


def make_role(role: str) -> Role:
    """A fresh role object for `role`. Raises `ValueError` naming it when it is not in `ROLES`.

    Each role's module is imported here, on first use, so a process imports only its own."""
    if role == "coordinator":
        from orchestra_sup.coordinator.role import Coordinator

        return Coordinator()
    if role == "custodian":
        from orchestra_sup.custodian.role import Custodian

        return Custodian()
    if role == "shard":
        from orchestra_sup.shards.role import Shard

        return Shard()
    raise ValueError(f"unknown role {role!r} (known: {', '.join(ROLES)})")

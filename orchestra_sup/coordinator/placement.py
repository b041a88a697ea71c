"""Where a lane goes (ARCHITECTURE.md §8; seeds/003, "Routing work to workers").

In order, short-circuiting:

1. Affinity: a live `AffinityTicket` (its shard is up, at the ticket's generation, in this tree's
   boot, eligible and not full) sends the lane back to that shard without scoring.
2. Eligibility, a hard pass/fail filter: the shard is up and not stopping, has a free lane slot,
   offers every capability the task `requires`, and serves the plan's tenant (a shard with no
   `tenants` list serves every tenant; one with a list serves only those, and no plan without a
   tenant).
3. Score: least loaded (cost, latency and warmth are reserved weights in the seed's model and have
   no live signal here).
4. Tie-break: the shard name, so the same state always gives the same answer.

Pure functions over `ShardView` values: no IO, no clock.
"""

from __future__ import annotations

import msgspec

from orchestra_sup.protocol import frames as f


class ShardView(msgspec.Struct, kw_only=True):
    """What the coordinator knows of one shard: from the roster, plus its own count of lanes.

    `capabilities` are what the shard offers; `tenants` whom it serves (empty: every tenant);
    `stopping`: up but being stopped, so it takes no new lane; `refused`: it refused a lane as
    full (its own count is ahead of ours) since the roster last told of it or a lane ended
    there, so it counts as full.
    """

    name: str
    generation: int
    up: bool
    capacity: int
    load: int = 0
    capabilities: frozenset[str] = frozenset()
    tenants: frozenset[str] = frozenset()
    stopping: bool = False
    refused: bool = False
    boot: str = ""
    """A host's shard's host boot id (`PeerState.boot`); "" for one of the root's."""
    lease: int = 0
    """A host's shard's host's etcd lease (`PeerState.lease`), its lanes' keys go under it."""

    @property
    def open(self) -> bool:
        """Up, not stopping, with a free lane slot."""
        return self.up and not self.stopping and self.load < self.capacity


class Need(msgspec.Struct, frozen=True, kw_only=True):
    """What a lane asks of its shard: every capability in `requires`, and service of `tenant`
    (None: the plan names no tenant)."""

    requires: frozenset[str] = frozenset()
    tenant: str | None = None


ANYWHERE = Need()
"""No capability asked for, no tenant named."""


def tenant_of(plan: f.PlanSpec, task: f.TaskSpec) -> str | None:
    """Whom `task` of `plan` runs for: its own `tenant`, else its plan's (None: no tenant)."""
    return task.tenant if task.tenant is not None else plan.tenant


def need_of(plan: f.PlanSpec, task: f.TaskSpec) -> Need:
    """What a lane of `task` of `plan` asks of its shard."""
    return Need(requires=frozenset(task.requires), tenant=tenant_of(plan, task))


class AffinityTicket(msgspec.Struct, frozen=True, kw_only=True):
    """A shard's identity at one moment: its name, its generation and the boot id of the tree
    run it belongs to (generations start again at 1 when the tree starts again, so the boot id is
    what keeps a ticket from an earlier run from matching; docs/adr/0006).

    Written as `shard-1.3@<boot>`; `parse` reads that form back.
    """

    shard: str
    generation: int
    boot: str

    def __str__(self) -> str:
        return f"{self.shard}.{self.generation}@{self.boot}"

    @classmethod
    def parse(cls, text: str) -> AffinityTicket:
        """Raises `ValueError` (naming `text`) unless it reads `<shard>.<generation>@<boot>`."""
        where, sep, boot = text.partition("@")
        shard, dot, generation = where.rpartition(".")
        well_formed = (
            sep
            and dot
            and shard
            and boot
            and len(text) <= 200
            and generation.isascii()
            and generation.isdigit()
            and len(generation) <= 18
        )
        if not well_formed:
            raise ValueError(f"affinity ticket {text[:80]!r} is not <shard>.<generation>@<boot>")
        return cls(shard=shard, generation=int(generation), boot=boot)

    def lives(self, view: ShardView, boot: str) -> bool:
        """True while the shard this ticket names is the very process it was minted for; `boot`
        is the tree's run, which a host's shard's own (`ShardView.boot`) stands in for."""
        return (
            view.name == self.shard
            and view.up
            and view.generation == self.generation
            and (view.boot or boot) == self.boot
        )


def serves(view: ShardView, need: Need) -> bool:
    """Eligibility by what the shard is (capabilities, tenant), whatever its state."""
    if not need.requires <= view.capabilities:
        return False
    return not view.tenants or need.tenant in view.tenants


def place(
    shards: list[ShardView],
    need: Need = ANYWHERE,
    ticket: AffinityTicket | None = None,
    boot: str = "",
) -> ShardView | None:
    """The shard for the next lane (see the module docstring), or None when no shard is eligible
    now. `boot` is the current tree run's boot id, against which `ticket` is checked."""
    if ticket is not None:
        for view in shards:
            if ticket.lives(view, boot) and view.open and serves(view, need):
                return view
    eligible = [s for s in shards if s.open and serves(s, need)]
    if not eligible:
        return None
    return min(eligible, key=lambda s: (s.load, s.name))


def unplaceable(shards: list[ShardView], need: Need) -> str | None:
    """Why no shard of this tree could ever take a lane with `need`, up or down, full or not
    (one line naming what is missing and what the shards offer), or None when one could."""
    if not shards or any(serves(s, need) for s in shards):
        return None
    what = "capabilities " + ", ".join(sorted(need.requires)) if need.requires else "a lane slot"
    whom = f"tenant {need.tenant}" if need.tenant is not None else "plans without a tenant"
    offers = "; ".join(
        f"{s.name}: "
        + (", ".join(sorted(s.capabilities)) or "no capabilities")
        + (f", tenants {', '.join(sorted(s.tenants))}" if s.tenants else ", any tenant")
        for s in sorted(shards, key=lambda s: s.name)
    )
    return f"no shard offers {what} to {whom} ({offers})"

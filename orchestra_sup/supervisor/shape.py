"""What the settings make of the tree: its flags, each child's spec, and the part of each
child's `ChildArgs` that comes from the settings.

Pure functions of `Settings`, so the tree is built from them (`root.build_tree`,
`RootSupervisor._child_args`) and a config reload (`supervisor.reload`) compares what two
settings would make of each child with the very same code: a setting that reaches a child
cannot be added here and missed by the reload.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestra_sup.cluster.settings import ClusterSettings
from orchestra_sup.config import Settings
from orchestra_sup.supervisor.core import Flags, Seam, Strategy, Supervisor, Worker
from orchestra_sup.supervisor.spec import ChildSpec
from orchestra_sup.system.cpupolicy import CpuPlan, machine_cpus, resolve_realtime, role_plans
from orchestra_sup.system.isolation import IsolationSettings, effective

SHARD_STOP_MARGIN_S = 3.0
"""Seconds a shard's grace adds to `shutdown_timeout_s`: its lanes get that long after SIGTERM,
and it then hands the coordinator what they were interrupted at."""
FIXED = ("custodian", "coordinator")
"""The children every tree has, in start order, before its shards."""
HOST_FIXED = ("mirror",)
"""A host's agent's child before its shards: the mirror its shards' sandboxes are made from
(`custodian.hostmirror`)."""


def build_tree(
    settings: Settings,
    seam: Seam,
    on_give_up: Callable[[], None],
    fixed: tuple[str, ...] = FIXED,
) -> Supervisor:
    """The tree in start order: the `fixed` children (a tree's custodian and coordinator; none
    on a host's agent), then the shards' sub-supervisor, its children shard-0 .. shard-N-1.
    `on_give_up` is called when the root's restart intensity is exceeded."""
    tree_flags = flags(settings)

    def worker(name: str) -> Worker:
        return Worker(child_spec(settings, name), tree_flags, seam)

    shards = Supervisor("shards", tree_flags, [worker(n) for n in shard_names(settings)], seam)
    return Supervisor(
        "root", tree_flags, [*(worker(name) for name in fixed), shards], seam, on_give_up=on_give_up
    )


def flags(settings: Settings) -> Flags:
    """Every supervisor's flags (one_for_one, `[supervisor]` intensity and backoff)."""
    sup = settings.supervisor
    return Flags(
        strategy=Strategy.ONE_FOR_ONE,
        max_restarts=sup.max_restarts,
        max_seconds=sup.max_seconds,
        backoff_initial_s=sup.backoff_initial_s,
        backoff_max_s=sup.backoff_max_s,
    )


def shard_names(settings: Settings) -> list[str]:
    """shard-0 .. shard-N-1 for `[shards] count` = N."""
    return [f"shard-{i}" for i in range(settings.shards.count)]


def child_spec(settings: Settings, name: str) -> ChildSpec:
    """The spec of child `name` ("custodian", "coordinator" or "shard-K") under `settings`."""
    grace = settings.supervisor.shutdown_timeout_s
    if name in FIXED or name in HOST_FIXED:
        return ChildSpec(name=name, role=name, shutdown_s=grace)
    capabilities, tenants = settings.shards.offers(name)
    return ChildSpec(
        name=name,
        role="shard",
        shutdown_s=grace + SHARD_STOP_MARGIN_S,
        capacity=settings.shards.lanes_per_shard,
        capabilities=capabilities,
        tenants=tenants,
    )


def child_specs(settings: Settings) -> dict[str, ChildSpec]:
    """Every child's spec under `settings`, by name, in start order."""
    return {name: child_spec(settings, name) for name in [*FIXED, *shard_names(settings)]}


READS: dict[str, frozenset[str]] = {
    "custodian": frozenset(
        {"heartbeat_s", "isolation", "cpu", "cluster_listen", "fences", "retention", "min_free"}
    ),
    "mirror": frozenset({"heartbeat_s", "isolation", "cpu", "retention"}),
    "coordinator": frozenset(
        {
            "heartbeat_s",
            "max_worker_loss",
            "relay_deadline_s",
            "lane_programs",
            "coordinator_programs",
            "quotas",
            "retention",
            "min_free",
            "cpu",
            "cluster_listen",
            "fences",
        }
    ),
    "shard": frozenset(
        {
            "heartbeat_s",
            "lanes_per_shard",
            "lane_grace_s",
            "transcript_retention_s",
            "prune_every_s",
            "lane_nice",
            "lane_programs",
            "isolation",
            "cpu",
            "lane_cpu",
        }
    ),
}
"""The settings-derived `ChildArgs` fields each role reads. A child is told only these (the
others keep `ChildArgs`' defaults), so a setting restarts, on a config reload, only the
children that use it."""


def settings_args(settings: Settings, role: str) -> dict[str, Any]:
    """The `ChildArgs` fields a child of `role` gets from `settings` (keyword arguments; the
    rest, its name, generation, directories and endpoint, come from the tree): those it reads
    (`READS`), the others at their defaults. The isolation mode is the effective one ("auto"
    resolved on this machine), and so is the CPU policy (`cpu_plans`)."""
    sup = settings.supervisor
    every = {
        "lanes_per_shard": settings.shards.lanes_per_shard,
        "heartbeat_s": min(0.5, sup.watchdog_s / 4),
        "max_worker_loss": settings.lanes.max_worker_loss,
        "lane_grace_s": sup.shutdown_timeout_s,
        "transcript_retention_s": settings.retention.transcripts_s,
        "prune_every_s": settings.retention.every_s,
        "relay_deadline_s": settings.relay.deadline_s,
        "lane_nice": settings.lanes.nice,
        "lane_programs": list(settings.lanes.programs),
        "coordinator_programs": list(settings.coordinator.programs),
        "quotas": dict(settings.quotas),
        "retention": settings.retention,
        "min_free": settings.min_free,
        "lane_cpu": settings.cpu.lanes,
        "cluster_listen": {
            "coordinator": settings.cluster.coordinator_listen,
            "custodian": settings.cluster.custodian_listen,
        }.get(role)
        or "",
        "fences": settings.cluster if settings.cluster.listen else ClusterSettings(),
    }
    reads = READS[role]
    told = {key: value for key, value in every.items() if key in reads}
    if "isolation" in reads:  # resolving "auto" may probe bubblewrap: only for whom it is
        told["isolation"] = resolved = effective(settings.isolation)
        if role in ("custodian", "mirror"):  # who owns a sandbox: a limit must not restart it
            told["isolation"] = IsolationSettings(mode=resolved.mode, lane_user=resolved.lane_user)
    if "cpu" in reads:  # whether real time is allowed is found by trying it
        told["cpu"] = cpu_plans(settings)["shard" if role == "mirror" else role]
    told.setdefault("lanes_per_shard", 0)  # a field every ChildArgs has, read by shards only
    return told


def cpu_plans(settings: Settings) -> dict[str, CpuPlan]:
    """Each role's CPU plan under `[cpu]` on this machine ("supervisor" among them:
    `cpupolicy.role_plans`, real time where `realtime` asks for it and it is allowed)."""
    realtime, _refusal = resolve_realtime(settings.cpu)
    return role_plans(settings.cpu, realtime, machine_cpus())

"""Tenant quotas: ceilings checked before any shard is chosen for a lane.

seeds/003 ("Cost and budget enforcement"): "Per-tenant quotas are checked before a worker is ever
selected. A ceiling breach (concurrency, rate, or cumulative cost/token limits over a rolling
window) short-circuits the dispatch — no worker runs, no budget is consumed — and raises a
quota-exceeded failure." The failure (`quota_breach`) then goes to the task's strategy like any
other: it fails the task by default, and `on_failure = "retry"` waits it out with backoff.

Quotas come from the config (`[quotas.<tenant>]`, `config.py`); usage is counted from the
coordinator's own durable plan records (every attempt keeps when it was placed, when it ended and
what it spent), so it survives restarts with no state of its own. Pure logic.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import msgspec

from orchestra_sup.coordinator.placement import tenant_of
from orchestra_sup.protocol.childargs import Quota

if TYPE_CHECKING:
    from orchestra_sup.coordinator.runner import PlanRecord


class Usage(msgspec.Struct, kw_only=True):
    """What a tenant uses now: `live` lanes, `starts` and spend (`wall_s`, `cpu_s`) in the
    window."""

    live: int = 0
    starts: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0


def usage(tenant: str, plans: Iterable[PlanRecord], now: float, window_s: float) -> Usage:
    """Count `tenant`'s lanes over `plans` at `now` (Unix seconds)."""
    since = now - window_s
    out = Usage()
    for plan in plans:
        for spec in plan.spec.tasks:
            if tenant_of(plan.spec, spec) != tenant:
                continue
            for attempt in plan.tasks[spec.id].history:
                if attempt.ended_at is None:
                    out.live += 1
                elif attempt.ended_at >= since:
                    out.wall_s += attempt.spent.wall_s
                    out.cpu_s += attempt.spent.cpu_s
                if attempt.placed_at >= since:
                    out.starts += 1
    return out


def breach(quota: Quota, tenant: str, plans: Iterable[PlanRecord], now: float) -> str | None:
    """Why one more lane of `tenant` would break `quota` at `now`, in one line, or None."""
    used = usage(tenant, plans, now, quota.window_s)
    window = f"in the last {quota.window_s:g} s"
    if quota.concurrency is not None and used.live >= quota.concurrency:
        return (
            f"tenant {tenant} has {used.live} live lanes (quota concurrency = {quota.concurrency})"
        )
    if quota.rate is not None and used.starts >= quota.rate:
        return f"tenant {tenant} started {used.starts} lanes {window} (quota rate = {quota.rate})"
    if quota.wall_s is not None and used.wall_s >= quota.wall_s:
        return (
            f"tenant {tenant} spent {used.wall_s:.3g} wall seconds {window} "
            f"(quota wall_s = {quota.wall_s:g})"
        )
    if quota.cpu_s is not None and used.cpu_s >= quota.cpu_s:
        return (
            f"tenant {tenant} spent {used.cpu_s:.3g} CPU seconds {window} "
            f"(quota cpu_s = {quota.cpu_s:g})"
        )
    return None

"""Retention: ctl -> supervisor -> coordinator (`ctl prune`, `[retention]`) (`Retention`)."""

from __future__ import annotations

from orchestra_sup.protocol.frames.frame import Frame


class CtlPrune(Frame, tag="ctl_prune"):
    """`ctl prune [--dry-run]`: prune now what `[retention]` says may go (`dry_run`: only say
    what would). Answered `PruneReport`."""

    dry_run: bool = False


class PruneReport(Frame, tag="prune_report"):
    """What a prune took (or, `dry_run`, would take): finished `plans` (their ids, at most
    `IDS_MAX` of them; `plan_count` is all), their `tasks` records, `inbox` entries and
    `sessions`, and `keys` (idempotency keys whose time ran out, `[retention] keys_s`). `kept`
    counts the keys still answering for plans already pruned; `took_s` is the prune's own time,
    seconds; `events` the event log's rows older than `[retention] events_s` deleted (0 in a
    dry run)."""

    dry_run: bool
    plans: list[str]
    plan_count: int
    tasks: int
    inbox: int
    sessions: int
    keys: int
    kept: int
    took_s: float
    events: int = 0


IDS_MAX = 1000
"""Plan ids a `PruneReport` lists at most (the counts are whole)."""

Retention = CtlPrune | PruneReport

"""The JSON shapes of the tree's answers, as `ctl --json` prints them and the HTTP API serves
them: one function per answer, pure, from the frame to plain values. The shapes are stable:
scripts rely on them (a field is added, never renamed or removed)."""

from __future__ import annotations

from typing import Any

import msgspec

from orchestra_sup.protocol import frames as f


def status_json(reply: f.StatusReply) -> dict[str, Any]:
    return {
        "supervisor": {
            "pid": reply.supervisor_pid,
            "version": reply.version,
            "release": reply.release,
            "rollover": reply.rollover,
            "isolation": reply.isolation,
            "cpu": reply.cpu,
            "rt_demoted": reply.rt_demoted,
            "lane_cpu": reply.lane_cpu,
            "run_dir": reply.run_dir,
            "state_dir": reply.state_dir,
            "workspace": reply.workspace,
            "loop_lag_ms": list(reply.loop_lag_ms),
            "bad_frames": reply.bad_frames,
            "stale_frames": reply.stale_frames,
            "internal_errors": reply.internal_errors,
            "ctl_refused": reply.ctl_refused,
            "metrics_url": reply.metrics_url,
            "http_url": reply.http_url,
            "state_disk": None
            if reply.state_disk is None
            else {**msgspec.to_builtins(reply.state_disk), "short": reply.state_disk.short},
            "descriptors": msgspec.to_builtins(reply.descriptors),
            "ctl_connections": reply.ctl_connections,
            "ctl_connections_max": reply.ctl_connections_max,
        },
        "children": msgspec.to_builtins(reply.children),
        "cluster": cluster_json(reply),
    }


def plan_json(report: f.PlanReport) -> dict[str, Any]:
    out = msgspec.to_builtins(report)
    out.pop("t", None)
    return out


def rollover_json(report: f.RolloverReport) -> dict[str, Any]:
    """{"id", "target", "release": {"python", "version", "proto_min", "proto_max"}, "done",
    "ok", "error", "events": [{"seq", "at_s", "child", "text", "took_s"}]}."""
    out = msgspec.to_builtins(report)
    out.pop("t", None)
    return out


def recorded_json(reply: f.HitlRecorded) -> dict[str, Any]:
    """{"lane", "plan", "task", "outcome"}: what a HITL answer did."""
    return {"lane": reply.lane, "plan": reply.plan, "task": reply.task, "outcome": reply.outcome}


def lanes_json(reply: f.LaneList) -> dict[str, Any]:
    """{"lanes": [{"lane", "task", "plan", "shard", "state", "sandbox", "question", "since"}],
    "unanswered": [name, ...]}: `question` and `since` (Unix seconds) are set on a lane that
    waits for a human (state "awaiting_approval"), else null; `shard` is "" for a task no lane
    holds yet; `unanswered` names the children whose lanes are missing."""
    return {"lanes": msgspec.to_builtins(reply.lanes), "unanswered": list(reply.unanswered)}


SUPERVISOR_KEYS = ("name", "strategy", "max_restarts", "max_seconds")
"""A supervisor's fields in `tree_json`, before its "children"."""
WORKER_KEYS = ("name", "role", "pid", "generation", "state")
"""A worker's fields in `tree_json`."""


def tree_json(reply: f.StatusReply) -> dict[str, Any]:
    """The tree nested: {"name", "strategy", "max_restarts", "max_seconds", "children": [...]},
    a worker being {"name", "role", "pid", "generation", "state"}; the root also has "hosts",
    each {"name", "state", "pid", "boot", "lease", "shards": [{"name", "pid", "generation",
    "state"}, ...]} (`hosts_view`)."""
    workers = {c.name: c for c in reply.children}
    sups = {s.name: s for s in reply.supervisors}

    def node(name: str) -> dict[str, Any]:
        if name in sups:
            s = sups[name]
            return _fields(s, SUPERVISOR_KEYS) | {"children": [node(c) for c in s.children]}
        return _fields(workers[name], WORKER_KEYS)

    roots = [s.name for s in reply.supervisors if s.parent is None]
    if not roots:
        return {}
    return node(roots[0]) | {"hosts": [_host_node(h) for h in reply.hosts]}


def _host_node(host: f.HostInfo) -> dict[str, Any]:
    shards = [_fields(s, ("name", "pid", "generation", "state")) for s in host.shards]
    return _fields(host, ("name", "state", "pid", "boot", "lease")) | {"shards": shards}


def _fields(struct: object, keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: getattr(struct, key) for key in keys}


def cluster_json(reply: f.StatusReply) -> dict[str, Any]:
    """{"listen", "etcd_quorum", "refused", "fenced", "hosts": [HostInfo as builtins, ...]};
    "fenced" is the results and commits of hosts' fenced attempts refused (`ChildInfo.fenced`
    summed)."""
    return {
        "listen": reply.cluster_listen,
        "etcd_quorum": reply.etcd_quorum,
        "refused": reply.hosts_refused,
        "fenced": sum(c.fenced for c in reply.children),
        "hosts": msgspec.to_builtins(reply.hosts),
    }


def log_row_json(row: f.LogRow, lane: str) -> dict[str, Any]:
    """One transcript row for programs: exactly {"seq", "ts", "stream", "data", "lane"}, `lane`
    being the lane whose transcript it is (`seq` counts from 0 in each lane's)."""
    return {"seq": row.seq, "ts": row.ts, "stream": row.stream, "data": row.data, "lane": lane}

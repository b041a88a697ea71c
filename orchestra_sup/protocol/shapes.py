"""The JSON shapes of the tree's answers, as `ctl --json` prints them and the HTTP API serves
them: one function per answer, pure, from the frame to plain values, each built through the
msgspec type the HTTP API's OpenAPI document is generated from (`web.openapi`), so the two
cannot drift. The shapes are stable: scripts rely on them (a field is added, never renamed or
removed)."""

from __future__ import annotations

from typing import Any

import msgspec

from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.frames.ctl import PlanSummary
from orchestra_sup.protocol.frames.hosts import HostInfo
from orchestra_sup.protocol.frames.values import ChildInfo, Descriptors, LaneInfo


def view_of(frame: type[msgspec.Struct], name: str) -> type[msgspec.Struct]:
    """An untagged copy of `frame`'s fields, named `name`, that refuses unknown fields: the
    shape of `msgspec.to_builtins(frame)` without its tag "t" (`plan_json`, ...)."""
    fields = [
        (field.name, field.type, field.default)
        if field.default is not msgspec.NODEFAULT
        else (field.name, field.type)
        if field.default_factory is msgspec.NODEFAULT
        else (field.name, field.type, msgspec.field(default_factory=field.default_factory))
        for field in msgspec.structs.fields(frame)
    ]
    return msgspec.defstruct(
        name, fields, kw_only=True, forbid_unknown_fields=True, namespace={"__doc__": frame.__doc__}
    )


PlanView = view_of(f.PlanReport, "Plan")
RolloverView = view_of(f.RolloverReport, "Rollover")
ReloadView = view_of(f.ReloadReport, "Reload")
EventView = f.Event


class StateDiskView(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The state directory's disk, bytes, against `[state] min_free`; `short`: free is below
    it (new plans and lanes are refused)."""

    free: int
    total: int
    min_free: int
    short: bool


class SupervisorView(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The supervisor process (`StatusReply`'s fields of the same meaning); `loop_lag_ms` is
    its event loop's lag, [p50, p99, max] in milliseconds over its sliding window."""

    pid: int
    version: str
    release: str
    rollover: str | None
    isolation: str
    cpu: str
    rt_demoted: int
    lane_cpu: str
    run_dir: str
    state_dir: str
    workspace: str
    loop_lag_ms: list[float]
    bad_frames: int
    stale_frames: int
    internal_errors: int
    ctl_refused: int
    metrics_url: str
    http_url: str
    http: f.HttpCounts | None
    state_disk: StateDiskView | None
    descriptors: Descriptors | None
    ctl_connections: int
    ctl_connections_max: int


class ClusterView(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Hosts past this machine: where they join (`listen`, "" for one host), whether etcd has
    a quorum (null: no etcd), `Hello`s refused, fenced results and commits refused."""

    listen: str
    etcd_quorum: bool | None
    refused: int
    fenced: int
    hosts: list[HostInfo]


class StatusView(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`ctl status --json`, `GET /v1/status`."""

    supervisor: SupervisorView
    children: list[ChildInfo]
    cluster: ClusterView


class ShardNode(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    pid: int | None
    generation: int
    state: str


class HostNode(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    state: str
    pid: int | None
    boot: str
    lease: int
    shards: list[ShardNode]


class TreeNode(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`ctl tree --json`, `GET /v1/tree`: a supervisor has `strategy`, `max_restarts`,
    `max_seconds` and `children`; a worker `role`, `pid`, `generation` and `state`; the root
    also `hosts`. A key a node does not have is absent."""

    name: str
    strategy: str | None = None
    max_restarts: int | None = None
    max_seconds: float | None = None
    children: list[TreeNode] | None = None
    role: str | None = None
    pid: int | None = None
    generation: int | None = None
    state: str | None = None
    hosts: list[HostNode] | None = None


class PlansView(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`ctl plans --json`, `GET /v1/plans`."""

    plans: list[PlanSummary]


class LanesView(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`ctl lanes --json`, `GET /v1/lanes` (`lanes_json`)."""

    lanes: list[LaneInfo]
    unanswered: list[str]


class RecordedView(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a HITL answer did (`recorded_json`)."""

    lane: str
    plan: str
    task: str
    outcome: str


class LogRowView(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One transcript row (`log_row_json`): `seq` counts from 0 in each lane's transcript,
    `ts` Unix seconds, `stream` "stdout", "stderr" or the tree's own note."""

    seq: int
    ts: float
    stream: str
    data: str
    lane: str


def status_json(reply: f.StatusReply) -> dict[str, Any]:
    """`StatusView` as plain values."""
    disk = reply.state_disk
    supervisor = SupervisorView(
        pid=reply.supervisor_pid,
        version=reply.version,
        release=reply.release,
        rollover=reply.rollover,
        isolation=reply.isolation,
        cpu=reply.cpu,
        rt_demoted=reply.rt_demoted,
        lane_cpu=reply.lane_cpu,
        run_dir=reply.run_dir,
        state_dir=reply.state_dir,
        workspace=reply.workspace,
        loop_lag_ms=list(reply.loop_lag_ms),
        bad_frames=reply.bad_frames,
        stale_frames=reply.stale_frames,
        internal_errors=reply.internal_errors,
        ctl_refused=reply.ctl_refused,
        metrics_url=reply.metrics_url,
        http_url=reply.http_url,
        http=reply.http,
        state_disk=None
        if disk is None
        else StateDiskView(
            free=disk.free, total=disk.total, min_free=disk.min_free, short=disk.short
        ),
        descriptors=reply.descriptors,
        ctl_connections=reply.ctl_connections,
        ctl_connections_max=reply.ctl_connections_max,
    )
    view = StatusView(supervisor=supervisor, children=reply.children, cluster=_cluster(reply))
    return msgspec.to_builtins(view)  # type: ignore[no-any-return]


def plan_json(report: f.PlanReport) -> dict[str, Any]:
    """`PlanView`: the report without its tag."""
    return untagged_json(report)


def rollover_json(report: f.RolloverReport) -> dict[str, Any]:
    """`RolloverView`: {"id", "target", "release": {"python", "version", "proto_min",
    "proto_max"}, "done", "ok", "error", "events": [{"seq", "at_s", "child", "text",
    "took_s"}]}."""
    return untagged_json(report)


def reload_json(report: f.ReloadReport) -> dict[str, Any]:
    """`ReloadView`: what a config reload did."""
    return untagged_json(report)


def untagged_json(frame: f.Frame) -> dict[str, Any]:
    """`frame` as plain values without its tag "t": the shape `view_of(type(frame))` has."""
    out: dict[str, Any] = msgspec.to_builtins(frame)
    out.pop("t", None)
    return out


def recorded_json(reply: f.HitlRecorded) -> dict[str, Any]:
    """`RecordedView`: what a HITL answer did."""
    view = RecordedView(lane=reply.lane, plan=reply.plan, task=reply.task, outcome=reply.outcome)
    return msgspec.to_builtins(view)  # type: ignore[no-any-return]


def lanes_json(reply: f.LaneList) -> dict[str, Any]:
    """`LanesView`: {"lanes": [{"lane", "task", "plan", "shard", "state", "sandbox",
    "question", "since"}], "unanswered": [name, ...]}: `question` and `since` (Unix seconds)
    are set on a lane that waits for a human (state "awaiting_approval"), else null; `shard`
    is "" for a task no lane holds yet; `unanswered` names the children whose lanes are
    missing."""
    view = LanesView(lanes=reply.lanes, unanswered=list(reply.unanswered))
    return msgspec.to_builtins(view)  # type: ignore[no-any-return]


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
    """`ClusterView` as plain values; "fenced" is the results and commits of hosts' fenced
    attempts refused (`ChildInfo.fenced` summed)."""
    return msgspec.to_builtins(_cluster(reply))  # type: ignore[no-any-return]


def _cluster(reply: f.StatusReply) -> ClusterView:
    return ClusterView(
        listen=reply.cluster_listen,
        etcd_quorum=reply.etcd_quorum,
        refused=reply.hosts_refused,
        fenced=sum(c.fenced for c in reply.children),
        hosts=reply.hosts,
    )


def log_row_view(row: f.LogRow, lane: str) -> LogRowView:
    """One transcript row for programs, `lane` being the lane whose transcript it is."""
    return LogRowView(seq=row.seq, ts=row.ts, stream=row.stream, data=row.data, lane=lane)


def log_row_json(row: f.LogRow, lane: str) -> dict[str, Any]:
    """`log_row_view` as plain values (`ctl logs --json`)."""
    return msgspec.to_builtins(log_row_view(row, lane))  # type: ignore[no-any-return]

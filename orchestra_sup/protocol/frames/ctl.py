"""The ctl channel: operator -> supervisor (-> coordinator, -> shards) (`Ctl`).

Every `orchestra-sup ctl` request and its answer, and the forms the supervisor forwards them in
(`HitlRespond`, `DebugHook`; `lanes.LaneLogs` for `CtlLogs`).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from orchestra_sup.protocol.frames.frame import Frame
from orchestra_sup.protocol.frames.hosts import HostInfo
from orchestra_sup.protocol.frames.values import (
    Budget,
    ChildInfo,
    Descriptors,
    PlanSpec,
    Spend,
    TaskReport,
)
from orchestra_sup.system.reserve import DiskSpace


class CtlStatus(Frame, tag="ctl_status"):
    pass


class SupervisorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One supervisor of the tree: its flags and its children's names in start order."""

    name: str
    parent: str | None
    strategy: str
    max_restarts: int
    max_seconds: float
    children: list[str]


class HttpCounts(msgspec.Struct, frozen=True, kw_only=True):
    """The HTTP API's connections: `open` now (TLS handshakes included) of at most `max`
    (`[http] max_connections`); since the supervisor started, `refused` over the bound and
    `reset` for reading nothing of their answers."""

    open: int
    max: int
    refused: int = 0
    reset: int = 0


class StatusReply(Frame, tag="status_reply"):
    """`ctl status`: the supervisor and every child. `loop_lag_ms` is the supervisor's own
    event-loop lag, (p50, p99, max) in milliseconds over its sliding window."""

    supervisor_pid: int
    version: str
    run_dir: str
    state_dir: str
    workspace: str
    children: list[ChildInfo]
    supervisors: list[SupervisorInfo] = []
    loop_lag_ms: tuple[float, float, float] = (0.0, 0.0, 0.0)
    release: str = ""
    """The interpreter the supervisor runs (`orchestra_sup.release`)."""
    rollover: str | None = None
    """The rollover in progress, in one line ("ID of TARGET for N s: last step"), or None."""
    ctl_refused: int = 0
    """Since the supervisor started: ctl requests refused `forbidden` (another uid, no
    identity) plus tcp peers refused at the CURVE handshake (no CURVE, an unknown key)."""
    bad_frames: int = 0
    """Frames the supervisor itself refused as undecodable on its control and ctl sockets."""
    internal_errors: int = 0
    """Requests the supervisor itself answered `internal` (an unexpected exception serving
    them) on its control and ctl sockets."""
    stale_frames: int = 0
    """Frames the supervisor refused as meant for another generation of it (`dest_gen`)."""
    isolation: str = ""
    """The isolation mode the shards' lanes run under ("bwrap", "none"; `system.isolation`)."""
    cpu: str = ""
    """The supervisor's CPU class and affinity as the kernel applies them (`ChildInfo.cpu`)."""
    rt_demoted: int = 0
    """Processes the real-time guard put back in SCHED_OTHER since the supervisor started
    (`system.rtguard`)."""
    lane_cpu: str = ""
    """How lanes yield the CPU: `[cpu] lanes`' layer here and `[lanes] nice` ("cpu.idle, nice
    10"; `system.lanecpu.layer_here`)."""
    metrics_url: str = ""
    """Where the supervisor serves Prometheus metrics (`start --metrics-port`); "" when off."""
    http_url: str = ""
    """Where the supervisor serves the HTTP API (`[http] listen`, `start --http`); "" when off."""
    state_disk: DiskSpace | None = None
    """The state directory's disk against `[state] min_free` (`system.reserve`): while `short`,
    the coordinator refuses new plans and lanes. None from a host's agent."""
    descriptors: Descriptors | None = None
    """The supervisor's own file descriptors (its `refused` and `shut` are ctl's and the
    control socket's)."""
    ctl_connections: int = 0
    """Ctl connections served now on `ctl.ipc`."""
    ctl_connections_max: int = 0
    """At most this many at once (`[supervisor] ctl_connections`)."""
    cluster_listen: str = ""
    """Where hosts' agents join (`[cluster] listen`); "" for a tree of one host."""
    hosts: list[HostInfo] = []
    """The hosts that joined, by name (`supervisor.hosts`)."""
    etcd_quorum: bool | None = None
    """Whether the root reaches an etcd quorum (None: no etcd, or no answer yet). Without one
    no lane is placed on a host; the root's own lanes go on."""
    hosts_refused: int = 0
    """Host `Hello`s refused since the supervisor started: a key not the host's own, a wrong
    routing id, another role, a protocol the root does not speak."""
    http: HttpCounts | None = None
    """The HTTP API's connections (None: not served; `supervisor.httpgate`)."""


class CtlRestart(Frame, tag="ctl_restart"):
    """Restart child `name`; on a root, `host-a/shard-0` is asked of host-a's agent."""

    name: str


class CtlStopHost(Frame, tag="ctl_stop_host"):
    """`ctl stop-host NAME`: host `name` takes no new lane, its lanes end (for at most
    `drain_timeout_s` seconds; None: `[supervisor] drain_timeout_s`), then its agent stops and
    leaves (its lease revoked). Answered `Ack` once the agent said it stops; `Error(not_found)`
    for a host that has not joined."""

    name: str
    drain_timeout_s: float | None = None


class CtlStop(Frame, tag="ctl_stop"):
    pass


class CtlSubmit(Frame, tag="ctl_submit"):
    plan: PlanSpec


class PlanAccepted(Frame, tag="plan_accepted"):
    id: str


class CtlPlan(Frame, tag="ctl_plan"):
    """Ask for plan `id`; with `wait_s` > 0 the answer is held until the plan is done or that
    many seconds have passed (a long poll)."""

    id: str
    wait_s: float = 0.0


class PlanReport(Frame, tag="plan_report"):
    """A plan and its tasks; `ok` is true when every task succeeded."""

    plan: str
    id: str
    done: bool
    ok: bool
    tasks: list[TaskReport]
    spent: Spend = Spend()
    budget: Budget | None = None
    coordinator: str = "dag"
    """What decides its lanes: "dag" (its `tasks`), or a coordinator program (a session)."""
    result: Any = None
    """What a session's program returned (JSON values); None until it ends, or when it failed."""
    error: str | None = None
    """Why a session failed, in one line."""
    lanes: list[SessionLaneReport] = []
    """Every lane a session started, in the order it started them."""


class SessionLaneReport(msgspec.Struct, frozen=True, kw_only=True):
    """One lane a session started: its lane id (None while it waits for a shard), the one-task
    plan that runs it, its command, its revision (the full sha its sandbox was made at once it
    ended, the revision asked for before; None: the head), its effect id (`key`) and the status
    a report shows."""

    lane: str | None
    plan: str
    run: str
    rev: str | None
    key: str
    status: str


class CtlPlans(Frame, tag="ctl_plans"):
    """List the coordinator's plans, newest first."""


class PlanSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One plan in a `PlanList`: `submitted_at` is wall-clock seconds since the epoch;
    `tasks` counts its tasks by shown status ("running", "succeeded", ...)."""

    id: str
    plan: str
    submitted_at: float
    done: bool
    ok: bool
    tasks: dict[str, int]


class PlanList(Frame, tag="plan_list"):
    plans: list[PlanSummary]


class CtlLanes(Frame, tag="ctl_lanes"):
    pass


class CtlCancel(Frame, tag="ctl_cancel"):
    lane: str


class CtlRespond(Frame, tag="ctl_respond"):
    """`ctl approve | reject | redirect | accept-partial LANE`: answer the HITL pause of the task
    whose lane (pending approval, failed for review, or asking) is `lane`. The caller's identity
    is not part of it: the supervisor stamps it (`HitlRespond`)."""

    lane: str
    verdict: Literal["approve", "reject", "redirect", "accept_partial"]
    text: str = ""
    grant: Budget | None = None
    retries: int = 0


class HitlRespond(Frame, tag="hitl_respond"):
    """`CtlRespond` as the supervisor forwards it to the coordinator, with the responder's
    `uid` and name from the ctl connection's peer credentials. Answered `HitlRecorded`;
    `Error(not_found)` when no task waits on that lane, `bad_request` for an answer that does
    not fit the pause."""

    lane: str
    verdict: Literal["approve", "reject", "redirect", "accept_partial"]
    uid: int
    responder: str
    text: str = ""
    grant: Budget | None = None
    retries: int = 0


class HitlRecorded(Frame, tag="hitl_recorded"):
    """The answer is recorded (durably) and acted on: `outcome` says what it did."""

    lane: str
    plan: str
    task: str
    outcome: str


class ListPending(Frame, tag="list_pending"):
    """Ask the coordinator for every task that waits for a human; answered `LaneList` (state
    "awaiting_approval", `question` and `since` set; `shard` "" when no lane holds it)."""


class CtlCall(Frame, tag="ctl_call"):
    """Call one of the coordinator's tools through the real relay (`ctl call`); answered with
    the tool's `ToolResult`."""

    tool: str
    params: dict[str, str] = {}


MESSAGE_MAX_BYTES = 64 * 1024
"""The longest operator message (`CtlMessage.text`), in UTF-8 bytes."""


class CtlMessage(Frame, tag="ctl_message"):
    """`ctl message PLAN TEXT`: an operator's message to the session that runs plan `plan`
    (`text`: at most `MESSAGE_MAX_BYTES` UTF-8 bytes). Answered `Ack`; `Error(not_found)` for
    an unknown plan, `bad_request` for a plan whose coordinator takes no messages."""

    plan: str
    text: str


class CtlBenchRelay(Frame, tag="ctl_bench_relay"):
    """`bench relay`: the coordinator calls `tool` through its relay `warmup + iterations`
    times, one after the other, and answers the round-trip times of the last `iterations`."""

    tool: str
    params: dict[str, str] = {}
    iterations: int = 1000
    warmup: int = 100


class BenchSamples(Frame, tag="bench_samples"):
    """Round-trip times in microseconds, in call order."""

    samples_us: list[float]


DebugAction = Literal[
    "block_loop", "spin_loop", "hold_commits", "ignore_sigterm", "raise", "raise_in_task"
]


class CtlDebug(Frame, tag="ctl_debug"):
    """Fault injection for tests, refused unless the tree runs with ORCHESTRA_SUP_DEBUG_HOOKS=1:
    `block_loop` blocks child `name`'s event loop for `seconds` (asleep); `spin_loop` holds it
    for `seconds` on the CPU, never blocking (a runaway, for `[cpu]`'s guards); `hold_commits`
    starts no commit of its state store for `seconds` (`Store.hold`: writes queue and durable
    writes wait, as behind a stalled disk; refused `bad_request` by a child with no store);
    `ignore_sigterm`
    makes it ignore SIGTERM from then on; `raise` makes the handler serving this request raise
    `RuntimeError`, `raise_in_task` the task serving it (answered `internal`, as any bug). `name`
    "supervisor" takes the two `raise` actions and `spin_loop`, served by the supervisor
    itself."""

    name: str
    action: DebugAction
    seconds: float = 0.0


class DebugHook(Frame, tag="debug_hook"):
    """`CtlDebug` as the supervisor forwards it to the child."""

    action: DebugAction
    seconds: float = 0.0


class CtlReload(Frame, tag="ctl_reload"):
    """`ctl reload` (as SIGHUP does): re-read the config file `start` was given, with its
    command-line overrides, and apply what changed (`supervisor.reload`). Answered with
    `ReloadReport` once every change is applied, or once the reload is refused."""


class ReloadReport(Frame, tag="reload_report"):
    """What a config reload did. `config`: the file re-read ("": the tree was started without
    `--config`, so nothing was). `changed`: the settings that differ, "[section] key".
    Children by name: `restarted` (new settings in their args: restarted, new pid),
    `added` (new shards), `retired` (shards drained, stopped and removed), `updated` (new spec
    applied in place: placement offer, shutdown grace; pid kept), `unchanged` (pid kept).
    `refused`: nothing was applied (a bad config, a key that cannot change live, busy), and
    `error` says why in one line; `error` without `refused`: applied, but a child did not
    start under the new settings (it is restarted as any failed child)."""

    config: str
    changed: list[str] = []
    restarted: list[str] = []
    added: list[str] = []
    retired: list[str] = []
    updated: list[str] = []
    unchanged: list[str] = []
    refused: bool = False
    error: str | None = None


class CtlLogs(Frame, tag="ctl_logs"):
    """Ask for lane `lane`'s transcript rows after `after_seq` (-1: from the first), at most
    `limit`; with `wait_s` > 0 and no such row yet, the answer is held until one comes, the lane
    ends, or `wait_s` seconds have passed (a long poll). Answered with `LogChunk`, or `Error`
    `not_found` when no shard knows the lane."""

    lane: str
    after_seq: int = -1
    wait_s: float = 0.0
    limit: int = 1000


Ctl = (
    CtlStatus
    | StatusReply
    | CtlRestart
    | CtlStopHost
    | CtlStop
    | CtlSubmit
    | PlanAccepted
    | CtlPlan
    | PlanReport
    | CtlPlans
    | PlanList
    | CtlLanes
    | CtlCancel
    | CtlRespond
    | HitlRespond
    | HitlRecorded
    | ListPending
    | CtlCall
    | CtlMessage
    | CtlBenchRelay
    | BenchSamples
    | CtlDebug
    | DebugHook
    | CtlLogs
    | CtlReload
    | ReloadReport
)

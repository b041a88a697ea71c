"""Every frame that crosses a process boundary.

One ZeroMQ message carries one msgpack-encoded `Envelope`; its `body` is one member of a closed,
tagged union (msgspec `Struct, tag=...`). Tags are explicit and stable: they are the wire names,
and renaming a class must not change them. New fields are appended with defaults so that peers of
two releases can read each other during a rollover (msgspec's schema-evolution rules).

Frames carry no behaviour. Each channel's vocabulary is a union alias below; a receiver that gets
a body outside its channel answers `Error(code="unexpected")`.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

import msgspec

from orchestra_sup.errors import ErrorCode


class FailureClass(enum.StrEnum):
    """Why a lane or a task failed, as a typed class (ARCHITECTURE.md §7; seeds/003
    "Supervision: typed failures, named strategies"): a `LaneResult`'s and a task report's
    `failure`. A shard says the first five; the coordinator the last two.

    - `quality_miss`: a program judged its own result not good enough (`Outcome.failure`).
    - `tool_failure`: a command failed (non-zero exit, killed, could not be spawned), or a
      program raised or failed without a class.
    - `budget_exhaustion`: the lane spent its grant in some dimension (`Budget`), or its task or
      plan had nothing left to carve a lane from.
    - `timeout`: the task's `timeout_s` passed; the command's whole process group was killed.
    - `preflight_escalation`: a program refused to go on without a human (`Outcome.failure`),
      or a human rejected the task before it ran.
    - `worker_process_loss`: the shard running the lane exited.
    - `quota_breach`: the plan's tenant was over a quota when the lane was to start; nothing
      started and nothing was spent.
    """

    QUALITY_MISS = "quality_miss"
    TOOL_FAILURE = "tool_failure"
    BUDGET_EXHAUSTION = "budget_exhaustion"
    TIMEOUT = "timeout"
    PREFLIGHT_ESCALATION = "preflight_escalation"
    WORKER_PROCESS_LOSS = "worker_process_loss"
    QUOTA_BREACH = "quota_breach"


class Frame(msgspec.Struct, frozen=True, kw_only=True, tag_field="t"):
    """Base of every frame body."""


# --- shared values -------------------------------------------------------------------------------


class Budget(msgspec.Struct, frozen=True, kw_only=True):
    """Spend limits; None in a dimension is no limit there (ARCHITECTURE.md §7, seeds/003
    "Cost and budget enforcement").

    - `wall_s`: wall-clock seconds (float) the lane runs; time it waits for a human is not
      counted.
    - `cpu_s`: CPU seconds (float, user + system) of every process the lane's commands start.
    - `output_bytes`: bytes (int) its commands write on stdout and stderr, plus what it `emit`s.

    A plan's and a task's `budget` are declared in the plan; a lane's (`LaneStart.budget`) is the
    grant carved from them when it is spawned (`coordinator.budget`).
    """

    wall_s: float | None = None
    cpu_s: float | None = None
    output_bytes: int | None = None


class Spend(msgspec.Struct, frozen=True, kw_only=True):
    """What a lane (or a task, or a plan: the sum of its lanes) spent, in `Budget`'s units."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    output_bytes: int = 0


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    """A human's answer to a HITL pause (ARCHITECTURE.md §11 invariant 9).

    - `verdict`: "approve" (go on; `grant` and `retries` add to the task's budget and retry cap),
      "reject" (`text` is the reason: revision feedback), "redirect" (`text` says what to do
      instead), "accept_partial" (take what there is and end the step).
    - `responder`, `uid`: who answered, stamped by the supervisor from the ctl connection's peer
      credentials, never taken from the request; `at`: when it was recorded (Unix seconds).
    """

    verdict: Literal["approve", "reject", "redirect", "accept_partial"]
    text: str = ""
    grant: Budget | None = None
    retries: int = 0
    responder: str = ""
    uid: int = -1
    at: float = 0.0


class TaskSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One task of a plan, as validated by `coordinator.plan.parse_plan`.

    `timeout_s` is wall-clock seconds for the command (None: no limit); `requires` are the
    capabilities its shard must offer (`coordinator.placement`).
    """

    id: str
    run: str
    needs: list[str] = []
    timeout_s: float | None = None
    commit: bool = False
    requires: list[str] = []
    program: str = "shell"
    """What the lane runs (`shards.program`): `shell` runs `run`; `module:Class` is a lane
    program listed in `[lanes] programs`, and `run` is its argument string."""
    retries: int = 0
    """Retries after the first attempt (0..100): the retry cap of `coordinator.strategy`."""
    backoff_s: float = 1.0
    """Seconds before the first retry; each next one waits twice as long (at most
    `coordinator.strategy.MAX_BACKOFF_S`)."""
    on_failure: Literal["escalate", "retry", "pause"] | None = None
    """What a failure of this task does (`coordinator.strategy.task_strategy`); None: "retry"
    when `retries` > 0, else "escalate"."""
    approve: bool = False
    """Pause for a human before the task's first attempt runs."""
    budget: Budget | None = None
    """The task's budget over all its attempts (None: only the plan's)."""
    tenant: str | None = None
    """Whom this task runs for, instead of its plan's tenant (None: the plan's): the shards
    that may take it and the quota it counts against (`coordinator.placement.tenant_of`)."""


class PlanSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A whole plan: a name, its tasks in file order, and the tenant it runs for (None: none
    named; only shards that serve every tenant take its lanes)."""

    name: str
    tasks: list[TaskSpec]
    tenant: str | None = None
    budget: Budget | None = None
    """The plan's budget: every lane's grant is carved from what is left of it."""
    strategy: Literal["one_for_one", "one_for_all", "rest_for_one"] = "one_for_one"
    """Which tasks a retry re-runs (`coordinator.strategy`): the failed one, every task of the
    plan, or the failed one and every task after it in file order."""
    replan: dict[str, str] = {}
    """Failure class -> action (`coordinator.strategy.SelectiveReplan`); empty: none."""


class TaskReport(msgspec.Struct, frozen=True, kw_only=True):
    """One task's outcome, as `ctl plan --json` prints it. `duration_s` is seconds.

    `attempts` counts the task's placements (1 + re-placements after lost worker processes);
    `failure` is the failure class of a failed task when one applies (`worker_process_loss`: its
    worker process was lost `[lanes] max_worker_loss` times; see `coordinator.runner.FailureClass`),
    else None; `warnings` are things to know about the result, oldest first (a partial-work
    warning for each lost worker process).
    """

    id: str
    status: str
    exit_code: int | None = None
    attempts: int = 0
    shard: str | None = None
    lane: str | None = None
    """Its latest lane; while it waits for a human with none (an approval before its first
    attempt), the lane id that answers the pause, and that will run it."""
    sandbox: str | None = None
    duration_s: float = 0.0
    output_tail: str = ""
    commit: str | None = None
    error: str | None = None
    failure: str | None = None
    warnings: list[str] = []
    ticket: str | None = None
    """The affinity ticket of its latest placement (`coordinator.placement.AffinityTicket`)."""
    spent: Spend = Spend()
    """What all its attempts spent."""
    question: str | None = None
    """What it waits for a human about (`status` "awaiting_approval"), else None."""
    answers: list[Answer] = []
    """Every answer a human gave it, oldest first."""
    retry_at: float | None = None
    """When its next attempt may start (Unix seconds) while it backs off, else None."""
    notes: list[str] = []
    """What its lanes' programs told the coordinator ("<lane>: <text>"), oldest first."""
    accepts: list[str] = []
    """The answers its pause takes (`CtlRespond.verdict`s), [] when it waits on nothing (or
    the coordinator is older than this field)."""
    needs_retries: bool = False
    """Its pause takes an approval only with retries granted (`ctl approve LANE --retries N`):
    a failed attempt with no retry left."""


class PlanReport(Frame, tag="plan_report"):
    """A plan and its tasks; `ok` is true when every task succeeded."""

    plan: str
    id: str
    done: bool
    ok: bool
    tasks: list[TaskReport]
    spent: Spend = Spend()
    budget: Budget | None = None


class Descriptors(msgspec.Struct, frozen=True, kw_only=True):
    """A process's file descriptors (`descriptors.usage`, `protocol.connections`): `open`
    against its soft open-file `limit`; `refused`: connections its answering listeners (ctl)
    refused beyond their bound or near the limit; `closings`: times a listener of it stopped
    taking new connections near the limit; `shut`: the sockets ("ctl", "supervisor", a child's
    name) that take none now."""

    open: int
    limit: int
    refused: int = 0
    closings: int = 0
    shut: list[str] = []


class ExitInfo(msgspec.Struct, frozen=True, kw_only=True):
    """How a child last exited: exactly one of `signal` and `status` is set."""

    signal: int | None = None
    status: int | None = None


class ChildInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One child as the supervisor's control record has it. `uptime_s` is seconds (0 if down);
    `loop_lag_ms` is (p50, p99, max) of its event-loop lag in milliseconds over its sliding
    window (`runtime.looplag.LoopLag`), from its last heartbeat (None before the first)."""

    name: str
    role: str
    pid: int | None
    generation: int
    state: str
    restarts: int
    operator_restarts: int
    uptime_s: float
    last_exit: ExitInfo | None = None
    endpoint: str = ""
    capacity: int = 0
    loop_lag_ms: tuple[float, float, float] | None = None
    capabilities: list[str] = []
    tenants: list[str] = []
    release: str = ""
    """The interpreter its process runs (`orchestra_sup.release`); "" when it has none."""
    version: str = ""
    """The orchestra-sup version its process said in its handshake ("" before one)."""
    stale_frames: int = 0
    """Frames it refused as coming from a retired generation, from its last heartbeat."""
    bad_frames: int = 0
    """Frames it refused as undecodable (garbage, oversized, unknown tag, wrong type or
    protocol version) on any of its sockets, from its last heartbeat."""
    internal_errors: int = 0
    """Requests it answered `internal` (an unexpected exception serving them), from its last
    heartbeat."""
    relay_ms: tuple[float, float, float] | None = None
    """(p50, p99, max) of the coordinator's relay round trips in milliseconds, from its last
    heartbeat's histogram (bucket upper bounds, so an upper estimate); None elsewhere."""
    lanes: dict[str, int] = {}
    """A shard's live lanes by state, from its last heartbeat."""
    inbox_depth: int | None = None
    """The coordinator's unhandled durable inbox entries, from its last heartbeat."""
    persist_depth: int = 0
    """Rows its write-behind queue held at its last heartbeat."""
    descriptors: Descriptors | None = None
    """Its file descriptors, from its last heartbeat (None before the first)."""


class LaneInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One live lane as its shard reports it."""

    lane: str
    task: str | None
    plan: str | None
    shard: str
    state: str
    sandbox: str | None
    question: str | None = None
    """What it waits for a human about (state "awaiting_approval"), else None."""
    since: float | None = None
    """When it started waiting for that answer (Unix seconds)."""
    accepts: list[str] = []
    """The answers that pause takes, as `TaskReport.accepts`."""
    needs_retries: bool = False
    """As `TaskReport.needs_retries`."""


class ResultStatus(enum.StrEnum):
    """How a lane ended (`LaneResult.status`); on the wire, its value."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"  # `ctl cancel`
    INTERRUPTED = "interrupted"  # its shard was stopped: not a verdict on the work


class LaneResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a lane reports to the coordinator when it ends.

    `status` is "succeeded", "failed", "cancelled" (`ctl cancel`) or "interrupted" (its shard was
    stopped: not a verdict on the work, which runs again); `error` says why when it is not
    "succeeded"; `warnings` are things to know about the result, oldest first (a partial-work
    warning when a rollover stopped its step and the next generation re-ran it).
    """

    lane: str
    plan: str
    task: str
    shard: str
    status: ResultStatus
    exit_code: int | None
    duration_s: float
    output_tail: str
    sandbox: str | None
    commit: str | None
    error: str | None
    warnings: list[str] = []
    failure: FailureClass | None = None
    """The failure class when `status` is "failed"."""
    spent: Spend = Spend()
    """What the lane spent (this attempt, across the generations that ran it)."""


class HitlPause(msgspec.Struct, frozen=True, kw_only=True):
    """A lane's program asked a human (`LaneContext.ask_human`): question `key` (unique within
    the task's attempts), its `question` text, when (`asked_at`, Unix seconds)."""

    lane: str
    plan: str
    task: str
    shard: str
    key: str
    question: str
    asked_at: float


class LaneNote(msgspec.Struct, frozen=True, kw_only=True):
    """What a lane's program tells the coordinator (`LaneContext.tell_coordinator`)."""

    lane: str
    plan: str
    task: str
    text: str
    at: float


# --- control channel: supervisor <-> child -------------------------------------------------------


class Hello(Frame, tag="hello"):
    """First frame of a child to the supervisor. The child is running only once it is welcomed."""

    role: str
    name: str
    generation: int
    release: str
    proto_min: int
    proto_max: int
    pid: int
    version: str = ""


class Welcome(Frame, tag="welcome"):
    """The supervisor accepts a `Hello`."""

    generation: int


class Reject(Frame, tag="reject"):
    """The supervisor refuses a `Hello`; the child exits with `reason` in its log."""

    reason: str


class Histogram(msgspec.Struct, frozen=True, kw_only=True):
    """Observations of one quantity since its process started, bucketed Prometheus-style:
    `counts[i]` is how many were <= `bounds[i]` (cumulative, so non-decreasing), and the last
    of `counts`, one longer than `bounds`, is the total (the +Inf bucket). `total` is the sum of
    every observation, in the quantity's unit (seconds, rows). Never decreases while its process
    lives; a new generation starts again from zero (a counter reset to Prometheus)."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float = 0.0


class Heartbeat(Frame, tag="heartbeat"):
    """Periodic liveness from a child, carrying its event-loop lag (milliseconds; None before
    its first sample)."""

    loop_lag_p50_ms: float | None = None
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None
    load: int = 0
    stale_frames: int = 0
    """Frames refused so far because their sender's generation was retired, or because they
    were meant for another generation of this child (`Envelope.dest_gen`)."""
    bad_frames: int = 0
    """Frames refused so far as undecodable (`Endpoint.bad_frames` over all its sockets)."""
    internal_errors: int = 0
    """Requests answered `internal` so far: serving them raised an unexpected exception, or
    their reply could not be encoded (`Endpoint.internal_errors` over all its sockets, and its
    front's)."""
    loop_lag: Histogram | None = None
    """Every loop-lag sample since the process started, in seconds."""
    relay: Histogram | None = None
    """The coordinator's relay calls (tool calls to the custodian and shards): round trip in
    seconds, from send to answer; None in other roles."""
    lanes: dict[str, int] = {}
    """A shard's live lanes by state (starting, running, awaiting_approval); {} elsewhere."""
    inbox_depth: int | None = None
    """The coordinator's durable inbox entries not yet handled; None in other roles."""
    persist_depth: int = 0
    """Rows queued for the write-behind persistence thread, not yet committed."""
    persist_batches: Histogram | None = None
    """Rows per write-behind transaction since the process started; None before the first."""
    outbox_depth: int = 0
    """A shard's messages to the coordinator (results, pauses, notes) not yet acknowledged
    (`shards.outbox`); 0 in other roles. A shard a reload retires is quiet only at 0 lanes
    and 0 here."""
    descriptors: Descriptors | None = None
    """Its file descriptors now (None from a release that does not say)."""


class PeerState(msgspec.Struct, frozen=True, kw_only=True):
    """One peer in a `Roster`: where it listens, which generation, whether it is up; for a shard,
    its lane capacity, the capabilities it offers and the tenants it serves (empty: all)."""

    name: str
    role: str
    generation: int
    up: bool
    endpoint: str
    capacity: int = 0
    capabilities: list[str] = []
    tenants: list[str] = []
    stopping: bool = False
    """Up, but being stopped (an operator restart, a rollover): it takes no new work."""
    draining: list[int] = []
    """Older generations of this peer still alive while a rollover drains them (a shard's surge):
    their frames are not stale, and work placed on them is moving here, not lost."""


class TreeStopping(Frame, tag="tree_stopping"):
    """The supervisor is about to stop the tree: the coordinator starts nothing more, and a shard
    that goes down from now on interrupts its lanes rather than losing them."""


class RecoverChild(Frame, tag="recover_child"):
    """The coordinator found shard `name` down when it had a lane to start: the supervisor ends
    that child's restart backoff now, if it is in one (answered with `Ack`)."""

    name: str


class Roster(Frame, tag="roster"):
    """The supervisor's view of every peer, pushed to each child whenever it changes."""

    peers: list[PeerState]


class Ack(Frame, tag="ack"):
    """A request was carried out and has nothing more to say."""


class Error(Frame, tag="error"):
    """A request failed; `code` says which kind (see `errors.ErrorCode`)."""

    code: ErrorCode
    message: str


# --- sandbox channel: shard -> custodian ---------------------------------------------------------


class SandboxCreate(Frame, tag="sandbox_create"):
    """Ask the custodian for a checkout of the workspace's current head for `lane`."""

    lane: str


class SandboxReady(Frame, tag="sandbox_ready"):
    """A sandbox exists at `path`, checked out at `rev`."""

    lane: str
    path: str
    rev: str


class SandboxCommit(Frame, tag="sandbox_commit"):
    """Commit the lane's sandbox changes into the workspace's current branch."""

    lane: str
    message: str


class CommitDone(Frame, tag="commit_done"):
    """`commit` is the new workspace commit, or None when the sandbox had no change."""

    lane: str
    commit: str | None


# --- relay: coordinator -> custodian / shards ----------------------------------------------------


class ToolCall(Frame, tag="tool_call"):
    """One coordinator tool call. `params` are the tool's named string parameters; `key` is the
    idempotency key of a send (None for reads)."""

    tool: str
    params: dict[str, str] = {}
    key: str | None = None


class ToolResult(Frame, tag="tool_result"):
    """A tool's answer: a JSON-shaped value whose shape each tool documents."""

    value: Any


# --- lane plane: coordinator -> shard ------------------------------------------------------------


class LaneStart(Frame, tag="lane_start"):
    """Start `task` of `plan` as lane `lane`; refused with `shard_full` when the shard is full.

    `attempt` counts the task's placements from 1; `warnings` are what the coordinator knows the
    lane should be told about earlier attempts (a partial-work warning when one was interrupted by
    a lost worker process), oldest first.
    """

    lane: str
    plan: str
    task: TaskSpec
    attempt: int = 1
    plan_name: str = ""
    warnings: list[str] = []
    budget: Budget | None = None
    """This lane's grant, carved from its task's and its plan's budgets (None: no limit)."""
    feedback: str | None = None
    """Revision feedback for this attempt (a rejection's reason, a redirect, the previous
    attempt's error after a quality miss): `$ORCHESTRA_FEEDBACK`, `LaneContext.feedback`."""
    answers: dict[str, Answer] = {}
    """Answers already recorded for the task's questions, by key: an `ask_human` with one of
    these keys returns at once (a re-run after its shard was lost while it waited)."""


class HitlAnswer(Frame, tag="hitl_answer"):
    """Answer lane `lane`'s question `key` (recorded by the coordinator before it is sent).
    Answered `Ack`; `Error(not_found)` when the shard has no such lane. Idempotent: a second
    answer to a key already answered is acknowledged and ignored."""

    lane: str
    key: str
    answer: Answer


class LaneCancel(Frame, tag="lane_cancel"):
    """Stop lane `lane` now, its whole process group with it."""

    lane: str


class ListLanes(Frame, tag="list_lanes"):
    """Ask a shard for its live lanes; with `results`, also for the lanes whose result waits in
    its durable outbox (adopting first what a retired generation of it left there)."""

    results: bool = False


class LaneList(Frame, tag="lane_list"):
    """A shard's live lanes; `results` names the lanes whose result waits in its outbox (only
    when asked: `ListLanes.results`)."""

    lanes: list[LaneInfo]
    results: list[str] = []
    unanswered: list[str] = []
    """`ctl lanes`: the children that did not answer (their lanes or pauses are not listed)."""


# --- inbox: shard outbox -> coordinator inbox ----------------------------------------------------


class InboxPut(Frame, tag="inbox_put"):
    """A durable message for the coordinator; `msg_id` is unique and used to de-duplicate."""

    msg_id: str
    result: LaneResult | None = None
    pause: HitlPause | None = None
    note: LaneNote | None = None
    """Exactly one of `result`, `pause` and `note` is set."""


class InboxAck(Frame, tag="inbox_ack"):
    """The coordinator committed `msg_id` to its inbox; the sender may drop it from its outbox."""

    msg_id: str


# --- ctl: operator -> supervisor (-> coordinator) ------------------------------------------------


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
    metrics_url: str = ""
    """Where the supervisor serves Prometheus metrics (`start --metrics-port`); "" when off."""
    descriptors: Descriptors | None = None
    """The supervisor's own file descriptors (its `refused` and `shut` are ctl's and the
    control socket's)."""
    ctl_connections: int = 0
    """Ctl connections served now on `ctl.ipc`."""
    ctl_connections_max: int = 0
    """At most this many at once (`[supervisor] ctl_connections`)."""


class CtlRestart(Frame, tag="ctl_restart"):
    name: str


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


DebugAction = Literal["block_loop", "ignore_sigterm", "raise", "raise_in_task"]


class CtlDebug(Frame, tag="ctl_debug"):
    """Fault injection for tests, refused unless the tree runs with ORCHESTRA_SUP_DEBUG_HOOKS=1:
    `block_loop` blocks child `name`'s event loop for `seconds`; `ignore_sigterm` makes it
    ignore SIGTERM from then on; `raise` makes the handler serving this request raise
    `RuntimeError`, `raise_in_task` the task serving it (answered `internal`, as any bug). `name`
    "supervisor" takes the two `raise` actions, served by the supervisor itself."""

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


# --- lane transcripts: ctl -> supervisor -> shards (`ctl logs`) ----------------------------------


class LogRow(msgspec.Struct, frozen=True, kw_only=True):
    """One transcript row of a lane. `seq` counts the lane's rows from 0 without a gap; `ts` is
    when it was recorded (wall clock, seconds since the epoch); `stream` is "stdout" or "stderr"
    (one chunk of the command's output, as it was read) or "event" (a lane event, one line);
    `data` is the text (UTF-8, invalid bytes as U+FFFD)."""

    seq: int
    ts: float
    stream: Literal["stdout", "stderr", "event"]
    data: str


class CtlLogs(Frame, tag="ctl_logs"):
    """Ask for lane `lane`'s transcript rows after `after_seq` (-1: from the first), at most
    `limit`; with `wait_s` > 0 and no such row yet, the answer is held until one comes, the lane
    ends, or `wait_s` seconds have passed (a long poll). Answered with `LogChunk`, or `Error`
    `not_found` when no shard knows the lane."""

    lane: str
    after_seq: int = -1
    wait_s: float = 0.0
    limit: int = 1000


class LaneLogs(Frame, tag="lane_logs"):
    """`CtlLogs` as the supervisor forwards it to each shard."""

    lane: str
    after_seq: int = -1
    wait_s: float = 0.0
    limit: int = 1000


class LogChunk(Frame, tag="log_chunk"):
    """Rows of a lane's transcript, oldest first. `found` is false when this shard does not know
    the lane; `done` is true when the lane has ended and `rows` reach its last row."""

    lane: str
    rows: list[LogRow]
    done: bool
    found: bool


# --- rollover: ctl -> supervisor -> children (`ctl rollover`, ARCHITECTURE.md §9) ----------------


class ReleaseInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What a release says of itself (`python -m orchestra_sup.release`): the interpreter,
    the orchestra-sup version it has installed, and the protocol range it speaks."""

    python: str
    version: str
    proto_min: int
    proto_max: int


class Quiesce(Frame, tag="quiesce"):
    """Supervisor -> coordinator or custodian: reach a quiet point within `timeout_s` seconds
    and hold there (coordinator: no turn open, no start or commit in flight, no stop in progress;
    custodian: no write in flight), answered with `Quiesced`; `Error(timeout)` when none came.
    A held child is then stopped, or told `Resume`."""

    timeout_s: float


class Quiesced(Frame, tag="quiesced"):
    """The child is at a quiet point and holds there; `held` says what it holds (one line)."""

    held: str = ""


class Resume(Frame, tag="resume"):
    """Leave the quiet point (a rollover rolled back); answered with `Ack`."""


class LaneSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A lane parked at a quiet point, as its new generation resumes it.

    `checkpoint` is the program's last `LaneContext.checkpoint` value (None: none taken);
    `mailbox` its unread messages, oldest first; `message_keys` the idempotency keys it has seen,
    oldest first; `next_seq` its next transcript row; `partial` is true when its step was
    interrupted (the drain timed out) and re-runs with a partial-work warning; `elapsed_s` the
    seconds it had run so far; `spent` what it had spent so far (its `wall_s` leaves out the time
    it waited for a human), which the next generation goes on counting against `start.budget`;
    `asked` the `ask_human` calls its program had made when it took `checkpoint` (the next
    generation numbers its default question keys after them); `notes` the `tell_coordinator`
    calls it had made (the next note is numbered after them). `start.answers` includes the
    answers the lane had received.
    """

    start: LaneStart
    sandbox: str | None = None
    checkpoint: Any = None
    mailbox: list[str] = []
    message_keys: list[str] = []
    next_seq: int = 0
    partial: bool = False
    elapsed_s: float = 0.0
    spent: Spend = Spend()
    asked: int = 0
    notes: int = 0


class Drain(Frame, tag="drain"):
    """Supervisor -> a shard generation being rolled over: admit nothing more; park each lane at
    its next quiet point and hand its snapshot to generation `successor_gen` of the same shard
    (`LaneResume`); a lane still not quiet after `timeout_s` seconds is stopped and handed over
    `partial`. Answered with `Drained` once no lane is left and the outbox is delivered."""

    successor_gen: int
    timeout_s: float


class LaneMove(msgspec.Struct, frozen=True, kw_only=True):
    """One lane as a drain dealt with it: `how` is "moved" (resumed on the successor),
    "partial" (moved after its step was stopped), "finished" (ended on the old generation) or
    "lost" (could not be handed over); `elapsed_s` is how long it took, seconds."""

    lane: str
    how: Literal["moved", "partial", "finished", "lost"]
    elapsed_s: float
    detail: str = ""


class Drained(Frame, tag="drained"):
    lanes: list[LaneMove]


class LaneResume(Frame, tag="lane_resume"):
    """Old shard generation -> its successor: host this lane from its snapshot (`Ack`)."""

    snapshot: LaneSnapshot


class CtlRollover(Frame, tag="ctl_rollover"):
    """`ctl rollover NAME --release PYTHON`: NAME is a child, `shards` or `all`; `release` is an
    interpreter path ("" = the supervisor's own); `drain_timeout_s` None = the configured one.
    Answered with the first `RolloverReport` (the release was accepted, nothing moved yet), or an
    `Error` when it is refused before anything moves."""

    name: str
    release: str = ""
    drain_timeout_s: float | None = None


class CtlRolloverStatus(Frame, tag="ctl_rollover_status"):
    """Events of rollover `id` after `after_seq`; with `wait_s` > 0 held until there is one or
    the rollover is done (a long poll)."""

    id: str
    after_seq: int = -1
    wait_s: float = 0.0


class RolloverEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One step of a rollover: `at_s` seconds since it began, `child` what moved ("" for the
    whole), `text` one line, `took_s` the step's own duration in seconds (None: not a step)."""

    seq: int
    at_s: float
    child: str
    text: str
    took_s: float | None = None


class RolloverReport(Frame, tag="rollover_report"):
    """A rollover and its events after the asked `after_seq`. `ok` is None until `done`; then
    true when everything moved, false when it rolled back or stopped (`error` says why)."""

    id: str
    target: str
    release: ReleaseInfo
    done: bool
    ok: bool | None
    events: list[RolloverEvent]
    error: str | None = None
    reexecuting: bool = False
    """The supervisor is about to re-execute itself: a poll sent now may be lost in the exec,
    so ask again soon rather than wait out a long poll."""


Control = (
    Hello
    | Welcome
    | Reject
    | Heartbeat
    | Roster
    | TreeStopping
    | RecoverChild
    | Quiesce
    | Quiesced
    | Resume
    | Drain
    | Drained
)
Rollover = CtlRollover | CtlRolloverStatus | RolloverReport
Sandbox = SandboxCreate | SandboxReady | SandboxCommit | CommitDone
Relay = ToolCall | ToolResult


class LaneMessage(Frame, tag="lane_message"):
    """Deliver `text` to lane `lane`. `key` is the idempotency key: a second message with the
    same key to the same lane is acknowledged as a duplicate and not delivered again."""

    lane: str
    text: str
    key: str


class MessageAck(Frame, tag="message_ack"):
    """`duplicate` is true when `key` had been delivered before (nothing happened this time)."""

    lane: str
    key: str
    duplicate: bool


LanePlane = (
    LaneStart
    | LaneCancel
    | ListLanes
    | LaneList
    | LaneLogs
    | LogChunk
    | LaneMessage
    | MessageAck
    | LaneResume
    | HitlAnswer
)
Inbox = InboxPut | InboxAck
Ctl = (
    CtlStatus
    | StatusReply
    | CtlRestart
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
    | CtlBenchRelay
    | BenchSamples
    | CtlDebug
    | DebugHook
    | CtlLogs
    | CtlReload
    | ReloadReport
)
Body = Control | Sandbox | Relay | LanePlane | Inbox | Ctl | Rollover | Ack | Error


ENVELOPE_ID_MAX = 256
"""Characters an envelope's `id`, `corr` and `sender` may hold (ours are a name, a generation
and a counter: tens). A longer one is a `bad_frame`: every answer echoes the id, so an id
near the frame limit would make every answer to it too large to send."""

MessageId = Annotated[str, msgspec.Meta(max_length=ENVELOPE_ID_MAX)]


class Envelope(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """The one thing a ZeroMQ message carries.

    - `v`: protocol version of the sender.
    - `id`: message id, unique per sender incarnation.
    - `corr`: the `id` this frame answers, or None for a request or a one-way frame.
    - `sender`, `gen`: who sent it and which generation of it.
    - `id`, `corr` and `sender` hold at most `ENVELOPE_ID_MAX` characters.
    - `ttl_s`: seconds the sender will wait for an answer (None: no reply expected or no limit).
    - `dest_gen`: the generation of the receiver the sender means (None: any); a receiver of another
      generation refuses the frame with `stale_generation`, so a request queued for a process that
      died is never acted on by its replacement.
    """

    v: int
    id: MessageId
    corr: MessageId | None
    sender: MessageId
    gen: int
    ttl_s: float | None
    dest_gen: int | None
    body: Body

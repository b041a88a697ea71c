"""Values carried inside frames by more than one channel: budgets and spend, tasks and
plans, lanes and their results, children and peers, histograms, transcript rows.

They are plain Structs, not frame bodies (no tag); new fields are appended with defaults, as for
frames.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

import msgspec


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
    rev: str | None = None
    """The revision of the workspace its sandbox is made at, as git names it (a sha, a short
    sha, a branch, `HEAD~3`), resolved by the custodian when the sandbox is made; None: the
    workspace's head. One that names no commit fails the lane (`SandboxCreate.rev`)."""
    feedback: str | None = None
    """Revision feedback for its first attempt (`LaneStart.feedback`, `$ORCHESTRA_FEEDBACK`),
    when no other feedback applies (at most 64 KiB of UTF-8; None: none)."""


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
    coordinator: str = "dag"
    """What decides which lanes run (`coordinator.context`): "dag" runs `tasks`; any other is a
    coordinator program, and the plan is its session (`tasks` is empty)."""
    args: dict[str, Any] = {}
    """What a coordinator program is built with (the plan's `[args]`, TOML values)."""


class PlanOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How a session ended: what its program returned (`result`, JSON values), or the one-line
    `error` that failed it; `at` is when, Unix seconds."""

    result: Any = None
    error: str | None = None
    at: float = 0.0


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
    rev: str | None = None
    """The full sha its latest lane's sandbox was made at (`SandboxReady.rev`), once a lane of
    it ended with a sandbox; None before, or from a coordinator older than this field."""
    stamps_ns: tuple[int | None, int | None] | None = None
    """For its latest ended lane: (when its shard received its `LaneStart`, `LaneResult.
    start_received_ns`; when its result reached the coordinator, `InboxPut.received_ns`), each
    None when not stamped; None before a lane ended. CLOCK_MONOTONIC nanoseconds of the tree's
    host, for `bench reaction`: compare them with each other, never with wall-clock times."""


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
    fenced: int = 0
    """Hosts' results or commits it refused as fenced (`Heartbeat.fenced`), from its last
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
    cpu: str = ""
    """The CPU class and affinity the kernel applies to its process ("fifo 4, cpus 0", "other
    nice 0, cpus 0-1": `system.cpupolicy.in_force`); "" when it has none."""


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
    rev: str | None = None
    """The full sha its sandbox was made at (`SandboxReady.rev`); None: it had none."""
    start_received_ns: int | None = None
    """When its shard received this attempt's `LaneStart`: CLOCK_MONOTONIC nanoseconds
    (`time.monotonic_ns`, one clock for every process of a host), for `bench reaction`; None
    for a lane a hand-over resumed (`LaneResume`), and from a shard older than this field."""
    fence: int = 0
    """Its `LaneStart.fence`: from a host, the coordinator takes the result only while it is
    the placement's token (0: a lane of the root's own shards)."""


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


class Histogram(msgspec.Struct, frozen=True, kw_only=True):
    """Observations of one quantity since its process started, bucketed Prometheus-style:
    `counts[i]` is how many were <= `bounds[i]` (cumulative, so non-decreasing), and the last
    of `counts`, one longer than `bounds`, is the total (the +Inf bucket). `total` is the sum of
    every observation, in the quantity's unit (seconds, rows). Never decreases while its process
    lives; a new generation starts again from zero (a counter reset to Prometheus)."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float = 0.0


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
    boot: str = ""
    """For a host's shard, its host agent's boot id: the host's generations start again at 1
    when its agent does, so an affinity ticket to it carries this, not the tree's ("": one of
    the root's own)."""
    lease: int = 0
    """For a host's shard, the etcd lease its host's registration is under: the lanes placed
    on it are keys under that lease (`cluster.fences`; 0: one of the root's own)."""


class LogRow(msgspec.Struct, frozen=True, kw_only=True):
    """One transcript row of a lane. `seq` counts the lane's rows from 0 without a gap; `ts` is
    when it was recorded (wall clock, seconds since the epoch); `stream` is "stdout" or "stderr"
    (one chunk of the command's output, as it was read) or "event" (a lane event, one line);
    `data` is the text (UTF-8, invalid bytes as U+FFFD)."""

    seq: int
    ts: float
    stream: Literal["stdout", "stderr", "event"]
    data: str

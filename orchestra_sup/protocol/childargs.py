"""What the supervisor tells a child when it starts it (one JSON argument on its command line)."""

from __future__ import annotations

import msgspec

from orchestra_sup.cluster.settings import ClusterSettings
from orchestra_sup.logformat import LogFormat
from orchestra_sup.system.cpupolicy import CpuPlan
from orchestra_sup.system.isolation import IsolationSettings
from orchestra_sup.system.reserve import MinFree


class Quota(msgspec.Struct, frozen=True, kw_only=True):
    """One tenant's ceilings (None: no ceiling there).

    - `concurrency`: lanes of the tenant live at once (placed and not ended).
    - `rate`: lanes started in the last `window_s` seconds.
    - `wall_s`, `cpu_s`: wall and CPU seconds spent by its lanes that ended in the last
      `window_s` seconds.
    - `window_s`: the rolling window, seconds (default one hour).
    """

    concurrency: int | None = None
    rate: int | None = None
    wall_s: float | None = None
    cpu_s: float | None = None
    window_s: float = 3600.0


class RetentionSettings(msgspec.Struct, frozen=True, kw_only=True):
    """`[retention]`, seconds each: a finished plan (its record, its inbox entries, its
    session's state, and with a session the plans it started) is pruned `plans_s` after it
    finished (default 30 days); its idempotency key goes on answering a submission that
    repeats it until `keys_s` after (default 90 days; at least `plans_s`: a key outlives its
    plan); a finished lane's sandbox is removed `sandboxes_s` after its lane ended (default a
    day), by the custodian, or on a host by its mirror; a finished lane's transcript
    `transcripts_s` after (default 7 days, by its shard, which is told it apart as
    `ChildArgs.transcript_retention_s`); an event of the event log `events_s` after it was
    written (default 30 days); each prunes every `every_s` (default 60 s)."""

    plans_s: float = 30 * 86_400.0
    keys_s: float = 90 * 86_400.0
    sandboxes_s: float = 86_400.0
    transcripts_s: float = 7 * 86_400.0
    events_s: float = 30 * 86_400.0
    every_s: float = 60.0


class ChildArgs(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a child needs to join its tree.

    `supervisor_pid` lets the child notice it was orphaned before `PR_SET_PDEATHSIG` took hold;
    `heartbeat_s` is the interval of its heartbeats, seconds; `max_worker_loss` is the coordinator's
    `[lanes] max_worker_loss` (losses of its worker process after which a task fails);
    `lane_grace_s` is how long a stopping shard lets its lanes' commands end after SIGTERM;
    `transcript_retention_s` is `[retention] transcripts_s` (seconds a shard keeps a finished
    lane's transcript); `relay_deadline_s` is `[relay] deadline_s` (the coordinator's tool-call
    deadline, seconds); `boot` identifies this run of the tree (affinity tickets carry it, since
    generations start again at 1 in the next run); `endpoint` is where it binds its ROUTER
    ("": `ipc://<run_dir>/<name>.ipc`; a surge generation binds beside the running one, at
    `<name>.<generation>.ipc`; a colocated component at `inproc://<name>.<generation>`).
    """

    role: str
    name: str
    generation: int
    run_dir: str
    state_dir: str
    workspace: str | None
    lanes_per_shard: int
    supervisor_pid: int
    heartbeat_s: float = 0.5
    max_worker_loss: int = 3
    lane_grace_s: float = 5.0
    transcript_retention_s: float = 7 * 24 * 3600.0
    prune_every_s: float = 60.0
    """`[retention] every_s`, for a shard: seconds between two prunes of its transcripts."""
    boot: str = ""
    relay_deadline_s: float = 55.0
    lane_nice: int = 10
    lane_programs: list[str] = []
    coordinator_programs: list[str] = []
    previous_exit: str = ""
    """Why this child's previous process ended (`supervisor.core.ExitCause`: "watchdog",
    "exit_code", "signal", "stopped", ...; "rttime" for a death by SIGXCPU, RLIMIT_RTTIME's; ""
    for its first): the coordinator's seat blames a
    program only for a death that was the process's own (`coordinator.seat.BLAMED_EXITS`)."""
    """`[coordinator] programs`: the `module:Class` coordinator programs a plan may name."""
    endpoint: str = ""
    quotas: dict[str, Quota] = {}
    """`[quotas]`: tenant -> ceilings, for the coordinator (`coordinator.quota`)."""
    retention: RetentionSettings = RetentionSettings()
    """`[retention]`, for the coordinator (`coordinator.retention`)."""
    min_free: MinFree = MinFree()
    """`[state] min_free`, for the coordinator (below it, it refuses new plans and lanes) and
    the custodian (below it, ended lanes' sandboxes go at once) (`system.reserve`)."""
    isolation: IsolationSettings = IsolationSettings(mode="none")
    """`[isolation]` with its mode resolved ("bwrap" or "none"), for a shard's lanes."""
    log_format: LogFormat = LogFormat.TEXT
    """The supervisor's `start --log-format`: how this child writes its log (`logformat`)."""
    cpu: CpuPlan = CpuPlan()
    """`[cpu]`: the class, RLIMIT_RTTIME and affinity this child applies to itself before anything
    else (`system.cpupolicy.role_plans`)."""
    lane_cpu: str = "nice"
    """`[cpu] lanes`, for a shard: its lanes' CPU class ("nice" or "idle"; `system.lanecpu`)."""
    keys_dir: str | None = None
    """The CURVE keys directory of `start --keys` (None: none, or the default one inside the
    state directory): one more directory no lane sees (`system.isolation`). A child whose
    roster names peers on `tcp://` reads its CURVE keys there (`runtime.remote`)."""
    cluster_listen: str = ""
    """For the root's coordinator and custodian: `[cluster] coordinator_listen` or
    `custodian_listen`, the CURVE port hosts' processes reach it at ("": no hosts)."""
    host: str = ""
    """For a child of a host's agent: the host's name (`orchestra-sup host --name`). It speaks
    to the root as `<host>/<name>`, with the host's key (""; a child of the root)."""
    sandboxes: str = "custodian"
    """For a shard: the peer that makes its lanes' sandboxes: the custodian, or on a host the
    host's mirror ("mirror")."""
    fences: ClusterSettings = ClusterSettings()
    """For the root's coordinator and custodian of a tree hosts join (`[cluster] listen`):
    the `[cluster]` whose etcd keeps the lanes' fences (`cluster.fences`); else empty."""


def encode(args: ChildArgs) -> str:
    return msgspec.json.encode(args).decode()


def decode(text: str) -> ChildArgs:
    return msgspec.json.decode(text, type=ChildArgs)

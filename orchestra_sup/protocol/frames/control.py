"""The control channel: supervisor <-> child (`Control`).

A child's handshake (`Hello`, answered `Welcome` or `Reject`), its `Heartbeat`s, the `Roster` of
peers the supervisor pushes, and what the supervisor tells a child to do: stop starting work
(`TreeStopping`), end a restart backoff (`RecoverChild`), reach and leave a quiet point
(`Quiesce`, `Resume`) or drain its lanes for a rollover (`Drain`, ARCHITECTURE.md §9).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from orchestra_sup.protocol.frames.frame import Frame
from orchestra_sup.protocol.frames.values import Descriptors, Histogram, PeerState


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
    fenced: int = 0
    """Results (the coordinator) and commits (the root's custodian) of hosts' attempts refused
    so far as fenced (`ErrorCode.FENCED`, ADR 0021)."""
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


class Drain(Frame, tag="drain"):
    """Supervisor -> a shard generation being rolled over: admit nothing more; park each lane at
    its next quiet point and hand its snapshot to generation `successor_gen` of the same shard
    (`LaneResume`); a lane still not quiet after `timeout_s` seconds is stopped and handed over
    `partial`. Answered with `Drained` once no lane is left and the outbox is delivered."""

    successor_gen: int
    timeout_s: float


class LeaseHold(Frame, tag="lease_hold"):
    """A host's agent -> its shard, one-way, at every renewal of the host's etcd lease: its lanes
    may run until `stop_by` (CLOCK_BOOTTIME seconds, the machine's), and not after, unless a newer
    hold comes first. So a shard stops its lanes by the lease's deadline even when the agent that
    would stop them is frozen (`shards.deadline`). A root's shards never get one."""

    stop_by: float


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
    | LeaseHold
)

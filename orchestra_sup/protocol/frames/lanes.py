"""The lane plane: coordinator -> shard, and shard -> shard in a rollover (`LanePlane`).

Starting, cancelling and listing lanes, reading their transcripts, messaging them, answering
their questions, and handing a parked lane to the shard's next generation (`LaneResume`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from orchestra_sup.protocol.frames.frame import Frame
from orchestra_sup.protocol.frames.values import Answer, Budget, LaneInfo, LogRow, Spend, TaskSpec


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
    fence: int = 0
    """On a host's shard, the lane's fencing token: the etcd revision that created its key
    under the host's lease (`cluster.fences`, ADR 0021). Its commit and its result carry it,
    and neither is taken once the key is gone. 0: a lane of the root's own shards."""


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
    rev: str | None = None
    """The full sha its sandbox was made at (`SandboxReady.rev`); None: not known (no sandbox
    yet, or an older generation that did not keep it)."""


class LaneResume(Frame, tag="lane_resume"):
    """Old shard generation -> its successor: host this lane from its snapshot (`Ack`)."""

    snapshot: LaneSnapshot


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
LaneRequest = LaneStart | LaneCancel | ListLanes | LaneLogs | LaneMessage | LaneResume | HitlAnswer
"""The lane plane's requests: what a shard serves of it (the rest are their answers)."""

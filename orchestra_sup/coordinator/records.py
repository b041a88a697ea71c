"""A plan's durable records, one per task: what each task is doing, its attempts and its pause.

`TaskRecord` is what the coordinator keeps in LMDB for a task (`coordinator.planstore`), inside
its `runner.PlanRecord`; `Attempt` is one placement of it, `Pending` the HITL pause it waits on.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from orchestra_sup.coordinator.status import TaskStatus
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.frames import FailureClass

MAX_NOTES = 20
"""Notes (`tell_coordinator`) kept per task in its record: the newest. The record is written
again on every change and travels whole in a plan report: what it keeps must stay small (a
plan of 45 program tasks sending 100 notes of 4 KiB each made an 18 MB record, over the frame
limit, and its writes stalled the coordinator past its watchdog)."""
NOTE_CHARS = 500
"""A kept note's text is cut to this many characters (the transcript has it whole)."""


class Pending(msgspec.Struct, kw_only=True):
    """A HITL pause a task waits on.

    - `kind`: "approval" (before its first attempt, `approve = true`), "review" (after a failed
      attempt, `on_failure = "pause"`), "question" (its lane's program asked, `ask_human`).
    - `key`: where its answer is kept in `TaskRecord.answers`; `lane`: the lane id an operator
      answers by (`ctl approve LANE`); `question`: what the human is asked; `since`: when the
      pause was recorded (Unix seconds).
    - `failure`, `error`: the failure a review is about.
    - `asked`: a question's key in its program (`ask_human(key=)`), which the answer is sent
      under; `key` is "<lane>:<asked>", so each lane's question has its own audit entry.
    """

    kind: Literal["approval", "review", "question"]
    key: str
    lane: str
    question: str
    since: float
    failure: FailureClass | None = None
    error: str | None = None
    asked: str | None = None


class Attempt(msgspec.Struct, kw_only=True):
    """One placement of a task: its lane, shard, when it was placed and its grant; once it
    ended, when (Unix seconds), how, and what it spent."""

    lane: str
    shard: str
    placed_at: float
    grant: f.Budget | None = None
    ended_at: float | None = None
    status: str = "running"
    failure: FailureClass | None = None
    spent: f.Spend = f.Spend()


class TaskRecord(msgspec.Struct, kw_only=True):
    """One task's durable record. `shard_gen` is the generation of the shard its lane runs on.

    `attempts` counts placements (1 + re-placements after losses); `worker_losses` counts the
    worker processes lost under it; `failure` is its `FailureClass` when one applies; `warnings`
    are said once each, in order (a partial-work warning per loss). Fields added after the first
    release are appended with defaults, so records written before them still decode.
    """

    status: TaskStatus = TaskStatus.PENDING
    attempts: int = 0
    lane: str | None = None
    shard: str | None = None
    shard_gen: int | None = None
    sandbox: str | None = None
    exit_code: int | None = None
    duration_s: float = 0.0
    output_tail: str = ""
    commit: str | None = None
    error: str | None = None
    worker_losses: int = 0
    failure: FailureClass | None = None
    warnings: list[str] = msgspec.field(default_factory=list)
    ticket: str | None = None
    """The affinity ticket of the lane's shard (`placement.AffinityTicket`), minted when the task
    is placed and kept after its lane ends, so its next placement can go back while that shard
    generation lives; cleared when a placement is taken back before the lane existed."""
    retries_used: int = 0
    """Retries taken (attempts that were not a re-placement after a lost worker)."""
    retries_granted: int = 0
    """Retries humans added to the task's `retries` (`ctl approve --retries`)."""
    granted: f.Budget | None = None
    """Budget humans added to the task's and its plan's (`ctl approve --grant`)."""
    spent: f.Spend = f.Spend()
    """What its ended attempts spent."""
    retry_at: float | None = None
    """While it backs off before a retry: when it may be placed again (Unix seconds)."""
    feedback: str | None = None
    """Revision feedback for its next attempt."""
    avoid: str | None = None
    """A shard its next placement avoids when another can take it (a re-acquire)."""
    pending: Pending | None = None
    """The HITL pause it waits on, or None."""
    answers: dict[str, f.Answer] = msgspec.field(default_factory=dict)
    """Every answer recorded, by the key of the pause it answered (the audit record)."""
    carried: dict[str, f.Answer] = msgspec.field(default_factory=dict)
    """Answers to its program's questions, by the program's key, handed to its next lane
    (`LaneStart.answers`) when a lane that asked is gone before it could go on; a failure that
    retries the task clears them: a new attempt asks afresh."""
    history: list[Attempt] = msgspec.field(default_factory=list)
    """Its placements, oldest first."""
    notes: list[str] = msgspec.field(default_factory=list)
    """What its lanes' programs told the coordinator (`tell_coordinator`), oldest first, at
    most `MAX_NOTES` (the newest)."""
    noted: list[str] = msgspec.field(default_factory=list)
    """The inbox message ids of every note kept (a shard bounds a lane's notes)."""
    rev: str | None = None
    """The full sha its latest ended lane's sandbox was made at (`LaneResult.rev`)."""
    stamps_ns: tuple[int | None, int | None] | None = None
    """(when its shard received its latest applied lane's `LaneStart`, when that lane's result
    reached the coordinator's inbox), as `TaskReport.stamps_ns`; None before a lane ended. One
    field with a short name: every change of a task writes its whole record."""
    fence: int = 0
    """Its current placement's fencing token when that is on a host's shard (`LaneStart.fence`,
    `coordinator.fencing`); 0 otherwise."""

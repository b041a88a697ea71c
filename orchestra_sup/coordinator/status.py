"""A task's status in the plan runner, the sets the runner reasons with, and its transitions.

pending -> starting -> running -> succeeded | failed | cancelled, and pending -> skipped when a
task it needs ended in anything but succeeded; paused and interrupted wait to be placed again,
awaiting_approval waits for a human (coordinator/runner.py has the whole lifecycle). A status
changes only through `PlanRecord.set_status`, along `TRANSITIONS`.
"""

from __future__ import annotations

import enum

from orchestra_sup.transitions import Transitions


class TaskStatus(enum.StrEnum):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    PAUSED = "paused"
    INTERRUPTED = "interrupted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


FINAL = frozenset(
    {TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.SKIPPED, TaskStatus.CANCELLED}
)
UNSUCCESSFUL = FINAL - {TaskStatus.SUCCEEDED}
"""Ended, and not in success: whatever needs such a task is skipped."""
LIVE = frozenset({TaskStatus.STARTING, TaskStatus.RUNNING})
WAITING = frozenset({TaskStatus.PENDING, TaskStatus.PAUSED, TaskStatus.INTERRUPTED})
"""Not placed yet (pending) or no longer placed (paused): ready once every need succeeded."""
HELD = frozenset({TaskStatus.AWAITING_APPROVAL})
"""Waiting for a human, with no lane: nothing happens until an answer comes."""

_ANY = frozenset(TaskStatus)
TRANSITIONS: Transitions[TaskStatus] = Transitions(
    "task",
    {
        # waiting: placed, held for a human, skipped, or failed or retried before it starts
        # (a quota breach, an empty budget, a need no shard meets), or cancelled before it
        # starts (the session that started it ended: `coordinator.seat`)
        **{
            waiting: WAITING
            | HELD
            | {TaskStatus.STARTING, TaskStatus.FAILED, TaskStatus.SKIPPED, TaskStatus.CANCELLED}
            for waiting in WAITING
        },
        # live: its shard answers (running), its lane ends (a result), it is lost or taken back
        # (paused, pending), interrupted, or it waits for a human with no lane
        TaskStatus.STARTING: _ANY - {TaskStatus.STARTING, TaskStatus.SKIPPED},
        TaskStatus.RUNNING: _ANY - {TaskStatus.STARTING, TaskStatus.RUNNING, TaskStatus.SKIPPED},
        # held: an answer acts (approved, retried, rejected, accepted as it is, re-run), it is
        # cancelled, or its lane's result is applied again (an inbox applied again on start)
        TaskStatus.AWAITING_APPROVAL: _ANY
        - {TaskStatus.STARTING, TaskStatus.RUNNING, TaskStatus.SKIPPED},
        # final: only a sibling-group retry brings a task back (pending again)
        **{final: {TaskStatus.PENDING} for final in FINAL},
    },
)
"""The statuses a task may go to from each status (`PlanRecord.set_status`)."""

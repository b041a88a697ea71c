"""A task's status in the plan runner, and the sets the runner reasons with.

pending -> starting -> running -> succeeded | failed | cancelled, and pending -> skipped when a
task it needs ended in anything but succeeded; paused and interrupted wait to be placed again,
awaiting_approval waits for a human (coordinator/runner.py has the whole lifecycle).
"""

from __future__ import annotations

import enum


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

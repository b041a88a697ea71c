"""Accepting a submitted plan: everything checked before it is stored, and its new record.

The coordinator checks every submission exactly as the CLI checks a plan file
(`plan.validate_plan`: the CLI's check is a convenience, not a boundary), task limit included;
then that some shard of this tree could take each task (`placement.unplaceable`, once per
distinct need) and that each program is allowed (`[lanes] programs`). The record it builds comes
with its progress (coordinator/progress.py) already derived.

All of it is a pure function of the plan and a snapshot of the shards, so a big plan is accepted
off the coordinator's event loop (`accept_off_loop`, a worker thread): checking and building a
10,000-task plan takes about 0.2 s, and the interpreter hands the loop the GIL back at least
every switch interval (5 ms) meanwhile. A small one is accepted on the loop, where the thread
would cost more than the work.
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple

from orchestra_sup.coordinator.placement import Need, ShardView, need_of, unplaceable
from orchestra_sup.coordinator.plan import validate_plan
from orchestra_sup.coordinator.runner import PlanRecord
from orchestra_sup.errors import ErrorCode, PlanError, RemoteError
from orchestra_sup.protocol import frames as f

ON_LOOP_TASKS = 100
"""Plans of at most this many tasks are accepted on the loop (well under a millisecond)."""


class Submission(NamedTuple):
    """A plan as submitted: its `spec`, the id `plan_id` it gets, when (`submitted_at`, Unix
    seconds), a snapshot of the tree's `shards`, the lane `programs` allowed, its idempotency
    `key` and `ticket`, every task's first affinity ticket (None: none)."""

    spec: f.PlanSpec
    plan_id: str
    submitted_at: float
    shards: list[ShardView]
    programs: frozenset[str]
    key: str | None = None
    ticket: str | None = None


def accept(sub: Submission) -> PlanRecord:
    """The new record of the plan submitted as `sub`, its progress derived.

    Raises:
        RemoteError: `bad_request` naming the problem in one line: the plan is invalid or over
            the task limit (`plan.validate_plan`), no shard of `sub.shards` could ever take a
            task ("task ID: no shard offers ..."), or a task's program is not in
            `sub.programs`.
    """
    spec, shards, programs = sub.spec, sub.shards, sub.programs
    try:
        spec = validate_plan(spec)
    except PlanError as exc:
        raise RemoteError(ErrorCode.BAD_REQUEST, str(exc)) from exc
    verdicts: dict[Need, str | None] = {}
    for task in spec.tasks:
        need = need_of(spec, task)
        if need not in verdicts:
            verdicts[need] = unplaceable(shards, need)
        why = verdicts[need]
        if why is None and task.program not in programs:
            why = f"program {task.program!r} is not in [lanes] programs"
        if why is not None:
            raise RemoteError(ErrorCode.BAD_REQUEST, f"task {task.id}: {why}")
    plan = PlanRecord.new(sub.plan_id, spec, sub.submitted_at, sub.key)
    if sub.ticket is not None:
        for task_id in plan.tasks:
            plan.touch(task_id).ticket = sub.ticket
    plan.progress  # noqa: B018 (derived here, off the loop, not at the first pump)
    return plan


async def accept_off_loop(sub: Submission) -> PlanRecord:
    """`accept`, in a worker thread when the plan has more than `ON_LOOP_TASKS` tasks. Raises
    as `accept` does."""
    if len(sub.spec.tasks) <= ON_LOOP_TASKS:
        return accept(sub)
    return await asyncio.to_thread(accept, sub)

"""The plan runner's state: which task may start, and what a lane's result does to its plan.

Pure logic over `PlanRecord` values (what the coordinator keeps in LMDB): no IO, no clock, so it is
tested as a table. The coordinator role feeds it results and lost shards and asks it what to
start next.

Task states: pending -> starting -> running -> succeeded | failed | cancelled, and
pending -> skipped when a task it needs ended in anything but succeeded. `starting` means a
`LaneStart` is in flight; reports show it as running.

Failures (ARCHITECTURE.md §7): a failed lane's result carries its class (`FailureClass`); so do a
budget that cannot carve a lane and a tenant over its quota, which the coordinator raises itself
before anything starts. `fail` resolves each under the task's strategy (`coordinator.strategy`)
into escalate (the task fails), retry (pending again after a backoff, `retry_at`; with revision
feedback for the next attempt, `LaneStart.feedback`), re-acquire (paused: re-placed at once, away
from the shard that failed) or pause for a human (awaiting_approval). Every retry passes the
retry-cap and budget gates first.

Losses and moves of live tasks (a lost worker process, a stop, a rollover) are
`coordinator.losses`; a task's HITL pauses and their answers are `coordinator.hitl`; both are
parts of `PlanRecord`, as is this module's logic.

Budgets (`coordinator.budget`): every placement carves the lane's grant from what its task and its
plan have left (`grant_for`); each attempt is kept in `history` with its grant until its result
says what it spent (a lane lost with its shard is charged its whole grant but wall time, which is
charged as it passed).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import NamedTuple

import msgspec

from orchestra_sup.coordinator import budget
from orchestra_sup.coordinator.hitl import AnswerError, Effect, PlanAnswers
from orchestra_sup.coordinator.losses import PlanLosses
from orchestra_sup.coordinator.placement import AffinityTicket
from orchestra_sup.coordinator.progress import Progress
from orchestra_sup.coordinator.records import Attempt, Pending, TaskRecord
from orchestra_sup.coordinator.status import (
    FINAL,
    HELD,
    LIVE,
    TRANSITIONS,
    UNSUCCESSFUL,
    WAITING,
    TaskStatus,
)
from orchestra_sup.coordinator.strategy import (
    Action,
    Decision,
    Gates,
    Scope,
    decide,
    task_strategy,
)
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.frames import FailureClass

__all__ = [
    "FINAL",
    "HELD",
    "LIVE",
    "WAITING",
    "AnswerError",
    "Attempt",
    "Effect",
    "PlanRecord",
    "TaskRecord",
    "TaskStatus",
]


class Applied(NamedTuple):
    """What `PlanRecord.apply` did with a lane's result: `applied` (False: it was stale),
    `cancel` (lanes a sibling-group retry took over: (shard, lane id)), `changed` (the record
    changed and must be written)."""

    applied: bool
    cancel: list[tuple[str, str]]
    changed: bool


class PlanRecord(PlanAnswers, PlanLosses, msgspec.Struct, kw_only=True, dict=True):
    """One plan's durable record: its spec and one `TaskRecord` per task id.

    Every status change goes through `set_status`, which keeps `progress` (what is ready, what
    must be skipped, how many tasks are left: coordinator/progress.py) in step, and every method
    that changes a task's record names it in `dirty`, so only changed tasks are written
    (coordinator/planstore.py). Neither is stored: both are rebuilt when a record is loaded."""

    id: str
    spec: f.PlanSpec
    submitted_at: float
    tasks: dict[str, TaskRecord]
    key: str | None = None
    """The idempotency key it was submitted with (`start_lane key=`), if any."""
    spent: f.Spend = f.Spend()
    """What its ended lanes spent."""
    granted: f.Budget | None = None
    """Budget humans added to the plan's (`ctl approve --grant`)."""
    outcome: f.PlanOutcome | None = None
    """How a session ended (`coordinator.seat`); None for a dag plan and a session under way."""
    finished_at: float | None = None
    """When it was found done (Unix seconds; None while it runs): what `[retention] plans_s`
    counts from (`coordinator.retention`)."""

    @classmethod
    def new(
        cls, plan_id: str, spec: f.PlanSpec, submitted_at: float, key: str | None = None
    ) -> PlanRecord:
        return cls(
            id=plan_id,
            spec=spec,
            submitted_at=submitted_at,
            tasks={t.id: TaskRecord() for t in spec.tasks},
            key=key,
        )

    @functools.cached_property
    def progress(self) -> Progress:
        """The plan's progress (coordinator/progress.py), derived from the task records when
        first asked for and kept in step by `set_status` from then on."""
        specs = self.spec.tasks
        progress = Progress(specs, [self.tasks[spec.id].status for spec in specs])
        for i, spec in enumerate(specs):
            rec = self.tasks[spec.id]
            if rec.retry_at is not None:
                progress.backoff.add(i)
            if rec.history and any(a.ended_at is None for a in rec.history):
                progress.holding.add(i)
        return progress

    @functools.cached_property
    def dirty(self) -> set[str]:
        """Ids of the tasks whose records changed since the plan was last written."""
        return set()

    @functools.cached_property
    def moved(self) -> set[str]:
        """Ids of the tasks that moved to a status other than starting or running since the
        coordinator last committed the plan (`coordinator.book`): a lane ended or was lost, or
        a task became ready, waits for a human or ended, so something else may run now."""
        return set()

    @functools.cached_property
    def transitions(self) -> list[tuple[str, TaskStatus]]:
        """(task id, status) of every status move since the plan was last written, in order,
        for the event log (`coordinator.planstore`)."""
        return []

    def touch(self, task_id: str) -> TaskRecord:
        """Task `task_id`'s record, to change: it is named in `dirty`."""
        self.dirty.add(task_id)
        return self.tasks[task_id]

    def set_status(self, task_id: str, status: TaskStatus) -> TaskRecord:
        """The one writer of a task's status (it keeps `progress` in step); returns the task's
        record, touched. Raises `ForbiddenTransition` for a move `status.TRANSITIONS` does not
        allow (a bug in the runner), before anything changes."""
        TRANSITIONS.move(self.tasks[task_id].status, status, what=f"plan {self.id}: task {task_id}")
        rec = self.touch(task_id)
        rec.status = status
        self.transitions.append((task_id, status))
        self.progress.move(self.progress.position[task_id], status)
        if status not in LIVE:
            self.moved.add(task_id)
        return rec

    @property
    def done(self) -> bool:
        """Every task is final; a session (`spec.coordinator` not "dag"): its program ended."""
        if self.spec.coordinator != "dag":
            return self.outcome is not None
        return self.progress.done

    @property
    def ok(self) -> bool:
        if self.spec.coordinator != "dag":
            return self.outcome is not None and self.outcome.error is None
        return self.progress.counts[TaskStatus.SUCCEEDED] == len(self.tasks)

    @property
    def blocking(self) -> bool:
        """Some pending task may need one that did not succeed: `skip_blocked` has work."""
        return bool(self.progress.blocked)

    def skip_blocked(self, limit: int | None = None) -> list[str]:
        """Mark as skipped every pending task that needs one which ended in anything but success
        (transitively), at most `limit` of them (None: all), each time the first in file order
        that can be; returns their ids. Each costs its task's needs and dependents, so skipping
        a whole plan is linear."""
        skipped: list[str] = []
        progress = self.progress
        while limit is None or len(skipped) < limit:
            i = progress.next_blocked()
            if i is None:
                break
            spec = self.spec.tasks[i]
            blocker = next(n for n in spec.needs if self.tasks[n].status in UNSUCCESSFUL)
            rec = self.set_status(spec.id, TaskStatus.SKIPPED)
            rec.error = f"skipped: {blocker} did not succeed"
            skipped.append(spec.id)
        return skipped

    def ready(self, now: float = math.inf) -> list[f.TaskSpec]:
        """Pending and paused tasks whose needs have all succeeded, that back off no more at
        `now` (Unix seconds; the default ignores backoffs) and wait for no approval, in file
        order."""
        return list(self.iter_ready(now))

    def iter_ready(self, now: float = math.inf) -> Iterator[f.TaskSpec]:
        """`ready`, one task at a time, as things are when each is asked for (a caller may place
        each before asking for the next, and stop early: the cost is what it reads)."""
        progress = self.progress
        for i in progress.candidates():
            spec = self.spec.tasks[i]
            rec = self.tasks[spec.id]
            if rec.retry_at is not None and rec.retry_at > now:
                continue
            if spec.approve and "approval" not in rec.answers:
                continue
            yield spec

    def backoffs(self) -> list[tuple[str, float]]:
        """(task id, `retry_at`) of every task that waits for its retry backoff to end, as
        stored (Unix seconds)."""
        out: list[tuple[str, float]] = []
        for i in list(self.progress.backoff):
            task_id = self.spec.tasks[i].id
            rec = self.tasks[task_id]
            if rec.retry_at is None or rec.status not in WAITING:
                self.progress.backoff.discard(i)
            else:
                out.append((task_id, rec.retry_at))
        return out

    def hold_for_approval(self, now: float) -> list[str]:
        """Pause for a human every task that says `approve = true`, would be ready now and has
        no approval yet (ARCHITECTURE.md §11 invariant 9: the pause, which an answer resolves,
        exists before it is recorded); returns their ids."""
        held: list[str] = []
        for i in self.progress.drain_fresh():
            spec = self.spec.tasks[i]
            rec = self.tasks[spec.id]
            if "approval" in rec.answers:
                continue
            what = spec.run if spec.program == "shell" else f"{spec.program} {spec.run}"
            rec = self.set_status(spec.id, TaskStatus.AWAITING_APPROVAL)
            rec.pending = Pending(
                kind="approval",
                key="approval",
                lane=f"{self.id}-{spec.id}-{rec.attempts + 1}",
                question=f"approve task {spec.id} of plan {self.spec.name}: {what}",
                since=now,
            )
            held.append(spec.id)
        return held

    # --- budgets ---------------------------------------------------------------------------------

    def held(self) -> f.Spend:
        """What the grants of lanes that have not ended hold."""
        open_ = []
        for i in sorted(self.progress.holding):
            rec = self.tasks[self.spec.tasks[i].id]
            attempts = [a for a in rec.history if a.ended_at is None]
            if not attempts:
                self.progress.holding.discard(i)
            open_.extend(attempts)
        return budget.total(budget.as_spend(a.grant) for a in open_)

    def grant_for(self, spec: f.TaskSpec) -> f.Budget | None:
        """The grant a new lane of `spec` would get (`coordinator.budget.carve`): the least of
        what its task and its plan have left in each dimension, or a share of the plan's among
        the tasks still to run (neither ended nor running) where the task sets no limit. None:
        nothing limits it."""
        rec = self.tasks[spec.id]
        task_left = budget.left(budget.extend(spec.budget, rec.granted), rec.spent)
        plan_limit = budget.extend(self.spec.budget, self.granted)
        progress = self.progress
        to_run = len(progress) - progress.final - len(progress.live)
        return budget.carve(task_left, budget.left(plan_limit, self.spent, self.held()), to_run)

    def _charge(
        self,
        rec: TaskRecord,
        lane: str | None,
        spent: f.Spend,
        now: float,
        how: str,
        failure: FailureClass | None = None,
    ) -> bool:
        """The attempt on `lane` ended: record when, how and what it spent, and add it to its
        task's and its plan's spend (once: an attempt already ended is left alone)."""
        for attempt in rec.history:
            if attempt.lane == lane and attempt.ended_at is None:
                attempt.ended_at, attempt.status, attempt.failure = now, how, failure
                attempt.spent = spent
                rec.spent = budget.add(rec.spent, spent)
                self.spent = budget.add(self.spent, spent)
                return True
        return False

    def close_attempt(
        self,
        task_id: str,
        lane: str | None,
        now: float,
        how: str,
        failure: FailureClass | None = None,
    ) -> None:
        """Lane `lane` of task `task_id` will report nothing any more (lost with its shard, taken
        over by a sibling-group retry, never started): end its attempt, so neither the plan's
        held budget nor the tenant's quota counts it for ever. What it spent is not known: it is
        charged the wall time that passed since it was placed and as much CPU time (one core's
        worth), each at most its grant; its output is not charged. (Charging the whole grant
        instead would leave a budgeted task nothing to re-run with after a worker loss, which
        must pause the work, not fail it: ARCHITECTURE.md §11 invariant 5.)"""
        rec = self.touch(task_id)
        for attempt in rec.history:
            if attempt.lane == lane and attempt.ended_at is None:
                wall = cpu = round(max(0.0, now - attempt.placed_at), 3)
                grant = attempt.grant
                if grant is not None and grant.wall_s is not None:
                    wall = min(wall, grant.wall_s)
                if grant is not None and grant.cpu_s is not None:
                    cpu = min(cpu, grant.cpu_s)
                self._charge(rec, lane, f.Spend(wall_s=wall, cpu_s=cpu), now, how, failure)
                return

    # --- placement -------------------------------------------------------------------------------

    def place(self, spec: f.TaskSpec, ticket: AffinityTicket, now: float = 0.0) -> f.LaneStart:
        """Put ready task `spec` as a new lane (one more attempt) on the shard and generation
        `ticket` names, and keep the ticket; its grant is carved now (`grant_for`: the caller
        checks first that it is not empty). Returns the `LaneStart` to send. The lane id names
        the attempt, so a result of an earlier lane of the same task is told apart (and ignored)
        by `apply`."""
        grant = self.grant_for(spec)
        rec = self.set_status(spec.id, TaskStatus.STARTING)
        rec.attempts += 1
        rec.lane = f"{self.id}-{spec.id}-{rec.attempts}"
        rec.shard, rec.shard_gen = ticket.shard, ticket.generation
        rec.ticket = str(ticket)
        rec.retry_at = None
        rec.fence = 0  # a host's shard's token comes when its key is made (`fencing`)
        rec.history.append(Attempt(lane=rec.lane, shard=ticket.shard, placed_at=now, grant=grant))
        self.progress.holding.add(self.progress.position[spec.id])
        return self.start_of(spec)

    def start_of(self, spec: f.TaskSpec) -> f.LaneStart:
        """The `LaneStart` of task `spec`'s current placement (its lane must be set). Sent again
        as it is, it is harmless: the lane id is the shard's idempotency key. Its feedback is
        the record's (a redirect, a rejection, a failed attempt's error), else the task's own
        `feedback` while no retry was taken (its first attempt, re-placed after a lost worker
        process included)."""
        rec = self.tasks[spec.id]
        assert rec.lane is not None
        grant = next((a.grant for a in rec.history if a.lane == rec.lane), None)
        feedback = rec.feedback
        if feedback is None and rec.retries_used == 0:
            feedback = spec.feedback
        return f.LaneStart(
            lane=rec.lane,
            plan=self.id,
            task=spec,
            attempt=rec.attempts,
            plan_name=self.spec.name,
            warnings=list(rec.warnings),
            budget=grant,
            feedback=feedback,
            answers=dict(rec.carried),
            fence=rec.fence,
        )

    def unplace(self, task_id: str) -> None:
        """Take back a placement its shard never took (it was full or down before the lane
        existed): the task waits again as it did before, and the attempt does not count."""
        rec = self.tasks[task_id]
        self.set_status(task_id, TaskStatus.PAUSED if rec.worker_losses else TaskStatus.PENDING)
        rec.attempts -= 1
        rec.history = [a for a in rec.history if a.lane != rec.lane]
        rec.lane = rec.shard = rec.shard_gen = rec.ticket = None
        rec.fence = 0

    def apply(self, result: f.LaneResult, now: float = 0.0, max_worker_loss: int = 1) -> Applied:
        """Record a lane's result and what it spent; a failure is resolved by the task's
        strategy (`fail`). `Applied.applied` is False (and at most the spend is recorded:
        `changed`) when the result is stale: the task has moved on to another lane or already
        ended."""
        if result.task not in self.tasks:
            return Applied(False, [], False)
        rec = self.tasks[result.task]  # touched only once something changes (`dirty`)
        failure = None
        if result.status == f.ResultStatus.FAILED:
            failure = result.failure or FailureClass.TOOL_FAILURE
        charged = self._charge(rec, result.lane, result.spent, now, result.status, failure)
        if rec.lane != result.lane or rec.status in FINAL:
            if charged:
                self.touch(result.task)
            return Applied(False, [], charged)
        self.touch(result.task)
        # What the lane's own run warns of (a re-run after a rollover's drain) is kept whatever
        # the end, so an interruption after it does not hide it.
        rec.warnings.extend(w for w in result.warnings if w not in rec.warnings)
        if result.status == f.ResultStatus.INTERRUPTED:
            rec.output_tail = result.output_tail
            if rec.pending is not None and rec.pending.kind == "question":
                self._hold_question(result.task, f"{result.shard} was stopped")
            else:
                self._interrupt(result.task, f"{result.shard} was stopped")
            return Applied(True, [], True)
        rec.exit_code = result.exit_code
        rec.duration_s = result.duration_s
        rec.output_tail = result.output_tail
        rec.sandbox, rec.rev = result.sandbox, result.rev
        rec.commit = result.commit
        rec.error = result.error
        rec.pending = None
        if failure is None:
            self.set_status(result.task, TaskStatus(result.status))
            rec.failure = None
            return Applied(True, [], True)
        error = result.error or "failed"
        if failure is FailureClass.BUDGET_EXHAUSTION:
            error += self._grant_note(result.task, result.lane)
        return Applied(True, self.fail(result.task, failure, error, now, max_worker_loss), True)

    def _grant_note(self, task_id: str, lane: str) -> str:
        """Where the grant a lane spent came from, for its budget-exhaustion error (a task with
        no limit of its own in a dimension gets only a share of the plan's)."""
        grant = next((a.grant for a in self.tasks[task_id].history if a.lane == lane), None)
        spec = self._spec(task_id)
        return (
            f" (the lane's grant: {budget.describe(grant)}; task budget: "
            f"{budget.describe(spec.budget)}; plan budget: {budget.describe(self.spec.budget)}, "
            "shared by its tasks still to run where a task sets no limit)"
        )

    # --- failures --------------------------------------------------------------------------------

    def covers(self, spec: f.TaskSpec) -> bool:
        """The budget gate: `spec`'s task and plan have something left in every dimension they
        limit (`coordinator.budget.empty`)."""
        return budget.empty(self.grant_for(spec)) is None

    def fail(
        self,
        task_id: str,
        failure: FailureClass,
        error: str,
        now: float,
        max_worker_loss: int = 1,
    ) -> list[tuple[str, str]]:
        """Resolve `failure` of task `task_id` (its current attempt, if any) under its strategy
        (`coordinator.strategy.decide`, gates included). Returns the lanes (shard, lane id) a
        sibling-group retry took over, for the coordinator to cancel."""
        spec = self._spec(task_id)
        rec = self.touch(task_id)
        decision = self._decide(task_id, failure, max_worker_loss)
        attempt = f"attempt {rec.attempts}" if rec.attempts else "before its first attempt"
        match decision.action:
            case Action.ESCALATE:
                self.set_status(task_id, TaskStatus.FAILED)
                rec.failure = failure
                rec.error = error if not decision.why else f"{error} ({decision.why})"
                return []
            case Action.PAUSE:
                self.set_status(task_id, TaskStatus.AWAITING_APPROVAL)
                rec.failure = failure
                rec.error = error
                rec.pending = Pending(
                    kind="review",
                    key=f"review:{rec.attempts}",
                    lane=rec.lane or f"{self.id}-{task_id}-{rec.attempts + 1}",
                    question=f"task {task_id} failed ({failure}, {attempt}): {error}; "
                    + self._review_choices(spec, rec),
                    since=now,
                    failure=failure,
                    error=error,
                )
                rec.shard_gen = None
                return []
            case Action.REACQUIRE:
                if failure is not FailureClass.WORKER_PROCESS_LOSS:
                    rec.retries_used += 1
                    rec.carried.clear()
                rec.avoid = rec.shard
                self.set_status(task_id, TaskStatus.PAUSED)
                rec.warnings.append(
                    f"{attempt} failed ({failure}): {error}; re-placing it on a fresh worker"
                )
                rec.lane = rec.shard = rec.shard_gen = None
                return []
        rec.retries_used += 1
        rec.carried.clear()
        rec.retry_at = round(now + decision.delay_s, 3)
        self.progress.backoff.add(self.progress.position[task_id])
        if decision.action is Action.RETRY_WITH_FEEDBACK:
            rec.feedback = error
        rec.warnings.append(
            f"{attempt} failed ({failure}): {error}; retry {rec.retries_used} of "
            f"{spec.retries + rec.retries_granted} in {decision.delay_s:g} s"
        )
        self.set_status(task_id, TaskStatus.PENDING)
        rec.lane = rec.shard = rec.shard_gen = None
        return self._restart_siblings(task_id, decision.scope, now)

    def _review_choices(self, spec: f.TaskSpec, rec: TaskRecord) -> str:
        """What a human can answer to a failed attempt, as things stand: a retry (approve,
        reject or redirect) needs a retry left and something left of the budget."""
        left = spec.retries + rec.retries_granted - rec.retries_used
        grant = self.grant_for(spec)
        budget_left = "" if grant is None else f"; budget left: {budget.describe(grant)}"
        if left <= 0:
            return (
                f"no retries left{budget_left}: approve --retries N to retry (add --grant for "
                "budget), or accept-partial"
            )
        return (
            f"{left} retries left{budget_left}: approve to retry, reject with a reason to retry "
            "with it as feedback, redirect, or accept-partial"
        )

    def _decide(self, task_id: str, failure: FailureClass, max_worker_loss: int) -> Decision:
        """`failure` of task `task_id` under its strategy, through the gates."""
        spec = self._spec(task_id)
        rec = self.tasks[task_id]
        gates = Gates(
            retries_used=rec.retries_used,
            retry_cap=spec.retries + rec.retries_granted,
            losses=rec.worker_losses,
            loss_cap=max_worker_loss,
            budget_left=self.covers(spec),
        )
        return decide(task_strategy(self.spec, spec), failure, gates, spec.backoff_s)

    def _restart_siblings(self, task_id: str, scope: Scope, now: float) -> list[tuple[str, str]]:
        """A sibling-group retry (`one_for_all`: every other task; `rest_for_one`: the tasks
        after `task_id` in file order) re-runs its siblings: each is pending again, and so is
        every task that needs one of them, however indirectly (a task runs only on what its
        needs produced, so it cannot stand when they run again); returns the live lanes (shard,
        lane id) it took over, to cancel (their results are then stale)."""
        if scope is Scope.ONE:
            return []
        progress = self.progress
        me = progress.position[task_id]
        first = me + 1 if scope is Scope.REST else 0
        again = set(range(first, len(progress))) | {me}
        grow = list(again)
        while grow:  # the dependents of whatever runs again, transitively
            for d in progress.dependents[grow.pop()]:
                if d not in again:
                    again.add(d)
                    grow.append(d)
        cancel: list[tuple[str, str]] = []
        for i in sorted(again - {me}):
            sibling = self.spec.tasks[i].id
            rec = self.tasks[sibling]
            if rec.status in (TaskStatus.PENDING, TaskStatus.PAUSED, TaskStatus.INTERRUPTED):
                continue
            if rec.status in LIVE and rec.shard is not None and rec.lane is not None:
                cancel.append((rec.shard, rec.lane))
                # Its result, if it comes, is stale: ended here, it holds nothing any more.
                self.close_attempt(sibling, rec.lane, now, "cancelled")
            rec.warnings.append(f"re-run: sibling {task_id} is retried ({scope} strategy)")
            self.set_status(sibling, TaskStatus.PENDING)
            rec.lane = rec.shard = rec.shard_gen = None
            rec.exit_code = rec.commit = rec.error = rec.failure = rec.pending = None
        return cancel

    def _spec(self, task_id: str) -> f.TaskSpec:
        return self.spec.tasks[self.progress.position[task_id]]

    def _live(self) -> list[TaskRecord]:
        """The records of the starting and running tasks, in file order."""
        return [self.tasks[self.spec.tasks[i].id] for i in sorted(self.progress.live)]

    def live_ids(self) -> list[str]:
        """The ids of the starting and running tasks, in file order."""
        return [self.spec.tasks[i].id for i in sorted(self.progress.live)]

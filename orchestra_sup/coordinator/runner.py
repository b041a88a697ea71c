"""The plan runner's state: which task may start, and what a lane's result does to its plan.

Pure logic over `PlanRecord` values (what the coordinator keeps in LMDB): no IO, no clock, so it is
tested as a table. The coordinator role feeds it results and lost shards and asks it what to
start next.

Task states: pending -> starting -> running -> succeeded | failed | cancelled, and
pending -> skipped when a task it needs ended in anything but succeeded. `starting` means a
`LaneStart` is in flight; reports show it as running.

Losing the worker process (the shard a lane ran on exits) is an infrastructure failure, not a
verdict on the work (ARCHITECTURE.md §7, §11 invariant 5): starting | running -> paused, and a
paused task is ready again, so it is re-placed on a live shard (the restarted one included) and
its step re-runs with a partial-work warning, since whatever the dead attempt did outside its
sandbox may still be there. Every placement counts in `attempts`. The `max_worker_loss`-th loss
of the same task fails it with the failure class `worker_process_loss` instead, so a command that
kills its own shard cannot loop.

Failures (ARCHITECTURE.md §7): a failed lane's result carries its class (`FailureClass`); so do a
budget that cannot carve a lane and a tenant over its quota, which the coordinator raises itself
before anything starts. `fail` resolves each under the task's strategy (`coordinator.strategy`)
into escalate (the task fails), retry (pending again after a backoff, `retry_at`; with revision
feedback for the next attempt, `LaneStart.feedback`), re-acquire (paused: re-placed at once, away
from the shard that failed) or pause for a human (awaiting_approval). Every retry passes the
retry-cap and budget gates first.

HITL (ARCHITECTURE.md §11 invariant 9): a task waits for a human (`awaiting_approval`, its
`pending` says why and which lane id answers it) before its first attempt when it says `approve =
true` (`hold_for_approval`), after a failure under `on_failure = "pause"`, or while its lane's
program waits in `ask_human` (then its lane is live: the status stays running and only `pending`
is set). An answer is first recorded (`record_answer`: kept in `answers` under the pause's key)
and only then acted on (`act_on_answer`), which the coordinator does once the record is durable;
a record with an answer it has not acted on yet is acted on at the next start (`unsettled`).

Budgets (`coordinator.budget`): every placement carves the lane's grant from what its task and its
plan have left (`grant_for`); each attempt is kept in `history` with its grant until its result
says what it spent (a lane lost with its shard is charged its whole grant but wall time, which is
charged as it passed).

A rollover moves lanes between generations of one shard (ARCHITECTURE.md §9): a task whose lane
runs on a generation the roster lists as draining is not lost (`lose_shard`'s `keep`); once that
generation has retired, the lanes the shard's current generation has (live, or with a result in
its outbox) move on to it, and only the others are lost (`settle_moved`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Iterator
from typing import Literal, NamedTuple

import msgspec

from orchestra_sup.coordinator import budget
from orchestra_sup.coordinator.placement import AffinityTicket
from orchestra_sup.coordinator.progress import Progress
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

__all__ = ["FINAL", "HELD", "LIVE", "WAITING", "PlanRecord", "TaskRecord", "TaskStatus"]

MAX_NOTES = 20
"""Notes (`tell_coordinator`) kept per task in its record: the newest. The record is written
again on every change and travels whole in a plan report: what it keeps must stay small (a
plan of 45 program tasks sending 100 notes of 4 KiB each made an 18 MB record, over the frame
limit, and its writes stalled the coordinator past its watchdog)."""
NOTE_CHARS = 500
"""A kept note's text is cut to this many characters (the transcript has it whole)."""
MAX_GRANTED_RETRIES = 100
"""The most retries one answer may grant (as many as a plan may declare)."""
MAX_ANSWER_BYTES = 64 * 1024
"""The longest text of an answer (a reason, a redirect), UTF-8 bytes."""


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


class AnswerError(Exception):
    """An answer that cannot be taken: `code` is "not_found" (no task waits on that lane) or
    "bad_request" (the answer does not fit the pause); the message says why in one line."""

    def __init__(self, code: Literal["not_found", "bad_request"], message: str):
        super().__init__(message)
        self.code = code


class Applied(NamedTuple):
    """What `PlanRecord.apply` did with a lane's result: `applied` (False: it was stale),
    `cancel` (lanes a sibling-group retry took over: (shard, lane id)), `changed` (the record
    changed and must be written)."""

    applied: bool
    cancel: list[tuple[str, str]]
    changed: bool


class Effect(msgspec.Struct, frozen=True, kw_only=True):
    """What acting on an answer did, for the coordinator to finish: `outcome` in one line; a
    `HitlAnswer` to send to `shard` (the lane that asked is live there), or None; `cancel`: the
    lanes (shard, lane id) a sibling-group retry took over, to cancel."""

    outcome: str
    shard: str | None = None
    answer: f.HitlAnswer | None = None
    cancel: list[tuple[str, str]] = []


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


class PlanRecord(msgspec.Struct, kw_only=True, dict=True):
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
        self.progress.move(self.progress.position[task_id], status)
        return rec

    @property
    def done(self) -> bool:
        return self.progress.done

    @property
    def ok(self) -> bool:
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

    def next_retry(self) -> float | None:
        """The earliest `retry_at` of a task that waits for it (Unix seconds), or None."""
        times: list[float] = []
        for i in list(self.progress.backoff):
            rec = self.tasks[self.spec.tasks[i].id]
            if rec.retry_at is None or rec.status not in WAITING:
                self.progress.backoff.discard(i)
            else:
                times.append(rec.retry_at)
        return min(times, default=None)

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
        rec.history.append(Attempt(lane=rec.lane, shard=ticket.shard, placed_at=now, grant=grant))
        self.progress.holding.add(self.progress.position[spec.id])
        return self.start_of(spec)

    def start_of(self, spec: f.TaskSpec) -> f.LaneStart:
        """The `LaneStart` of task `spec`'s current placement (its lane must be set). Sent again
        as it is, it is harmless: the lane id is the shard's idempotency key."""
        rec = self.tasks[spec.id]
        assert rec.lane is not None
        grant = next((a.grant for a in rec.history if a.lane == rec.lane), None)
        return f.LaneStart(
            lane=rec.lane,
            plan=self.id,
            task=spec,
            attempt=rec.attempts,
            plan_name=self.spec.name,
            warnings=list(rec.warnings),
            budget=grant,
            feedback=rec.feedback,
            answers=dict(rec.carried),
        )

    def unplace(self, task_id: str) -> None:
        """Take back a placement its shard never took (it was full or down before the lane
        existed): the task waits again as it did before, and the attempt does not count."""
        rec = self.tasks[task_id]
        self.set_status(task_id, TaskStatus.PAUSED if rec.worker_losses else TaskStatus.PENDING)
        rec.attempts -= 1
        rec.history = [a for a in rec.history if a.lane != rec.lane]
        rec.lane = rec.shard = rec.shard_gen = rec.ticket = None

    def apply(self, result: f.LaneResult, now: float = 0.0, max_worker_loss: int = 1) -> Applied:
        """Record a lane's result and what it spent; a failure is resolved by the task's
        strategy (`fail`). `Applied.applied` is False (and at most the spend is recorded:
        `changed`) when the result is stale: the task has moved on to another lane or already
        ended."""
        if result.task not in self.tasks:
            return Applied(False, [], False)
        rec = self.touch(result.task)
        failure = None
        if result.status == f.ResultStatus.FAILED:
            failure = result.failure or FailureClass.TOOL_FAILURE
        charged = self._charge(rec, result.lane, result.spent, now, result.status, failure)
        if rec.lane != result.lane or rec.status in FINAL:
            return Applied(False, [], charged)
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
        rec.sandbox = result.sandbox
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

    # --- HITL ------------------------------------------------------------------------------------

    def pause_for_question(self, pause: f.HitlPause) -> bool:
        """Lane `pause.lane`'s program waits for a human (`ask_human`): record the question;
        False (no change) when the lane is not the task's live lane or the key was answered."""
        rec = self.tasks.get(pause.task)
        if rec is None or rec.lane != pause.lane or rec.status not in LIVE:
            return False
        rec = self.touch(pause.task)
        if pause.key in rec.carried:
            return False
        if rec.pending is not None and rec.pending.asked != pause.key:
            return False  # a lane asks one question at a time: the first one stands
        rec.pending = Pending(
            kind="question",
            key=f"{pause.lane}:{pause.key}",
            lane=pause.lane,
            question=pause.question,
            since=pause.asked_at,
            asked=pause.key,
        )
        return True

    def _hold_question(self, task_id: str, why: str) -> None:
        """The lane asking a human is gone (`why`): the question still waits, with no lane;
        once answered the task re-runs with the answer (not a loss, not a retry)."""
        rec = self.touch(task_id)
        rec.warnings.append(
            f"partial work: lane {rec.lane} was interrupted when {why} while it waited for "
            "a human; it re-runs once answered"
        )
        self.set_status(task_id, TaskStatus.AWAITING_APPROVAL)
        rec.lane = rec.shard = rec.shard_gen = None

    def note(self, note: f.LaneNote, msg_id: str) -> bool:
        """Keep what a lane's program told the coordinator, once per inbox message id
        (`msg_id`: every start applies the whole inbox again); False when its task is unknown
        or it was kept before."""
        rec = self.tasks.get(note.task)
        if rec is None or msg_id in rec.noted:
            return False
        rec = self.touch(note.task)
        rec.noted.append(msg_id)
        text = note.text if len(note.text) <= NOTE_CHARS else note.text[: NOTE_CHARS - 3] + "..."
        rec.notes.append(f"{note.lane}: {text}")
        del rec.notes[:-MAX_NOTES]
        return True

    def waiting_on(self, lane: str) -> str | None:
        """The id of the task whose pause lane id `lane` answers, or None."""
        for task_id, rec in self.tasks.items():
            if rec.pending is not None and rec.pending.lane == lane:
                return task_id
        return None

    def answers_taken(self, task_id: str) -> tuple[list[str], bool]:
        """What task `task_id`'s pause takes as `record_answer` judges it now: the verdicts (in
        `ctl` order: approve, reject, redirect, accept_partial) and whether an approval needs
        retries granted with it (`approve --retries N`: a review with no retry left, where
        reject and redirect, which retry too, are refused). ([], False) when it waits on
        nothing. Answers its text or grant would make bad are not told apart here."""
        rec = self.tasks[task_id]
        pending = rec.pending
        if pending is None:
            return [], False
        if pending.kind == "approval":  # nothing ran yet: nothing to accept part of
            return ["approve", "reject", "redirect"], False
        if pending.kind == "review":
            spec = self._spec(task_id)
            if rec.retries_used >= spec.retries + rec.retries_granted:
                return ["approve", "accept_partial"], True
        return ["approve", "reject", "redirect", "accept_partial"], False

    def record_answer(self, task_id: str, answer: f.Answer) -> None:
        """Keep `answer` to task `task_id`'s pause (the audit record, ARCHITECTURE.md §11
        invariant 9); `act_on_answer` acts on it once this is durable. Raises `AnswerError`
        ("bad_request") when the answer does not fit the pause: the pause already has an answer
        (two operators at once: the first stands); a grant or retries with anything but
        approve; retries outside 0..`MAX_GRANTED_RETRIES`; a grant `budget.grant_problem`
        refuses; reject or redirect without text; a text over `MAX_ANSWER_BYTES`; an approval
        of a review whose retry the cap forbids (grant retries); accept-partial of an
        approval."""
        rec = self.touch(task_id)
        pending = rec.pending
        assert pending is not None
        earlier = rec.answers.get(pending.key)
        if earlier is not None:  # recorded, and being made durable: the first answer stands
            raise AnswerError(
                "bad_request",
                f"already answered ({earlier.verdict} by {earlier.responder or earlier.uid})",
            )
        if answer.verdict != "approve" and (answer.grant is not None or answer.retries):
            raise AnswerError("bad_request", "only an approval grants budget or retries")
        if not 0 <= answer.retries <= MAX_GRANTED_RETRIES:
            raise AnswerError(
                "bad_request",
                f"retries must be from 0 to {MAX_GRANTED_RETRIES}, got {answer.retries}",
            )
        problem = None if answer.grant is None else budget.grant_problem(answer.grant)
        if problem is not None:
            raise AnswerError("bad_request", problem)
        if answer.verdict in ("reject", "redirect") and not answer.text.strip():
            raise AnswerError("bad_request", f"a {answer.verdict} needs a text saying why")
        if len(answer.text.encode()) > MAX_ANSWER_BYTES:
            raise AnswerError(
                "bad_request", f"an answer's text is at most {MAX_ANSWER_BYTES} bytes"
            )
        if pending.kind == "approval" and answer.verdict == "accept_partial":
            raise AnswerError("bad_request", "nothing ran yet: approve, reject or redirect it")
        if pending.kind == "review" and answer.verdict != "accept_partial":
            spec = self._spec(task_id)
            cap = spec.retries + rec.retries_granted + answer.retries
            if rec.retries_used >= cap:
                raise AnswerError(
                    "bad_request",
                    f"task {task_id} used {rec.retries_used} of {cap} retries: approve with "
                    "--retries N to grant more, or accept-partial",
                )
        rec.answers[pending.key] = answer

    def answers_to_deliver(self) -> list[tuple[str, f.HitlAnswer]]:
        """Every answer to a question of a live lane, as (shard, `HitlAnswer`) to send it: the
        record keeps them (`carried`) once acted on, and sending one again is harmless (the
        lane keeps the first answer to a key). What a coordinator had acted on but not yet
        sent when it stopped (held for a rollover, killed) is sent by the next one."""
        out: list[tuple[str, f.HitlAnswer]] = []
        for rec in self._live():
            if rec.lane is None or rec.shard is None:
                continue
            for key, answer in rec.carried.items():
                out.append((rec.shard, f.HitlAnswer(lane=rec.lane, key=key, answer=answer)))
        return out

    def drop_answer(self, task_id: str) -> None:
        """Forget the answer recorded for task `task_id`'s pause and not acted on (acting on it
        failed): the pause waits for an answer again."""
        rec = self.touch(task_id)
        if rec.pending is not None:
            rec.answers.pop(rec.pending.key, None)

    def unsettled(self) -> list[str]:
        """Tasks whose pause has a recorded answer not acted on yet (the coordinator stopped
        in between): `act_on_answer` each."""
        return [
            task_id
            for task_id, rec in self.tasks.items()
            if rec.pending is not None and rec.pending.key in rec.answers
        ]

    def act_on_answer(self, task_id: str, now: float) -> Effect:
        """Act on the recorded answer to task `task_id`'s pause (`record_answer`):

        - approval: approve -> it runs; redirect -> it runs with the text as feedback; reject ->
          it fails (`preflight_escalation`, the reason in its error); (accept-partial is refused
          by `record_answer`: nothing ran).
        - review (a failed attempt): approve -> retried; reject or redirect -> retried with the
          text as revision feedback; accept-partial -> it succeeds as it is, with a warning.
        - question: the answer goes to the lane that asked (`Effect.answer`), or, when that lane
          is gone, the task re-runs and its program finds the answer recorded.

        A grant adds to the task's and the plan's budgets, `retries` to its retry cap."""
        rec = self.touch(task_id)
        pending = rec.pending
        assert pending is not None
        answer = rec.answers[pending.key]
        who = answer.responder or f"uid {answer.uid}"
        if answer.grant is not None:
            rec.granted = budget.plus(rec.granted, answer.grant)
            self.granted = budget.plus(self.granted, answer.grant)
        rec.retries_granted += answer.retries
        rec.pending = None
        verdict = answer.verdict
        if pending.kind == "question":
            asked = pending.asked or pending.key
            rec.carried[asked] = answer
            if rec.status in LIVE and rec.shard is not None and rec.lane is not None:
                hitl = f.HitlAnswer(lane=rec.lane, key=asked, answer=answer)
                return Effect(
                    outcome=f"{verdict} sent to lane {rec.lane}", shard=rec.shard, answer=hitl
                )
            self.set_status(task_id, TaskStatus.PAUSED)
            return Effect(outcome=f"{verdict} recorded; task {task_id} re-runs with it")
        if pending.kind == "approval":
            if verdict == "reject":
                self.set_status(task_id, TaskStatus.FAILED)
                rec.failure = FailureClass.PREFLIGHT_ESCALATION
                rec.error = f"rejected by {who}: {answer.text}"
                return Effect(outcome=f"task {task_id} rejected: it does not run")
            self.set_status(task_id, TaskStatus.PENDING)
            if verdict == "redirect":
                rec.feedback = answer.text
                return Effect(outcome=f"task {task_id} redirected: it runs with the feedback")
            return Effect(outcome=f"task {task_id} approved: it runs")
        # a review of a failed attempt
        if verdict == "accept_partial":
            self.set_status(task_id, TaskStatus.SUCCEEDED)
            rec.failure = None
            rec.warnings.append(
                f"partial: accepted by {who} after attempt {rec.attempts} failed: {rec.error}"
            )
            return Effect(outcome=f"task {task_id} accepted as it is")
        if verdict in ("reject", "redirect"):
            rec.feedback = answer.text
        if not self.covers(self._spec(task_id)):
            self.set_status(task_id, TaskStatus.FAILED)
            rec.error = f"{rec.error} ({verdict} by {who}: the budget cannot cover another attempt)"
            return Effect(outcome=f"task {task_id} failed: its budget cannot cover a retry")
        rec.retries_used += 1
        rec.carried.clear()
        self.set_status(task_id, TaskStatus.PENDING)
        rec.warnings.append(f"attempt {rec.attempts} failed: {verdict} by {who}: retrying")
        spec = self._spec(task_id)
        cancel = self._restart_siblings(task_id, task_strategy(self.spec, spec).scope, now)
        return Effect(outcome=f"task {task_id} retried", cancel=cancel)

    def _live(self) -> list[TaskRecord]:
        """The records of the starting and running tasks, in file order."""
        return [self.tasks[self.spec.tasks[i].id] for i in sorted(self.progress.live)]

    def live_ids(self) -> list[str]:
        """The ids of the starting and running tasks, in file order."""
        return [self.spec.tasks[i].id for i in sorted(self.progress.live)]

    def _interrupt(self, task_id: str, why: str) -> None:
        """A stop interrupted the task's lane: not a verdict and not a loss; it runs again."""
        rec = self.set_status(task_id, TaskStatus.INTERRUPTED)
        rec.warnings.append(
            f"partial work: lane {rec.lane} was interrupted when {why}; re-running the step"
        )
        rec.lane = rec.shard = rec.shard_gen = None

    def interrupt_shard(self, shard: str) -> list[str]:
        """The tree is stopping and `shard` went down: its live tasks are interrupted, not lost
        (no `worker_losses` counted); returns their ids."""
        hit = [t for t in self.live_ids() if self.tasks[t].shard == shard]
        for task_id in hit:
            rec = self.tasks[task_id]
            if rec.pending is not None and rec.pending.kind == "question":
                self._hold_question(task_id, f"{shard} was stopped with the tree")
            else:
                self._interrupt(task_id, f"{shard} was stopped with the tree")
        return hit

    def lose_shard(
        self,
        shard: str,
        generation: int | None,
        max_worker_loss: int,
        keep: Collection[int] = (),
        now: float = 0.0,
    ) -> list[str]:
        """Pause every live task on `shard` whose lane ran on a generation other than
        `generation` (None: the shard is down, so every generation) and not in `keep` (generations
        still draining, or retired and not yet settled: their lanes are moving, not lost);
        returns their ids.

        A worker-process loss is not a verdict on the work (ARCHITECTURE.md §11 invariant 5): the
        task is paused, so `ready` offers it again, with a partial-work warning for its re-run.
        Its `max_worker_loss`-th loss (>= 1) fails it instead, with the failure class
        `worker_process_loss`, so a command that kills its own shard cannot loop.
        """
        lost: list[str] = []
        for task_id in self.live_ids():
            rec = self.tasks[task_id]
            if rec.shard != shard or rec.shard_gen == generation or rec.shard_gen in keep:
                continue
            self._lose(task_id, shard, max_worker_loss, now)
            lost.append(task_id)
        return lost

    def settle_moved(
        self,
        shard: str,
        retired: Collection[int],
        generation: int,
        there: Collection[str],
        max_worker_loss: int,
        now: float = 0.0,
    ) -> tuple[list[str], list[str]]:
        """Generations `retired` of `shard` drained and are gone: each live task whose lane ran
        on one of them now runs on `generation` if its lane is in `there` (the lanes that
        generation has, live or with a result in its outbox), else it is lost as in
        `lose_shard`. Returns (moved task ids, lost task ids)."""
        moved: list[str] = []
        lost: list[str] = []
        for task_id in self.live_ids():
            rec = self.tasks[task_id]
            if rec.shard != shard or rec.shard_gen not in retired:
                continue
            if rec.lane in there:
                self.touch(task_id).shard_gen = generation
                moved.append(task_id)
            else:
                self._lose(task_id, shard, max_worker_loss, now)
                lost.append(task_id)
        return moved, lost

    def _lose(self, task_id: str, shard: str, max_worker_loss: int, now: float) -> None:
        """The worker process of task `task_id`'s lane is gone: an infrastructure failure,
        resolved by its strategy (re-acquire by default, capped by `max_worker_loss`); a lane
        that waited for a human keeps waiting, and that is not a loss."""
        rec = self.touch(task_id)
        self.close_attempt(task_id, rec.lane, now, "lost", FailureClass.WORKER_PROCESS_LOSS)
        interrupted = (
            f"partial work: lane {rec.lane} was interrupted when {shard} "
            f"(generation {rec.shard_gen}) was lost"
        )
        if rec.pending is not None and rec.pending.kind == "question":
            self._hold_question(task_id, f"{shard} (generation {rec.shard_gen}) was lost")
            return
        rec.worker_losses += 1
        loss = FailureClass.WORKER_PROCESS_LOSS
        decision = self._decide(task_id, loss, max_worker_loss)
        if decision.action is Action.REACQUIRE:
            self.set_status(task_id, TaskStatus.PAUSED)
            rec.warnings.append(f"{interrupted}; re-running the step")
            rec.lane = rec.shard = rec.shard_gen = None
            return
        if decision.action is Action.ESCALATE and rec.worker_losses >= max_worker_loss:
            self.set_status(task_id, TaskStatus.FAILED)
            rec.failure = loss
            rec.warnings.append(f"{interrupted}; not re-run")
            rec.error = (
                f"worker process lost {rec.worker_losses} times (max_worker_loss = "
                f"{max_worker_loss}); last: {shard} (generation {rec.shard_gen}) exited "
                f"while lane {rec.lane} was running"
            )
            return
        rec.warnings.append(interrupted)
        self.fail(
            task_id,
            loss,
            f"{shard} (generation {rec.shard_gen}) exited while lane {rec.lane} was running",
            now,
            max_worker_loss,
        )

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

A rollover moves lanes between generations of one shard (ARCHITECTURE.md §9): a task whose lane
runs on a generation the roster lists as draining is not lost (`lose_shard`'s `keep`); once that
generation has retired, the lanes the shard's current generation has (live, or with a result in
its outbox) move on to it, and only the others are lost (`settle_moved`).
"""

from __future__ import annotations

import enum
from collections.abc import Collection

import msgspec

from orchestra_sup.coordinator.placement import AffinityTicket
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.frames import FailureClass


class TaskStatus(enum.StrEnum):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    INTERRUPTED = "interrupted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


FINAL = frozenset(
    {TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.SKIPPED, TaskStatus.CANCELLED}
)
LIVE = frozenset({TaskStatus.STARTING, TaskStatus.RUNNING})
WAITING = frozenset({TaskStatus.PENDING, TaskStatus.PAUSED, TaskStatus.INTERRUPTED})
"""Not placed yet (pending) or no longer placed (paused): ready once every need succeeded."""


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


class PlanRecord(msgspec.Struct, kw_only=True):
    """One plan's durable record: its spec and one `TaskRecord` per task id."""

    id: str
    spec: f.PlanSpec
    submitted_at: float
    tasks: dict[str, TaskRecord]
    key: str | None = None
    """The idempotency key it was submitted with (`start_lane key=`), if any."""

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

    @property
    def done(self) -> bool:
        return all(t.status in FINAL for t in self.tasks.values())

    @property
    def ok(self) -> bool:
        return all(t.status is TaskStatus.SUCCEEDED for t in self.tasks.values())

    def skip_blocked(self) -> list[str]:
        """Mark as skipped every pending task that needs one which ended in anything but success
        (transitively); returns their ids."""
        skipped: list[str] = []
        changed = True
        while changed:
            changed = False
            for spec in self.spec.tasks:
                rec = self.tasks[spec.id]
                if rec.status is not TaskStatus.PENDING:
                    continue
                blockers = [
                    n for n in spec.needs if self.tasks[n].status in FINAL - {TaskStatus.SUCCEEDED}
                ]
                if blockers:
                    rec.status = TaskStatus.SKIPPED
                    rec.error = f"skipped: {blockers[0]} did not succeed"
                    skipped.append(spec.id)
                    changed = True
        return skipped

    def ready(self) -> list[f.TaskSpec]:
        """Pending and paused tasks whose needs have all succeeded, in file order."""
        return [
            spec
            for spec in self.spec.tasks
            if self.tasks[spec.id].status in WAITING
            and all(self.tasks[n].status is TaskStatus.SUCCEEDED for n in spec.needs)
        ]

    def place(self, spec: f.TaskSpec, ticket: AffinityTicket) -> f.LaneStart:
        """Put ready task `spec` as a new lane (one more attempt) on the shard and generation
        `ticket` names, and keep the ticket; returns the `LaneStart` to send. The lane id names
        the attempt, so a result of an earlier lane of the same task is told apart (and ignored)
        by `apply`."""
        rec = self.tasks[spec.id]
        rec.attempts += 1
        rec.status = TaskStatus.STARTING
        rec.lane = f"{self.id}-{spec.id}-{rec.attempts}"
        rec.shard, rec.shard_gen = ticket.shard, ticket.generation
        rec.ticket = str(ticket)
        return self.start_of(spec)

    def start_of(self, spec: f.TaskSpec) -> f.LaneStart:
        """The `LaneStart` of task `spec`'s current placement (its lane must be set). Sent again
        as it is, it is harmless: the lane id is the shard's idempotency key."""
        rec = self.tasks[spec.id]
        assert rec.lane is not None
        return f.LaneStart(
            lane=rec.lane,
            plan=self.id,
            task=spec,
            attempt=rec.attempts,
            plan_name=self.spec.name,
            warnings=list(rec.warnings),
        )

    def unplace(self, task_id: str) -> None:
        """Take back a placement its shard never took (it was full or down before the lane
        existed): the task waits again as it did before, and the attempt does not count."""
        rec = self.tasks[task_id]
        rec.status = TaskStatus.PAUSED if rec.worker_losses else TaskStatus.PENDING
        rec.attempts -= 1
        rec.lane = rec.shard = rec.shard_gen = rec.ticket = None

    def apply(self, result: f.LaneResult) -> bool:
        """Record a lane's result; False (and no change) when it is stale: the task has moved on
        to another lane or already ended."""
        rec = self.tasks.get(result.task)
        if rec is None or rec.lane != result.lane or rec.status in FINAL:
            return False
        # What the lane's own run warns of (a re-run after a rollover's drain) is kept whatever
        # the end, so an interruption after it does not hide it.
        rec.warnings.extend(w for w in result.warnings if w not in rec.warnings)
        if result.status == "interrupted":
            self._interrupt(rec, f"{result.shard} was stopped")
            rec.output_tail = result.output_tail
            return True
        rec.status = TaskStatus(result.status)
        rec.exit_code = result.exit_code
        rec.duration_s = result.duration_s
        rec.output_tail = result.output_tail
        rec.sandbox = result.sandbox
        rec.commit = result.commit
        rec.error = result.error
        return True

    def _interrupt(self, rec: TaskRecord, why: str) -> None:
        """A stop interrupted the task's lane: not a verdict and not a loss; it runs again."""
        rec.warnings.append(
            f"partial work: lane {rec.lane} was interrupted when {why}; re-running the step"
        )
        rec.status = TaskStatus.INTERRUPTED
        rec.lane = rec.shard = rec.shard_gen = None

    def interrupt_shard(self, shard: str) -> list[str]:
        """The tree is stopping and `shard` went down: its live tasks are interrupted, not lost
        (no `worker_losses` counted); returns their ids."""
        hit = [t for t, rec in self.tasks.items() if rec.status in LIVE and rec.shard == shard]
        for task_id in hit:
            self._interrupt(self.tasks[task_id], f"{shard} was stopped with the tree")
        return hit

    def lose_shard(
        self,
        shard: str,
        generation: int | None,
        max_worker_loss: int,
        keep: Collection[int] = (),
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
        for task_id, rec in self.tasks.items():
            if rec.status not in LIVE or rec.shard != shard or rec.shard_gen == generation:
                continue
            if rec.shard_gen in keep:
                continue
            self._lose(rec, shard, max_worker_loss)
            lost.append(task_id)
        return lost

    def settle_moved(
        self,
        shard: str,
        retired: Collection[int],
        generation: int,
        there: Collection[str],
        max_worker_loss: int,
    ) -> tuple[list[str], list[str]]:
        """Generations `retired` of `shard` drained and are gone: each live task whose lane ran
        on one of them now runs on `generation` if its lane is in `there` (the lanes that
        generation has, live or with a result in its outbox), else it is lost as in
        `lose_shard`. Returns (moved task ids, lost task ids)."""
        moved: list[str] = []
        lost: list[str] = []
        for task_id, rec in self.tasks.items():
            if rec.status not in LIVE or rec.shard != shard or rec.shard_gen not in retired:
                continue
            if rec.lane in there:
                rec.shard_gen = generation
                moved.append(task_id)
            else:
                self._lose(rec, shard, max_worker_loss)
                lost.append(task_id)
        return moved, lost

    def _lose(self, rec: TaskRecord, shard: str, max_worker_loss: int) -> None:
        rec.worker_losses += 1
        interrupted = (
            f"partial work: lane {rec.lane} was interrupted when {shard} "
            f"(generation {rec.shard_gen}) was lost"
        )
        if rec.worker_losses >= max_worker_loss:
            rec.status = TaskStatus.FAILED
            rec.failure = FailureClass.WORKER_PROCESS_LOSS
            rec.warnings.append(f"{interrupted}; not re-run")
            rec.error = (
                f"worker process lost {rec.worker_losses} times (max_worker_loss = "
                f"{max_worker_loss}); last: {shard} (generation {rec.shard_gen}) exited "
                f"while lane {rec.lane} was running"
            )
        else:
            rec.status = TaskStatus.PAUSED
            rec.warnings.append(f"{interrupted}; re-running the step")
            rec.lane = rec.shard = rec.shard_gen = None

    def summary(self) -> f.PlanSummary:
        """The plan in one line: its tasks counted by the status a report shows."""
        counts: dict[str, int] = {}
        for t in self.report().tasks:
            counts[t.status] = counts.get(t.status, 0) + 1
        return f.PlanSummary(
            id=self.id,
            plan=self.spec.name,
            submitted_at=self.submitted_at,
            done=self.done,
            ok=self.done and self.ok,
            tasks=counts,
        )

    def report(self) -> f.PlanReport:
        def shown(status: TaskStatus) -> str:
            return TaskStatus.RUNNING if status is TaskStatus.STARTING else str(status)

        return f.PlanReport(
            plan=self.spec.name,
            id=self.id,
            done=self.done,
            ok=self.done and self.ok,
            tasks=[
                f.TaskReport(
                    id=spec.id,
                    status=shown(rec.status),
                    exit_code=rec.exit_code,
                    attempts=rec.attempts,
                    shard=rec.shard,
                    lane=rec.lane,
                    sandbox=rec.sandbox,
                    duration_s=rec.duration_s,
                    output_tail=rec.output_tail,
                    commit=rec.commit,
                    error=rec.error,
                    failure=None if rec.failure is None else str(rec.failure),
                    warnings=list(rec.warnings),
                    ticket=rec.ticket,
                )
                for spec in self.spec.tasks
                for rec in (self.tasks[spec.id],)
            ],
        )

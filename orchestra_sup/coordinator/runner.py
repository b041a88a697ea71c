"""The plan runner's state: which task may start, and what a lane's result does to its plan.

Pure logic over `PlanRecord` values (what the coordinator keeps in LMDB): no IO, no clock, so it is
tested as a table. The coordinator role feeds it results and lost shards and asks it what to
start next.

Task states: pending -> starting -> running -> succeeded | failed | cancelled, and
pending -> skipped when a task it needs ended in anything but succeeded. `starting` means a
`LaneStart` is in flight; reports show it as running.
"""

from __future__ import annotations

import enum

import msgspec

from orchestra_sup.protocol import frames as f


class TaskStatus(enum.StrEnum):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


FINAL = frozenset(
    {TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.SKIPPED, TaskStatus.CANCELLED}
)
LIVE = frozenset({TaskStatus.STARTING, TaskStatus.RUNNING})


class TaskRecord(msgspec.Struct, kw_only=True):
    """One task's durable record. `shard_gen` is the generation of the shard its lane runs on."""

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


class PlanRecord(msgspec.Struct, kw_only=True):
    """One plan's durable record: its spec and one `TaskRecord` per task id."""

    id: str
    spec: f.PlanSpec
    submitted_at: float
    tasks: dict[str, TaskRecord]

    @classmethod
    def new(cls, plan_id: str, spec: f.PlanSpec, submitted_at: float) -> PlanRecord:
        return cls(
            id=plan_id,
            spec=spec,
            submitted_at=submitted_at,
            tasks={t.id: TaskRecord() for t in spec.tasks},
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
        """Pending tasks whose needs have all succeeded, in file order."""
        return [
            spec
            for spec in self.spec.tasks
            if self.tasks[spec.id].status is TaskStatus.PENDING
            and all(self.tasks[n].status is TaskStatus.SUCCEEDED for n in spec.needs)
        ]

    def apply(self, result: f.LaneResult) -> bool:
        """Record a lane's result; False (and no change) when it is stale: the task has moved on
        to another lane or already ended."""
        rec = self.tasks.get(result.task)
        if rec is None or rec.lane != result.lane or rec.status in FINAL:
            return False
        rec.status = TaskStatus(result.status)
        rec.exit_code = result.exit_code
        rec.duration_s = result.duration_s
        rec.output_tail = result.output_tail
        rec.sandbox = result.sandbox
        rec.commit = result.commit
        rec.error = result.error
        return True

    def lose_shard(self, shard: str, generation: int | None) -> list[str]:
        """Fail every live task on `shard` whose lane ran on a generation other than
        `generation` (None: the shard is down, so every generation); returns their ids."""
        lost: list[str] = []
        for task_id, rec in self.tasks.items():
            if rec.status in LIVE and rec.shard == shard and rec.shard_gen != generation:
                rec.status = TaskStatus.FAILED
                rec.error = (
                    f"worker process lost: {shard} (generation {rec.shard_gen}) exited while "
                    f"lane {rec.lane} was running"
                )
                lost.append(task_id)
        return lost

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
                )
                for spec in self.spec.tasks
                for rec in (self.tasks[spec.id],)
            ],
        )

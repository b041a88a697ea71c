"""What `ctl plan` and `ctl plans` show of a plan: its report, task by task, and its summary.

A task shows the status of its record, except that a starting task shows as running and one
that waits for a human (its `pending` is set, a lane asking included) as awaiting_approval.
`plan_summary` counts them from the plan's progress (coordinator/progress.py) and its live
tasks, without reading every task; `sliced_report` builds a big plan's report in slices
(coordinator/slices.py), so a report of 10,000 tasks does not hold the coordinator's loop.
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestra_sup.coordinator import budget
from orchestra_sup.coordinator.runner import PlanRecord, TaskRecord
from orchestra_sup.coordinator.sessionstore import SessionLane
from orchestra_sup.coordinator.slices import Slicer
from orchestra_sup.coordinator.status import FINAL, WAITING, TaskStatus
from orchestra_sup.protocol import frames as f

_SHOWN_FINAL = frozenset(str(s) for s in FINAL)


def shown(rec: TaskRecord) -> str:
    """The status a report shows for task record `rec`."""
    if rec.pending is not None:
        return TaskStatus.AWAITING_APPROVAL
    return TaskStatus.RUNNING if rec.status is TaskStatus.STARTING else str(rec.status)


def task_report(plan: PlanRecord, spec: f.TaskSpec) -> f.TaskReport:
    """Task `spec` of `plan` as a report shows it: a pause's lane when no attempt runs, and
    the answers its pause takes (`PlanRecord.answers_taken`)."""
    rec = plan.tasks[spec.id]
    accepts, needs_retries = plan.answers_taken(spec.id)
    return f.TaskReport(
        id=spec.id,
        status=shown(rec),
        exit_code=rec.exit_code,
        attempts=rec.attempts,
        shard=rec.shard,
        lane=rec.lane or (rec.pending.lane if rec.pending is not None else None),
        sandbox=rec.sandbox,
        duration_s=rec.duration_s,
        output_tail=rec.output_tail,
        commit=rec.commit,
        error=rec.error,
        failure=None if rec.failure is None else str(rec.failure),
        warnings=list(rec.warnings),
        ticket=rec.ticket,
        spent=rec.spent,
        question=None if rec.pending is None else rec.pending.question,
        accepts=accepts,
        needs_retries=needs_retries,
        answers=list(rec.answers.values()),
        retry_at=rec.retry_at if rec.status in WAITING else None,
        notes=list(rec.notes),
        rev=rec.rev,
        stamps_ns=rec.stamps_ns,
    )


def plan_report(plan: PlanRecord) -> f.PlanReport:
    """The whole plan's report, in one step."""
    return _report(plan, (task_report(plan, s) for s in plan.spec.tasks))


async def sliced_report(plan: PlanRecord, slicer: Slicer | None = None) -> f.PlanReport:
    """`plan_report`, built in slices: the loop runs other work between them, so a task may
    change while its plan's report is being built; `done` and `ok` are those of the tasks as
    reported, so a report never says done beside a running task."""
    slicer = slicer or Slicer()
    tasks: list[f.TaskReport] = []
    for spec in plan.spec.tasks:
        tasks.append(task_report(plan, spec))
        await slicer.tick()
    return _report(plan, tasks)


def _report(plan: PlanRecord, tasks: Iterable[f.TaskReport]) -> f.PlanReport:
    reports = list(tasks)
    done = all(t.status in _SHOWN_FINAL for t in reports)
    return f.PlanReport(
        plan=plan.spec.name,
        id=plan.id,
        done=done,
        ok=done and all(t.status == TaskStatus.SUCCEEDED for t in reports),
        spent=plan.spent,
        budget=budget.extend(plan.spec.budget, plan.granted),
        tasks=reports,
    )


def session_report(
    plan: PlanRecord, lanes: list[tuple[SessionLane, PlanRecord | None]]
) -> f.PlanReport:
    """Session `plan`'s report: its coordinator, its outcome, and each lane it started with the
    one-task plan that runs it (None: not loaded)."""
    outcome = plan.outcome
    return f.PlanReport(
        plan=plan.spec.name,
        id=plan.id,
        done=plan.done,
        ok=plan.done and plan.ok,
        spent=budget.total(child.spent for _, child in lanes if child is not None),
        budget=budget.extend(plan.spec.budget, plan.granted),
        tasks=[],
        coordinator=plan.spec.coordinator,
        result=None if outcome is None else outcome.result,
        error=None if outcome is None else outcome.error,
        lanes=[
            f.SessionLaneReport(
                lane=None if child is None else child.tasks["lane"].lane,
                plan=lane.plan,
                run=lane.run,
                rev=(None if child is None else child.tasks["lane"].rev) or lane.rev,
                key=lane.key,
                status="unknown" if child is None else shown(child.tasks["lane"]),
            )
            for lane, child in lanes
        ],
    )


def session_summary(plan: PlanRecord, children: list[PlanRecord | None]) -> f.PlanSummary:
    """Session `plan` in one line: the one-task plans of its lanes (None: not loaded, counted
    "unknown") counted by the status a report shows, without building each lane's report."""
    counts: dict[str, int] = {}
    for child in children:
        status = "unknown" if child is None else shown(child.tasks["lane"])
        counts[status] = counts.get(status, 0) + 1
    return f.PlanSummary(
        id=plan.id,
        plan=plan.spec.name,
        submitted_at=plan.submitted_at,
        done=plan.done,
        ok=plan.done and plan.ok,
        tasks=counts,
    )


def plan_summary(plan: PlanRecord) -> f.PlanSummary:
    """The plan in one line: its tasks counted by the status a report shows. Costs its live
    tasks, not all of them: a task that waits for a human outside a lane is awaiting_approval
    already, so only a live one can show another status than its record's."""
    progress = plan.progress
    counts: dict[str, int] = {}
    for status, n in progress.counts.items():
        if n:
            key = TaskStatus.RUNNING if status is TaskStatus.STARTING else status
            counts[str(key)] = counts.get(str(key), 0) + n
    for task_id in plan.live_ids():
        if plan.tasks[task_id].pending is not None:
            counts[TaskStatus.RUNNING] -= 1
            counts[TaskStatus.AWAITING_APPROVAL] = counts.get(TaskStatus.AWAITING_APPROVAL, 0) + 1
    return f.PlanSummary(
        id=plan.id,
        plan=plan.spec.name,
        submitted_at=plan.submitted_at,
        done=plan.done,
        ok=plan.done and plan.ok,
        tasks={k: n for k, n in counts.items() if n},
    )

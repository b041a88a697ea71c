"""Big plans cost linear work (issue 24): the plan runner's progress (`coordinator.progress`) stays
in step with the task records, and a whole plan (chain listed goal first, fan-out, fan-in; run
to success, or with its first task failing) costs O(tasks + edges) lines of Python, counted with
a line tracer rather than timed. Plan checks (`coordinator.plan`) likewise."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable

import pytest

from orchestra_sup.coordinator.placement import AffinityTicket
from orchestra_sup.coordinator.plan import plan_from_mapping, validate_plan
from orchestra_sup.coordinator.progress import Progress
from orchestra_sup.coordinator.runner import FINAL, PlanRecord, TaskStatus
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.frames import FailureClass

S = TaskStatus
TICKET = AffinityTicket(shard="shard-0", generation=1, boot="b")
SMALL, BIG = 250, 1000
LINEAR = 5.5
"""The most lines(BIG) / lines(SMALL) may be: 4 is linear (BIG is 4 x SMALL), 16 quadratic."""


def lines_run(fn: Callable[[], object]) -> int:
    """Lines of Python `fn` executes (sys.settrace 'line' events: one per line started, and one
    per loop iteration), on this thread."""
    count = 0

    def tracer(frame: object, event: str, arg: object) -> object:
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    old = sys.gettrace()
    sys.settrace(tracer)  # type: ignore[arg-type]
    try:
        fn()
    finally:
        sys.settrace(old)
    return count


def chain(n: int) -> list[f.TaskSpec]:
    """t0 <- t1 <- ... <- t(n-1), listed goal first."""
    return [
        f.TaskSpec(id=f"t{i}", run="true", needs=[f"t{i - 1}"] if i else [])
        for i in range(n - 1, -1, -1)
    ]


def fan_out(n: int) -> list[f.TaskSpec]:
    """t0, then n - 1 tasks that each need it."""
    return [f.TaskSpec(id="t0", run="true")] + [
        f.TaskSpec(id=f"t{i}", run="true", needs=["t0"]) for i in range(1, n)
    ]


def fan_in(n: int) -> list[f.TaskSpec]:
    """n - 1 independent tasks, then a goal that needs them all (t0 is the first of them)."""
    heads = [f.TaskSpec(id=f"t{i}", run="true") for i in range(n - 1)]
    return [*heads, f.TaskSpec(id="goal", run="true", needs=[t.id for t in heads])]


SHAPES = {"chain": chain, "fan_out": fan_out, "fan_in": fan_in}


def result(start: f.LaneStart, status: str) -> f.LaneResult:
    return f.LaneResult(
        lane=start.lane,
        plan=start.plan,
        task=start.task.id,
        shard="shard-0",
        status=status,  # type: ignore[arg-type]
        exit_code=0 if status == "succeeded" else 1,
        duration_s=0.0,
        output_tail="",
        sandbox=None,
        commit=None,
        error=None if status == "succeeded" else "exit 1",
    )


def run_plan(rec: PlanRecord, *, fail: str | None = None, lanes: int = 16) -> None:
    """Run `rec` to its end as the coordinator does: skip what is blocked, place what is ready
    while `lanes` are free, report each lane's end (task `fail` fails), oldest lane first."""
    live: list[f.LaneStart] = []
    while not rec.done:
        rec.skip_blocked()
        rec.hold_for_approval(0.0)
        for spec in rec.iter_ready(0.0):
            if len(live) >= lanes:
                break
            live.append(rec.place(spec, TICKET, 0.0))
            rec.set_status(spec.id, S.RUNNING)
        rec.backoffs()
        if not live:
            assert rec.done, "nothing runs and the plan is not done"
            break
        start = live.pop(0)
        status = "failed" if start.task.id == fail else "succeeded"
        assert rec.apply(result(start, status), 0.0).applied


def rebuilt(rec: PlanRecord) -> Progress:
    return Progress(rec.spec.tasks, [rec.tasks[t.id].status for t in rec.spec.tasks])


def assert_in_step(rec: PlanRecord) -> None:
    """The plan's progress, kept up change by change, is what its records say now."""
    kept, fresh = rec.progress, rebuilt(rec)
    assert kept.status == fresh.status
    assert (kept.unmet, kept.bad) == (fresh.unmet, fresh.bad)
    assert kept.ready == fresh.ready
    assert [kept.is_ready(i) for i in range(len(kept))] == [
        fresh.is_ready(i) for i in range(len(fresh))
    ]
    assert kept.live == fresh.live
    assert +kept.counts == +fresh.counts
    assert set(fresh.blocked) <= set(kept.blocked)  # kept may also hold passed-over entries
    assert rec.done == all(
        r.status in {S.SUCCEEDED, S.FAILED, S.SKIPPED, S.CANCELLED} for r in rec.tasks.values()
    )


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fail", [None, "t0"])
def test_a_whole_plan_costs_linear_work(shape: str, fail: str | None) -> None:
    """Run to its end, a plan of BIG tasks costs at most LINEAR x the lines of one of SMALL
    tasks, and its progress at most LINEAR x the work (`Progress.work` also counts what runs
    inside the interpreter, unseen by the line tracer: heap and sorted-list upkeep), for each
    shape, run to success or with its first task failing (then all that needs it is skipped)."""

    def cost(n: int) -> tuple[int, int]:
        rec = PlanRecord.new("p", f.PlanSpec(name="p", tasks=SHAPES[shape](n)), 0.0)
        lines = lines_run(lambda: run_plan(rec, fail=fail))
        assert rec.done
        statuses = {t.status for t in rec.tasks.values()}
        if fail is None:
            assert statuses == {S.SUCCEEDED}
        else:
            assert {S.FAILED, S.SKIPPED} <= statuses <= {S.FAILED, S.SKIPPED, S.SUCCEEDED}
        return lines, rec.progress.work

    (small, small_work), (big, big_work) = cost(SMALL), cost(BIG)
    assert big <= LINEAR * small, (small, big, big / small)
    assert big_work <= LINEAR * small_work, (small_work, big_work, big_work / small_work)


@pytest.mark.parametrize("shape", ["chain", "fan_out"])
def test_skipping_what_needs_a_failed_task_visits_each_task_once(shape: str) -> None:
    """The first task of a 2,000-task chain listed goal first (or of a fan-out) fails: the
    1,999 skips cost a few units of work each (`Progress.work`), not a pass over the plan (nor
    a heap rebuilt) per skip."""
    rec = PlanRecord.new("p", f.PlanSpec(name="p", tasks=SHAPES[shape](2000)), 0.0)
    first = next(t for t in rec.spec.tasks if t.id == "t0")
    rec.apply(result(rec.place(first, TICKET, 0.0), "failed"), 0.0)
    before = rec.progress.work
    skipped = rec.skip_blocked()
    assert sorted(skipped) == sorted(f"t{i}" for i in range(1, 2000))
    assert rec.tasks["t1999"].error == (
        "skipped: t1998 did not succeed" if shape == "chain" else "skipped: t0 did not succeed"
    )
    assert rec.progress.work - before <= 4 * 2000
    assert rec.done and not rec.ok


def test_skipping_in_slices_gives_the_same_plan() -> None:
    """skip_blocked(limit) skips at most `limit` at a time; in slices of 7 it ends where one
    call does."""
    whole = PlanRecord.new("p", f.PlanSpec(name="p", tasks=fan_out(50)), 0.0)
    sliced = PlanRecord.new("p", f.PlanSpec(name="p", tasks=fan_out(50)), 0.0)
    for rec in (whole, sliced):
        rec.apply(result(rec.place(rec.spec.tasks[0], TICKET, 0.0), "failed"), 0.0)
    everything = whole.skip_blocked()
    parts: list[str] = []
    while sliced.blocking:
        part = sliced.skip_blocked(7)
        assert len(part) <= 7
        parts += part
    assert parts == everything and sliced.tasks == whole.tasks


def test_progress_stays_in_step_with_the_records() -> None:
    """Random plans (random needs), driven through random placements, successes, failures
    with retries, lost shards, sibling restarts and cancellations: after every step the kept
    progress equals one rebuilt from the records."""
    rng = random.Random(24)
    for _ in range(30):
        n = rng.randint(1, 25)
        specs = [
            f.TaskSpec(
                id=f"t{i}",
                run="true",
                needs=rng.sample([f"t{j}" for j in range(i)], k=min(i, rng.randint(0, 3))),
                retries=rng.choice([0, 0, 1, 2]),
                backoff_s=0.5,
            )
            for i in range(n)
        ]
        rng.shuffle(specs)
        strategy = rng.choice(["one_for_one", "one_for_all", "rest_for_one"])
        rec = PlanRecord.new("p", f.PlanSpec(name="p", tasks=specs, strategy=strategy), 0.0)
        live: dict[str, f.LaneStart] = {}
        now = 0.0
        for _step in range(200):
            if rec.done:
                break
            now += 1.0
            move = rng.random()
            ready = rec.ready(now)
            if ready and move < 0.4:
                spec = rng.choice(ready)
                live[spec.id] = rec.place(spec, TICKET, now)
                if rng.random() < 0.5:
                    rec.set_status(spec.id, S.RUNNING)
            elif live and move < 0.8:
                task_id = rng.choice(sorted(live))
                start = live.pop(task_id)
                rec.apply(result(start, rng.choice(["succeeded", "failed"])), now)
            elif live and move < 0.9:
                rec.lose_shard("shard-0", None, max_worker_loss=2, now=now)
                live.clear()
            elif move < 0.95:
                rec.skip_blocked(rng.randint(1, 3))
            else:
                # what the coordinator fails: a task that has not ended
                unended = [s.id for s in specs if rec.tasks[s.id].status not in FINAL]
                rec.fail(rng.choice(unended), FailureClass.TOOL_FAILURE, "boom", now)
            live = {t: s for t, s in live.items() if rec.tasks[t].lane == s.lane}
            assert_in_step(rec)
        rec.skip_blocked()
        assert_in_step(rec)


class Name(str):
    """A task id whose comparisons run a line of Python, so the line tracer sees them (a
    comparison of plain strings runs inside the interpreter, unseen)."""

    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        return str.__eq__(self, other)


def as_file(tasks: list[f.TaskSpec]) -> dict[str, object]:
    """The plan as TOML would give it, its needs as `Name`s."""
    return {
        "name": "p",
        "task": [{"id": t.id, "run": t.run, "needs": [Name(n) for n in t.needs]} for t in tasks],
    }


@pytest.mark.parametrize("shape", SHAPES)
def test_checking_a_plan_costs_linear_work(shape: str) -> None:
    """Checking a plan file 4 x as big (`plan_from_mapping`, which the coordinator's
    `validate_plan` runs too) costs at most LINEAR x as much, comparisons of ids included (a
    need checked against a list of the needs seen before made a fan-in's goal quadratic)."""
    files = [as_file(SHAPES[shape](n)) for n in (SMALL, BIG)]
    small, big = (lines_run(lambda data=data: plan_from_mapping(data)) for data in files)
    assert big <= LINEAR * small, (small, big, big / small)


def test_the_coordinator_checks_a_plan_as_a_file_is_checked() -> None:
    """validate_plan of a built plan gives what checking it as a file gives."""
    spec = f.PlanSpec(name="p", tasks=fan_in(30))
    assert validate_plan(spec) == plan_from_mapping(as_file(spec.tasks)) == spec

"""Tests for the plan runner's pure state (`coordinator.runner.PlanRecord`) and lane placement
(`coordinator.placement.place`), as tables."""

from __future__ import annotations

import msgspec
import pytest

from orchestra_sup.coordinator.placement import AffinityTicket
from orchestra_sup.coordinator.report import plan_report
from orchestra_sup.coordinator.runner import (
    FINAL,
    HELD,
    LIVE,
    WAITING,
    FailureClass,
    PlanRecord,
    TaskRecord,
    TaskStatus,
)
from orchestra_sup.protocol import frames as f

S = TaskStatus


def _plan(*tasks: str | tuple[str, list[str]], statuses: dict[str, TaskStatus] | None = None):
    """A plan record from task ids in file order (`"b"` or `("b", ["a"])` for needs), with the
    given statuses set."""
    specs = [
        f.TaskSpec(id=t, run=f"echo {t}")
        if isinstance(t, str)
        else f.TaskSpec(id=t[0], run=f"echo {t[0]}", needs=t[1])
        for t in tasks
    ]
    rec = PlanRecord.new("plan-1", f.PlanSpec(name="demo", tasks=specs), submitted_at=100.0)
    for task_id, status in (statuses or {}).items():
        _set(rec, task_id, status)
    return rec


def _set(rec: PlanRecord, task_id: str, status: TaskStatus) -> TaskRecord:
    """Give task `task_id` `status` as a record loaded from disk has it: any status (the
    transitions table guards the runner's moves, not where a record starts), its progress
    derived again."""
    rec.tasks[task_id].status = status
    rec.__dict__.pop("progress", None)
    return rec.tasks[task_id]


def _live(
    rec: PlanRecord,
    task_id: str,
    *,
    lane: str,
    shard: str = "shard-0",
    gen: int = 1,
    status: TaskStatus = S.RUNNING,
) -> TaskRecord:
    """Put `task_id` on `lane` of `shard` generation `gen`, as the coordinator does at start."""
    t = _set(rec, task_id, status)
    t.lane, t.shard, t.shard_gen, t.attempts = lane, shard, gen, 1
    return t


def _result(task: str, lane: str, status: str = "succeeded", **kw: object) -> f.LaneResult:
    fields: dict[str, object] = {
        "lane": lane,
        "plan": "plan-1",
        "task": task,
        "shard": "shard-0",
        "status": status,
        "exit_code": 0 if status == "succeeded" else 1,
        "duration_s": 1.25,
        "output_tail": f"{task} says hi\n",
        "sandbox": f"/sandboxes/{lane}",
        "commit": None,
        "error": None if status == "succeeded" else f"{task} {status}",
    }
    fields.update(kw)
    return f.LaneResult(**fields)  # type: ignore[arg-type]


def _copy(t: TaskRecord) -> TaskRecord:
    return msgspec.structs.replace(t)


def test_status_sets() -> None:
    """FINAL, LIVE, WAITING (pending, paused, interrupted) and HELD (awaiting_approval)
    partition the statuses: paused, interrupted and awaiting_approval are not final."""
    assert set(TaskStatus) == FINAL | LIVE | WAITING | HELD
    assert not (FINAL | LIVE | WAITING) & HELD
    assert {S.PENDING, S.PAUSED, S.INTERRUPTED} == WAITING
    assert not FINAL & LIVE and not FINAL & WAITING and not LIVE & WAITING


def test_record_written_before_the_new_fields_still_decodes() -> None:
    """A task record persisted before worker_losses, failure and warnings existed decodes with
    their defaults (msgspec schema evolution), and a new one round-trips."""

    class OldTaskRecord(msgspec.Struct, kw_only=True):
        status: TaskStatus = TaskStatus.PENDING
        attempts: int = 0
        lane: str | None = None
        error: str | None = None

    old = msgspec.msgpack.encode(OldTaskRecord(status=S.RUNNING, attempts=1, lane="l-1"))
    rec = msgspec.msgpack.decode(old, type=TaskRecord)
    assert (rec.status, rec.attempts, rec.lane) == (S.RUNNING, 1, "l-1")
    assert (rec.worker_losses, rec.failure, rec.warnings) == (0, None, [])
    new = TaskRecord(worker_losses=2, failure=FailureClass.WORKER_PROCESS_LOSS, warnings=["w"])
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(new), type=TaskRecord) == new


def test_failure_class_values() -> None:
    """The failure classes have the stable names of ARCHITECTURE.md §7."""
    assert {c.value for c in FailureClass} == {
        "quality_miss",
        "tool_failure",
        "budget_exhaustion",
        "timeout",
        "preflight_escalation",
        "worker_process_loss",
        "quota_breach",
    }


def test_new_record_has_one_pending_task_per_spec() -> None:
    """A new plan record holds one pending, attempt-less record per task, keyed by id."""
    rec = _plan("a", ("b", ["a"]))
    assert rec.id == "plan-1"
    assert rec.submitted_at == 100.0
    assert rec.tasks == {"a": TaskRecord(), "b": TaskRecord()}
    assert rec.tasks["a"].status is S.PENDING


# --- ready ---------------------------------------------------------------------------------------

READY_TABLE = [
    ("no needs: all, in file order", ["c", "a", "b"], {}, ["c", "a", "b"]),
    ("need pending", ["a", ("b", ["a"])], {}, ["a"]),
    ("need starting", ["a", ("b", ["a"])], {"a": S.STARTING}, []),
    ("need paused", ["a", ("b", ["a"])], {"a": S.PAUSED}, ["a"]),
    ("paused with needs succeeded", ["a", ("b", ["a"])], {"a": S.SUCCEEDED, "b": S.PAUSED}, ["b"]),
    ("need running", ["a", ("b", ["a"])], {"a": S.RUNNING}, []),
    ("need succeeded", ["a", ("b", ["a"])], {"a": S.SUCCEEDED}, ["b"]),
    ("need failed", ["a", ("b", ["a"])], {"a": S.FAILED}, []),
    ("need cancelled", ["a", ("b", ["a"])], {"a": S.CANCELLED}, []),
    ("need skipped", ["a", ("b", ["a"])], {"a": S.SKIPPED}, []),
    ("two needs, one done", ["a", "b", ("c", ["a", "b"])], {"a": S.SUCCEEDED}, ["b"]),
    (
        "two needs, both done",
        ["a", "b", ("c", ["a", "b"])],
        {"a": S.SUCCEEDED, "b": S.SUCCEEDED},
        ["c"],
    ),
    (
        "only pending and paused tasks are ready",
        ["a", "b", "c", "d", "e", "f"],
        {"a": S.STARTING, "b": S.RUNNING, "c": S.SUCCEEDED, "d": S.FAILED, "f": S.PAUSED},
        ["e", "f"],
    ),
    (
        "need listed later in the file",
        [("late", ["early"]), "early", "other"],
        {"early": S.SUCCEEDED},
        ["late", "other"],
    ),
    ("everything done", ["a", "b"], {"a": S.SUCCEEDED, "b": S.SUCCEEDED}, []),
]


@pytest.mark.parametrize(
    ("tasks", "statuses", "expected"),
    [row[1:] for row in READY_TABLE],
    ids=[row[0] for row in READY_TABLE],
)
def test_ready(tasks: list, statuses: dict[str, TaskStatus], expected: list[str]) -> None:
    """ready() lists pending and paused tasks whose needs all succeeded, in file order."""
    rec = _plan(*tasks, statuses=statuses)
    ready = rec.ready()
    assert [t.id for t in ready] == expected
    assert all(isinstance(t, f.TaskSpec) for t in ready)


def test_ready_changes_nothing() -> None:
    """ready() is a query: it leaves every record as it was."""
    rec = _plan("a", ("b", ["a"]), statuses={"a": S.FAILED})
    before = {k: _copy(v) for k, v in rec.tasks.items()}
    rec.ready()
    assert rec.tasks == before


# --- apply ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("start", [S.STARTING, S.RUNNING])
@pytest.mark.parametrize("outcome", ["succeeded", "failed", "cancelled"])
def test_apply_matching_result_updates_record(start: TaskStatus, outcome: str) -> None:
    """A result for the task's current lane sets its status and every reported field."""
    rec = _plan("a", "b")
    _live(rec, "a", lane="lane-1", status=start)
    result = _result("a", "lane-1", outcome, commit="abc123" if outcome == "succeeded" else None)
    assert rec.apply(result)[0] is True
    t = rec.tasks["a"]
    assert t.status is TaskStatus(outcome)
    assert t.exit_code == result.exit_code
    assert t.duration_s == 1.25
    assert t.output_tail == "a says hi\n"
    assert t.sandbox == "/sandboxes/lane-1"
    assert t.commit == result.commit
    assert t.error == result.error
    assert (t.lane, t.shard, t.shard_gen, t.attempts) == ("lane-1", "shard-0", 1, 1)
    assert rec.tasks["b"] == TaskRecord()


def _stale_cases() -> list[tuple[str, TaskStatus, str | None, str, str]]:
    """(case, task status, task lane, result task, result lane)."""
    return [
        ("other lane", S.RUNNING, "lane-2", "a", "lane-1"),
        ("no lane yet", S.PENDING, None, "a", "lane-1"),
        ("paused: its lost lane", S.PAUSED, None, "a", "lane-1"),
        ("already succeeded", S.SUCCEEDED, "lane-1", "a", "lane-1"),
        ("already failed", S.FAILED, "lane-1", "a", "lane-1"),
        ("already cancelled", S.CANCELLED, "lane-1", "a", "lane-1"),
        ("already skipped", S.SKIPPED, "lane-1", "a", "lane-1"),
        ("unknown task", S.RUNNING, "lane-1", "zzz", "lane-1"),
    ]


@pytest.mark.parametrize(
    ("status", "lane", "task", "result_lane"),
    [c[1:] for c in _stale_cases()],
    ids=[c[0] for c in _stale_cases()],
)
def test_apply_stale_result_is_ignored(
    status: TaskStatus, lane: str | None, task: str, result_lane: str
) -> None:
    """A result for another lane, an already-final task or an unknown task returns False and
    changes nothing."""
    rec = _plan("a")
    t = rec.tasks["a"]
    t.status, t.lane, t.exit_code, t.output_tail = status, lane, 0, "before"
    before = _copy(t)
    assert rec.apply(_result(task, result_lane, "failed"))[0] is False
    assert rec.tasks == {"a": before}


def test_apply_then_duplicate_is_ignored() -> None:
    """A result delivered twice (inbox redelivery) is applied once; the second returns False."""
    rec = _plan("a")
    _live(rec, "a", lane="lane-1")
    assert rec.apply(_result("a", "lane-1"))[0] is True
    after = _copy(rec.tasks["a"])
    assert rec.apply(_result("a", "lane-1", "failed"))[0] is False
    assert rec.tasks["a"] == after


# --- skip_blocked --------------------------------------------------------------------------------

SKIP_TABLE = [
    # (case, tasks in file order, statuses, expected skipped ids, expected blocker per skipped id)
    (
        "chain a->b->c, a failed",
        ["a", ("b", ["a"]), ("c", ["b"])],
        {"a": S.FAILED},
        ["b", "c"],
        {"b": "a", "c": "b"},
    ),
    (
        "chain listed backwards",
        [("c", ["b"]), ("b", ["a"]), "a"],
        {"a": S.FAILED},
        ["b", "c"],
        {"b": "a", "c": "b"},
    ),
    ("cancelled need", ["a", ("b", ["a"])], {"a": S.CANCELLED}, ["b"], {"b": "a"}),
    ("skipped need", ["a", ("b", ["a"])], {"a": S.SKIPPED}, ["b"], {"b": "a"}),
    ("succeeded need", ["a", ("b", ["a"])], {"a": S.SUCCEEDED}, [], {}),
    ("running need", ["a", ("b", ["a"])], {"a": S.RUNNING}, [], {}),
    ("starting need", ["a", ("b", ["a"])], {"a": S.STARTING}, [], {}),
    ("paused need", ["a", ("b", ["a"])], {"a": S.PAUSED}, [], {}),
    ("pending need", ["a", ("b", ["a"])], {}, [], {}),
    (
        "one of two needs failed",
        ["a", "b", ("c", ["a", "b"])],
        {"a": S.SUCCEEDED, "b": S.FAILED},
        ["c"],
        {"c": "b"},
    ),
    (
        "diamond",
        ["a", ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"]), "e"],
        {"a": S.FAILED},
        ["b", "c", "d"],
        {"b": "a", "c": "a", "d": "b"},
    ),
    (
        "live dependant is left alone",
        ["a", ("b", ["a"])],
        {"a": S.FAILED, "b": S.RUNNING},
        [],
        {},
    ),
]


@pytest.mark.parametrize(
    ("tasks", "statuses", "expected", "blockers"),
    [row[1:] for row in SKIP_TABLE],
    ids=[row[0] for row in SKIP_TABLE],
)
def test_skip_blocked(
    tasks: list,
    statuses: dict[str, TaskStatus],
    expected: list[str],
    blockers: dict[str, str],
) -> None:
    """skip_blocked() skips, transitively, every pending task with a need that did not succeed,
    and each skipped task's error names its blocker."""
    rec = _plan(*tasks, statuses=statuses)
    before = {k: _copy(v) for k, v in rec.tasks.items()}
    skipped = rec.skip_blocked()
    assert sorted(skipped) == sorted(expected)
    for task_id, t in rec.tasks.items():
        if task_id in expected:
            assert t.status is S.SKIPPED
            assert t.error == f"skipped: {blockers[task_id]} did not succeed"
        else:
            assert t == before[task_id]
    assert rec.skip_blocked() == []


# --- place / unplace -----------------------------------------------------------------------------


def test_place_makes_a_lane_per_attempt() -> None:
    """place() counts an attempt, names the lane after it, records shard and generation, and
    returns the LaneStart to send."""
    rec = _plan("a")
    spec = rec.spec.tasks[0]
    start = rec.place(spec, AffinityTicket(shard="shard-1", generation=4, boot="b"))
    t = rec.tasks["a"]
    assert (t.status, t.attempts, t.lane, t.shard, t.shard_gen) == (
        S.STARTING,
        1,
        "plan-1-a-1",
        "shard-1",
        4,
    )
    assert start == f.LaneStart(
        lane="plan-1-a-1", plan="plan-1", task=spec, attempt=1, plan_name="demo", warnings=[]
    )


@pytest.mark.parametrize(("losses", "back_to"), [(0, S.PENDING), (1, S.PAUSED)])
def test_unplace_undoes_a_refused_placement(losses: int, back_to: TaskStatus) -> None:
    """unplace() (the shard was full or down) puts the task back where it waited, pending or
    paused, and does not count the attempt."""
    rec = _plan("a", statuses={"a": back_to})
    rec.tasks["a"].worker_losses = losses
    rec.tasks["a"].attempts = losses
    rec.place(rec.spec.tasks[0], AffinityTicket(shard="shard-0", generation=1, boot="b"))
    rec.unplace("a")
    t = rec.tasks["a"]
    assert (t.status, t.attempts, t.lane, t.shard, t.shard_gen) == (
        back_to,
        losses,
        None,
        None,
        None,
    )
    assert [s.id for s in rec.ready()] == ["a"]


# --- lose_shard: pause, re-place, cap ------------------------------------------------------------

CAP = 3


def _fleet() -> PlanRecord:
    """Tasks spread over two shards and generations, in every interesting state."""
    rec = _plan("r1", "st2", "other", "done", "wait", ("dep", ["r1"]))
    _live(rec, "r1", lane="lane-1", shard="shard-0", gen=1)
    _live(rec, "st2", lane="lane-2", shard="shard-0", gen=2, status=S.STARTING)
    _live(rec, "other", lane="lane-3", shard="shard-1", gen=1)
    _live(rec, "done", lane="lane-4", shard="shard-0", gen=1, status=S.SUCCEEDED)
    return rec


def _warning(lane: str, shard: str, gen: int, rerun: bool = True) -> str:
    then = "re-running the step" if rerun else "not re-run"
    return (
        f"partial work: lane {lane} was interrupted when {shard} (generation {gen}) was lost; "
        f"{then}"
    )


def test_lose_shard_down_pauses_every_live_task_on_it() -> None:
    """lose_shard(shard, None) pauses every starting/running task on that shard, whatever its
    generation: never failed, one loss counted, a partial-work warning naming the lane, shard and
    generation, and the lane let go so it is re-placed; nothing else changes."""
    rec = _fleet()
    before = {k: _copy(v) for k, v in rec.tasks.items()}
    assert sorted(rec.lose_shard("shard-0", None, CAP)) == ["r1", "st2"]
    for task_id, lane, gen in (("r1", "lane-1", 1), ("st2", "lane-2", 2)):
        t = rec.tasks[task_id]
        assert t.status is S.PAUSED
        assert (t.lane, t.shard, t.shard_gen) == (None, None, None)
        assert (t.attempts, t.worker_losses) == (1, 1)
        assert (t.failure, t.error) == (None, None)
        assert t.warnings == [_warning(lane, "shard-0", gen)]
    for task_id in ("other", "done", "wait", "dep"):
        assert rec.tasks[task_id] == before[task_id]
    assert [s.id for s in rec.ready()] == ["r1", "st2", "wait"]
    assert not rec.done


def test_lose_shard_generation_spares_that_generation() -> None:
    """lose_shard(shard, gen) pauses only the shard's live tasks of other generations: a restarted
    shard keeps lanes started on its new incarnation."""
    rec = _fleet()
    before = {k: _copy(v) for k, v in rec.tasks.items()}
    assert rec.lose_shard("shard-0", 2, CAP) == ["r1"]
    assert rec.tasks["r1"].status is S.PAUSED
    assert rec.tasks["r1"].warnings == [_warning("lane-1", "shard-0", 1)]
    for task_id in ("st2", "other", "done", "wait", "dep"):
        assert rec.tasks[task_id] == before[task_id]


# --- rollovers: lanes moving between generations of one shard ------------------------------------


def test_lose_shard_keeps_tasks_on_draining_generations() -> None:
    """A rollover's surge: the roster shows shard-0 at generation 2 with 1 draining. Tasks whose
    lanes run on generation 1 are moving, not lost; the rule still loses other generations."""
    rec = _fleet()
    _live(rec, "wait", lane="lane-5", shard="shard-0", gen=0)  # a generation long gone
    before = {k: _copy(v) for k, v in rec.tasks.items()}
    assert rec.lose_shard("shard-0", 2, CAP, keep={1}) == ["wait"]
    for task_id in ("r1", "st2", "other", "done", "dep"):
        assert rec.tasks[task_id] == before[task_id]
    assert rec.lose_shard("shard-0", None, CAP) == ["r1", "st2"]  # down: nothing is kept


def test_settle_moved_moves_the_lanes_the_shard_has_and_loses_the_rest() -> None:
    """Generation 1 retired: lanes generation 2 has (live, or with a result in its outbox) run
    there now; the others are lost as with a dead shard. Nothing else changes."""
    rec = _plan("moved", "pending-result", "gone", "other", "new")
    _live(rec, "moved", lane="lane-m", gen=1)
    _live(rec, "pending-result", lane="lane-p", gen=1)
    _live(rec, "gone", lane="lane-g", gen=1)
    _live(rec, "other", lane="lane-o", shard="shard-1", gen=1)
    _live(rec, "new", lane="lane-n", gen=2)
    before = {k: _copy(v) for k, v in rec.tasks.items()}
    moved, lost = rec.settle_moved("shard-0", {1}, 2, {"lane-m", "lane-p", "lane-n"}, CAP)
    assert (moved, lost) == (["moved", "pending-result"], ["gone"])
    for task_id in ("moved", "pending-result"):
        t = rec.tasks[task_id]
        assert (t.status, t.shard_gen, t.attempts, t.worker_losses) == (S.RUNNING, 2, 1, 0)
        assert not t.warnings
    assert rec.tasks["gone"].status is S.PAUSED
    assert rec.tasks["gone"].warnings == [_warning("lane-g", "shard-0", 1)]
    for task_id in ("other", "new"):
        assert rec.tasks[task_id] == before[task_id]
    assert rec.lose_shard("shard-0", 2, CAP) == []  # settled: nothing left on generation 1


def test_a_result_still_in_an_outbox_when_its_generation_retires_runs_once() -> None:
    """The lane finished on the draining generation and its result was not delivered before it
    retired: the successor reports it among its outbox results, so the task stays placed and the
    result, delivered late, is applied: one attempt, no re-run."""
    rec = _plan("a")
    _live(rec, "a", lane="lane-a", gen=1)
    assert rec.lose_shard("shard-0", 2, CAP, keep={1}) == []
    assert rec.settle_moved("shard-0", {1}, 2, {"lane-a"}, CAP) == (["a"], [])
    assert rec.ready() == []
    assert rec.apply(_result("a", "lane-a"))[0]
    assert (rec.tasks["a"].status, rec.tasks["a"].attempts) == (S.SUCCEEDED, 1)


def test_a_results_warnings_are_kept_once_each() -> None:
    """A partial-work warning a lane's result carries (its step re-ran after a rollover) is
    recorded in the task's warnings, after those it had, and not twice."""
    rec = _plan("a")
    t = _live(rec, "a", lane="lane-a")
    t.warnings = ["earlier"]
    warned = _result("a", "lane-a", warnings=["partial work: re-run", "earlier"])
    assert rec.apply(warned)[0]
    assert t.warnings == ["earlier", "partial work: re-run"]


def test_lose_unknown_shard_changes_nothing() -> None:
    """Losing a shard no task runs on returns nothing and changes nothing."""
    rec = _fleet()
    before = {k: _copy(v) for k, v in rec.tasks.items()}
    assert rec.lose_shard("shard-9", None, CAP) == []
    assert rec.tasks == before


def test_one_loss_seen_twice_counts_once() -> None:
    """The roster reports a loss as down, then up at a new generation: the second sighting finds
    nothing live on the old generation and counts nothing."""
    rec = _fleet()
    rec.lose_shard("shard-0", None, CAP)
    after = {k: _copy(v) for k, v in rec.tasks.items()}
    assert rec.lose_shard("shard-0", 3, CAP) == []
    assert rec.tasks == after


CAP_TABLE = [
    # (case, max_worker_loss, losses before this one, paused?)
    ("first loss, cap 3", 3, 0, True),
    ("second loss, cap 3", 3, 1, True),
    ("third loss reaches cap 3", 3, 2, False),
    ("cap 1: the first loss fails", 1, 0, False),
    ("cap 2: the second loss fails", 2, 1, False),
    ("far below cap 100", 100, 50, True),
    ("reaches cap 100", 100, 99, False),
]


@pytest.mark.parametrize(
    ("cap", "prior", "paused"),
    [row[1:] for row in CAP_TABLE],
    ids=[row[0] for row in CAP_TABLE],
)
def test_loss_against_the_cap(cap: int, prior: int, paused: bool) -> None:
    """Below max_worker_loss a loss pauses the task (ready again, no failure); the loss that
    reaches it fails the task with the failure class worker_process_loss and an error naming the
    count and the cap. Either way the loss is counted and its warning appended to earlier ones."""
    rec = _plan("a", ("b", ["a"]))
    t = _live(rec, "a", lane=f"plan-1-a-{prior + 1}", gen=prior + 1)
    t.attempts, t.worker_losses = prior + 1, prior
    t.warnings = [f"earlier {i}" for i in range(prior)]
    assert rec.lose_shard("shard-0", None, cap) == ["a"]
    assert t.worker_losses == prior + 1
    assert t.attempts == prior + 1
    lane = f"plan-1-a-{prior + 1}"
    assert t.warnings == [
        *(f"earlier {i}" for i in range(prior)),
        _warning(lane, "shard-0", prior + 1, rerun=paused),
    ]
    if paused:
        assert t.status is S.PAUSED
        assert (t.failure, t.error, t.lane) == (None, None, None)
        assert [s.id for s in rec.ready()] == ["a"]
        assert rec.skip_blocked() == []
    else:
        assert t.status is S.FAILED
        assert t.failure is FailureClass.WORKER_PROCESS_LOSS
        assert t.error is not None
        assert f"lost {prior + 1} times" in t.error
        assert f"max_worker_loss = {cap}" in t.error
        assert lane in t.error and "shard-0" in t.error
        assert (t.lane, t.shard) == (lane, "shard-0")
        assert rec.ready() == []
        assert rec.skip_blocked() == ["b"]
        assert rec.done


def test_paused_task_keeps_its_dependants_pending() -> None:
    """A paused task is not a failure: its dependants stay pending (not skipped, not ready), and
    the plan is not done."""
    rec = _fleet()
    rec.lose_shard("shard-0", None, CAP)
    assert rec.skip_blocked() == []
    assert rec.tasks["dep"].status is S.PENDING
    assert "dep" not in [s.id for s in rec.ready()]
    assert not rec.done


def _lose_and_replace(rec: PlanRecord, task_id: str, gen: int) -> f.LaneStart | None:
    """Lose the task's shard (shard-0 at `gen`); if that paused it, place it again on the
    restarted shard-0 at `gen + 1`, as the coordinator's pump does."""
    rec.lose_shard("shard-0", gen + 1, CAP)
    if rec.tasks[task_id].status is not S.PAUSED:
        return None
    assert [s.id for s in rec.ready()] == [task_id]
    return rec.place(
        rec.spec.tasks[0], AffinityTicket(shard="shard-0", generation=gen + 1, boot="b")
    )


def test_replaced_task_succeeds_with_warning_and_stale_result_ignored() -> None:
    """Lost once then re-placed on the restarted shard: attempt 2 runs as a new lane carrying the
    warning; a late result of the lost lane is ignored; the new lane's result ends the task with
    attempts 2 and the warning kept; the plan is ok."""
    rec = _plan("a")
    rec.place(rec.spec.tasks[0], AffinityTicket(shard="shard-0", generation=1, boot="b"))
    start = _lose_and_replace(rec, "a", 1)
    assert start is not None
    warning = _warning("plan-1-a-1", "shard-0", 1)
    assert (start.lane, start.attempt, start.warnings) == ("plan-1-a-2", 2, [warning])
    before = _copy(rec.tasks["a"])
    assert rec.apply(_result("a", "plan-1-a-1"))[0] is False
    assert rec.tasks["a"] == before
    assert rec.apply(_result("a", "plan-1-a-2"))[0] is True
    t = rec.tasks["a"]
    assert (t.status, t.attempts, t.worker_losses, t.failure) == (S.SUCCEEDED, 2, 1, None)
    assert t.warnings == [warning]
    assert rec.done and rec.ok
    report = plan_report(rec).tasks[0]
    assert (report.status, report.attempts, report.failure) == ("succeeded", 2, None)
    assert report.warnings == [warning]


def test_task_that_keeps_losing_its_shard_fails_at_the_cap() -> None:
    """A task whose every lane loses its shard is re-placed until its max_worker_loss-th loss,
    then fails with worker_process_loss: attempts == max_worker_loss, one warning per loss, its
    dependant skipped, the plan done; the report carries the failure class and warnings."""
    rec = _plan("a", ("b", ["a"]))
    rec.place(rec.spec.tasks[0], AffinityTicket(shard="shard-0", generation=1, boot="b"))
    lanes = ["plan-1-a-1"]
    for gen in range(1, CAP):
        start = _lose_and_replace(rec, "a", gen)
        assert start is not None and start.attempt == gen + 1
        assert len(start.warnings) == gen
        lanes.append(start.lane)
    assert _lose_and_replace(rec, "a", CAP) is None
    t = rec.tasks["a"]
    assert (t.status, t.failure) == (S.FAILED, FailureClass.WORKER_PROCESS_LOSS)
    assert t.attempts == t.worker_losses == CAP
    assert lanes == [f"plan-1-a-{i}" for i in range(1, CAP + 1)]
    assert t.warnings == [
        _warning(lane, "shard-0", i, rerun=i < CAP) for i, lane in enumerate(lanes, 1)
    ]
    assert rec.skip_blocked() == ["b"]
    assert rec.done and not rec.ok
    report = {r.id: r for r in plan_report(rec).tasks}
    assert report["a"].status == "failed"
    assert report["a"].failure == "worker_process_loss"
    assert report["a"].warnings == t.warnings
    assert (report["b"].status, report["b"].failure) == ("skipped", None)
    assert rec.apply(_result("a", lanes[-1]))[0] is False


# --- done / ok / report --------------------------------------------------------------------------

DONE_TABLE = [
    ("all succeeded", {"a": S.SUCCEEDED, "b": S.SUCCEEDED}, True, True),
    ("one failed", {"a": S.SUCCEEDED, "b": S.FAILED}, True, False),
    ("one skipped", {"a": S.FAILED, "b": S.SKIPPED}, True, False),
    ("one cancelled", {"a": S.SUCCEEDED, "b": S.CANCELLED}, True, False),
    ("one running", {"a": S.SUCCEEDED, "b": S.RUNNING}, False, False),
    ("one starting", {"a": S.SUCCEEDED, "b": S.STARTING}, False, False),
    ("one paused", {"a": S.SUCCEEDED, "b": S.PAUSED}, False, False),
    ("one pending", {"a": S.SUCCEEDED}, False, False),
    ("nothing started", {}, False, False),
]


@pytest.mark.parametrize(
    ("statuses", "done", "ok"),
    [row[1:] for row in DONE_TABLE],
    ids=[row[0] for row in DONE_TABLE],
)
def test_done_and_ok(statuses: dict[str, TaskStatus], done: bool, ok: bool) -> None:
    """done: every task is final; ok (and the report's ok): every task succeeded."""
    rec = _plan("a", "b", statuses=statuses)
    assert rec.done is done
    assert rec.ok is ok
    report = plan_report(rec)
    assert report.done is done
    assert report.ok is ok


def test_report_shows_starting_as_running() -> None:
    """report() shows a starting task as "running" and every other status by its own name."""
    rec = _plan(*(s.value for s in TaskStatus))
    for status in TaskStatus:
        rec.tasks[status.value].status = status
    shown = {t.id: t.status for t in plan_report(rec).tasks}
    assert shown[S.STARTING.value] == "running"
    for status in set(TaskStatus) - {S.STARTING}:
        assert shown[status.value] == status.value
    assert all(type(s) in (str, TaskStatus) for s in shown.values())


def test_report_fields_follow_records_in_file_order() -> None:
    """report() names the plan, lists tasks in file order and copies each record's fields, and
    survives a codec round trip."""
    rec = _plan("z", "a", ("m", ["z"]))
    _live(rec, "z", lane="lane-7", shard="shard-1", gen=3)
    assert rec.apply(_result("z", "lane-7", commit="c0ffee"))[0]
    report = plan_report(rec)
    assert (report.plan, report.id) == ("demo", "plan-1")
    assert [t.id for t in report.tasks] == ["z", "a", "m"]
    z = report.tasks[0]
    assert z == f.TaskReport(
        id="z",
        status="succeeded",
        exit_code=0,
        attempts=1,
        shard="shard-1",
        lane="lane-7",
        sandbox="/sandboxes/lane-7",
        duration_s=1.25,
        output_tail="z says hi\n",
        commit="c0ffee",
        error=None,
        failure=None,
        warnings=[],
    )
    assert report.tasks[1] == f.TaskReport(id="a", status="pending")
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(report), type=f.PlanReport)
    assert back == report


def test_interrupted_result_is_not_a_verdict() -> None:
    """A lane interrupted by a stop leaves its task waiting to run again, with a partial-work
    warning, no worker loss counted and no failure class."""
    spec = f.PlanSpec(name="p", tasks=[f.TaskSpec(id="a", run="true")])
    plan = PlanRecord.new("pid", spec, 0.0)
    rec = plan.tasks["a"]
    rec.status, rec.lane, rec.shard, rec.shard_gen, rec.attempts = S.RUNNING, "L1", "shard-0", 1, 1
    result = f.LaneResult(
        lane="L1",
        plan="pid",
        task="a",
        shard="shard-0",
        status="interrupted",
        exit_code=None,
        duration_s=1.0,
        output_tail="half",
        sandbox=None,
        commit=None,
        error="interrupted",
    )
    assert plan.apply(result)[0]
    assert rec.status is S.INTERRUPTED and rec.worker_losses == 0 and rec.failure is None
    assert rec.lane is None and "partial work" in rec.warnings[-1]
    assert [t.id for t in plan.ready()] == ["a"]
    assert not plan.done


def test_an_interrupted_re_run_keeps_the_warning_of_its_drain() -> None:
    """A lane re-running its step after a rollover's drain (its result carries that warning) is
    then interrupted by a stop: the task keeps both warnings, the drain's first."""
    spec = f.PlanSpec(name="p", tasks=[f.TaskSpec(id="a", run="true")])
    plan = PlanRecord.new("pid", spec, 0.0)
    rec = plan.tasks["a"]
    rec.status, rec.lane, rec.shard, rec.shard_gen, rec.attempts = S.RUNNING, "L1", "shard-0", 2, 1
    drained = "partial work: lane L1 was stopped mid-step when generation 1 was drained"
    assert plan.apply(_result("a", "L1", "interrupted", warnings=[drained]))[0]
    assert rec.warnings[0] == drained and "was interrupted when" in rec.warnings[1]


def test_interrupt_shard_on_stop_counts_no_loss() -> None:
    """When the tree is stopping, a shard going down interrupts its live tasks instead of
    losing them."""
    spec = f.PlanSpec(name="p", tasks=[f.TaskSpec(id="a", run="true")])
    plan = PlanRecord.new("pid", spec, 0.0)
    rec = plan.tasks["a"]
    rec.status, rec.lane, rec.shard, rec.shard_gen = S.RUNNING, "L1", "shard-0", 1
    assert plan.interrupt_shard("shard-0") == ["a"]
    assert rec.status is S.INTERRUPTED and rec.worker_losses == 0

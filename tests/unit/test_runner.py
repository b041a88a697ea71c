"""Tests for the plan runner's pure state (`coordinator.runner.PlanRecord`) and lane placement
(`coordinator.placement.place`), as tables."""

from __future__ import annotations

import msgspec
import pytest

from orchestra_sup.coordinator.placement import ShardView, place
from orchestra_sup.coordinator.runner import FINAL, LIVE, PlanRecord, TaskRecord, TaskStatus
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
        rec.tasks[task_id].status = status
    return rec


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
    t = rec.tasks[task_id]
    t.status, t.lane, t.shard, t.shard_gen, t.attempts = status, lane, shard, gen, 1
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
    """FINAL and LIVE partition every status except pending."""
    assert FINAL | LIVE | {S.PENDING} == set(TaskStatus)
    assert not FINAL & LIVE


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
        "only pending tasks are ready",
        ["a", "b", "c", "d", "e"],
        {"a": S.STARTING, "b": S.RUNNING, "c": S.SUCCEEDED, "d": S.FAILED},
        ["e"],
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
    """ready() lists pending tasks whose needs all succeeded, in file order."""
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
    assert rec.apply(result) is True
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
    assert rec.apply(_result(task, result_lane, "failed")) is False
    assert rec.tasks == {"a": before}


def test_apply_then_duplicate_is_ignored() -> None:
    """A result delivered twice (inbox redelivery) is applied once; the second returns False."""
    rec = _plan("a")
    _live(rec, "a", lane="lane-1")
    assert rec.apply(_result("a", "lane-1")) is True
    after = _copy(rec.tasks["a"])
    assert rec.apply(_result("a", "lane-1", "failed")) is False
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


# --- lose_shard ----------------------------------------------------------------------------------


def _fleet() -> PlanRecord:
    """Tasks spread over two shards and generations, in every interesting state."""
    rec = _plan("r1", "st2", "other", "done", "wait", ("dep", ["r1"]))
    _live(rec, "r1", lane="lane-1", shard="shard-0", gen=1)
    _live(rec, "st2", lane="lane-2", shard="shard-0", gen=2, status=S.STARTING)
    _live(rec, "other", lane="lane-3", shard="shard-1", gen=1)
    _live(rec, "done", lane="lane-4", shard="shard-0", gen=1, status=S.SUCCEEDED)
    return rec


def test_lose_shard_down_fails_every_live_task_on_it() -> None:
    """lose_shard(shard, None) fails every starting/running task on that shard, whatever its
    generation, with an error naming the loss and the shard; nothing else changes."""
    rec = _fleet()
    before = {k: _copy(v) for k, v in rec.tasks.items()}
    assert sorted(rec.lose_shard("shard-0", None)) == ["r1", "st2"]
    for task_id in ("r1", "st2"):
        t = rec.tasks[task_id]
        assert t.status is S.FAILED
        assert t.error is not None
        assert "worker process lost" in t.error
        assert "shard-0" in t.error
        assert t.lane is not None
        assert t.lane in t.error
    assert "generation 2" in (rec.tasks["st2"].error or "")
    for task_id in ("other", "done", "wait", "dep"):
        assert rec.tasks[task_id] == before[task_id]


def test_lose_shard_generation_spares_that_generation() -> None:
    """lose_shard(shard, gen) fails only the shard's live tasks of other generations: a restarted
    shard keeps lanes started on its new incarnation."""
    rec = _fleet()
    before = {k: _copy(v) for k, v in rec.tasks.items()}
    assert rec.lose_shard("shard-0", 2) == ["r1"]
    assert rec.tasks["r1"].status is S.FAILED
    assert "generation 1" in (rec.tasks["r1"].error or "")
    for task_id in ("st2", "other", "done", "wait", "dep"):
        assert rec.tasks[task_id] == before[task_id]


def test_lose_unknown_shard_changes_nothing() -> None:
    """Losing a shard no task runs on returns nothing and changes nothing."""
    rec = _fleet()
    before = {k: _copy(v) for k, v in rec.tasks.items()}
    assert rec.lose_shard("shard-9", None) == []
    assert rec.tasks == before


def test_lost_task_then_blocks_its_dependants() -> None:
    """A task failed by a lost shard blocks its dependants like any other failure."""
    rec = _fleet()
    rec.lose_shard("shard-0", None)
    assert rec.skip_blocked() == ["dep"]
    assert rec.tasks["dep"].error == "skipped: r1 did not succeed"


# --- done / ok / report --------------------------------------------------------------------------

DONE_TABLE = [
    ("all succeeded", {"a": S.SUCCEEDED, "b": S.SUCCEEDED}, True, True),
    ("one failed", {"a": S.SUCCEEDED, "b": S.FAILED}, True, False),
    ("one skipped", {"a": S.FAILED, "b": S.SKIPPED}, True, False),
    ("one cancelled", {"a": S.SUCCEEDED, "b": S.CANCELLED}, True, False),
    ("one running", {"a": S.SUCCEEDED, "b": S.RUNNING}, False, False),
    ("one starting", {"a": S.SUCCEEDED, "b": S.STARTING}, False, False),
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
    report = rec.report()
    assert report.done is done
    assert report.ok is ok


def test_report_shows_starting_as_running() -> None:
    """report() shows a starting task as "running" and every other status by its own name."""
    rec = _plan(*(s.value for s in TaskStatus))
    for status in TaskStatus:
        rec.tasks[status.value].status = status
    shown = {t.id: t.status for t in rec.report().tasks}
    assert shown[S.STARTING.value] == "running"
    for status in set(TaskStatus) - {S.STARTING}:
        assert shown[status.value] == status.value
    assert all(type(s) in (str, TaskStatus) for s in shown.values())


def test_report_fields_follow_records_in_file_order() -> None:
    """report() names the plan, lists tasks in file order and copies each record's fields, and
    survives a codec round trip."""
    rec = _plan("z", "a", ("m", ["z"]))
    _live(rec, "z", lane="lane-7", shard="shard-1", gen=3)
    assert rec.apply(_result("z", "lane-7", commit="c0ffee"))
    report = rec.report()
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
    )
    assert report.tasks[1] == f.TaskReport(id="a", status="pending")
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(report), type=f.PlanReport)
    assert back == report


# --- placement -----------------------------------------------------------------------------------


def _shard(name: str, *, load: int = 0, capacity: int = 4, up: bool = True, gen: int = 1):
    return ShardView(name=name, generation=gen, up=up, capacity=capacity, load=load)


PLACE_TABLE = [
    ("least loaded wins", [_shard("s0", load=3), _shard("s1", load=1), _shard("s2", load=2)], "s1"),
    ("least loaded beats name", [_shard("a", load=2), _shard("b", load=0)], "b"),
    (
        "tie broken by name",
        [_shard("s2", load=1), _shard("s1", load=1), _shard("s3", load=1)],
        "s1",
    ),
    ("full shard is not eligible", [_shard("s0", load=4), _shard("s1", load=3)], "s1"),
    ("over-full shard is not eligible", [_shard("s0", load=5), _shard("s1", load=3)], "s1"),
    ("down shard is not eligible", [_shard("s0", up=False), _shard("s1", load=3)], "s1"),
    ("zero capacity is not eligible", [_shard("s0", capacity=0), _shard("s1", load=2)], "s1"),
    ("single free shard", [_shard("only", load=3)], "only"),
    ("all full", [_shard("s0", load=4), _shard("s1", load=4)], None),
    ("all down", [_shard("s0", up=False), _shard("s1", up=False)], None),
    ("full or down", [_shard("s0", load=4), _shard("s1", up=False)], None),
    ("no shards", [], None),
]


@pytest.mark.parametrize(
    ("shards", "expected"),
    [row[1:] for row in PLACE_TABLE],
    ids=[row[0] for row in PLACE_TABLE],
)
def test_place(shards: list[ShardView], expected: str | None) -> None:
    """place() picks the least loaded up shard with a free slot, ties by name, else None."""
    chosen = place(shards)
    assert (chosen.name if chosen else None) == expected
    if chosen is not None:
        assert any(chosen is s for s in shards)


def test_place_is_independent_of_input_order() -> None:
    """The same shards in any order give the same answer."""
    shards = [_shard("s2", load=1), _shard("s0", load=1), _shard("s1", load=1, up=False)]
    assert {place(list(p)).name for p in (shards, shards[::-1], shards[1:] + shards[:1])} == {"s0"}

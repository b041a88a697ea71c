"""The plan runner's supervision of tasks (`coordinator.runner`): retries with backoff, the
budget carve, HITL pauses and their answers, sibling-group restarts; and tenant quotas
(`coordinator.quota`). Pure state, as tables and short stories."""

from __future__ import annotations

import msgspec
import pytest

from orchestra_sup.coordinator import budget
from orchestra_sup.coordinator.placement import AffinityTicket
from orchestra_sup.coordinator.quota import breach
from orchestra_sup.coordinator.report import plan_report
from orchestra_sup.coordinator.runner import AnswerError, PlanRecord, TaskStatus
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.childargs import Quota
from orchestra_sup.protocol.frames import FailureClass as C

S = TaskStatus
T0 = 1_000.0


def _plan(*tasks: f.TaskSpec, **plan: object) -> PlanRecord:
    spec = f.PlanSpec(name="demo", tasks=list(tasks), **plan)  # type: ignore[arg-type]
    return PlanRecord.new("p1", spec, submitted_at=T0)


def _task(tid: str = "a", **kw: object) -> f.TaskSpec:
    return f.TaskSpec(id=tid, run=f"echo {tid}", **kw)  # type: ignore[arg-type]


def _place(rec: PlanRecord, tid: str = "a", now: float = T0, shard: str = "shard-0") -> f.LaneStart:
    spec = next(t for t in rec.spec.tasks if t.id == tid)
    start = rec.place(spec, AffinityTicket(shard=shard, generation=1, boot="b"), now)
    rec.set_status(tid, S.RUNNING)
    return start


def _end(
    rec: PlanRecord,
    start: f.LaneStart,
    status: str = "failed",
    now: float = T0 + 1,
    failure: C | None = None,
    wall_s: float = 0.0,
) -> list[tuple[str, str]]:
    result = f.LaneResult(
        lane=start.lane,
        plan=rec.id,
        task=start.task.id,
        shard="shard-0",
        status=status,  # type: ignore[arg-type]
        exit_code=0 if status == "succeeded" else 1,
        duration_s=wall_s,
        output_tail="",
        sandbox=None,
        commit=None,
        error=None if status == "succeeded" else "exited with status 1",
        failure=failure,
        spent=f.Spend(wall_s=wall_s),
    )
    applied, cancel, _ = rec.apply(result, now, max_worker_loss=3)
    assert applied
    return cancel


def _answer(verdict: str = "approve", **kw: object) -> f.Answer:
    return f.Answer(verdict=verdict, responder="root", uid=0, at=T0, **kw)  # type: ignore[arg-type]


def _ask(lane: str, key: str = "q1", question: str = "ship?") -> f.HitlPause:
    """The pause lane `lane` of task "a" records when its program asks `question` (`key`)."""
    return f.HitlPause(
        lane=lane, plan="p1", task="a", shard="shard-0", key=key, question=question, asked_at=T0
    )


# --- retries --------------------------------------------------------------------------------------


def test_failing_twice_then_succeeding_under_retries_2_takes_three_attempts() -> None:
    rec = _plan(_task(retries=2, backoff_s=0.5))
    now = T0
    for expected_delay in (0.5, 1.0):
        start = _place(rec, now=now)
        _end(rec, start, now=now + 1)
        t = rec.tasks["a"]
        assert t.status is S.PENDING and t.retry_at == now + 1 + expected_delay
        assert rec.ready(now + 1) == []  # backing off
        assert [s.id for s in rec.ready(t.retry_at)] == ["a"]
        now = t.retry_at
    start = _place(rec, now=now)
    assert start.attempt == 3
    _end(rec, start, "succeeded", now=now + 1)
    t = rec.tasks["a"]
    assert (t.status, t.attempts, t.retries_used, t.failure) == (S.SUCCEEDED, 3, 2, None)
    assert sum("retry" in w for w in t.warnings) == 2


def test_retries_stop_at_the_cap() -> None:
    rec = _plan(_task(retries=1, backoff_s=0.1))
    _end(rec, _place(rec))
    _end(rec, _place(rec, now=T0 + 5), now=T0 + 6)
    t = rec.tasks["a"]
    assert (t.status, t.failure, t.attempts) == (S.FAILED, C.TOOL_FAILURE, 2)
    assert "retry cap reached (1 of 1" in (t.error or "")


def test_retries_stop_at_the_budget() -> None:
    """A task with 5 retries and wall_s = 1: each attempt's grant is what is left; once the
    whole second is spent, no retry passes the budget gate."""
    rec = _plan(_task(retries=5, backoff_s=0.1, budget=f.Budget(wall_s=1.0)))
    first = _place(rec)
    assert first.budget == f.Budget(wall_s=1.0)
    _end(rec, first, wall_s=0.6)
    second = _place(rec, now=T0 + 5)
    assert second.budget is not None and second.budget.wall_s == pytest.approx(0.4)
    _end(rec, second, failure=C.BUDGET_EXHAUSTION, wall_s=0.4, now=T0 + 6)
    t = rec.tasks["a"]
    assert (t.status, t.failure, t.attempts) == (S.FAILED, C.BUDGET_EXHAUSTION, 2)
    assert "budget cannot cover" in (t.error or "")
    assert rec.spent.wall_s == pytest.approx(1.0)


def test_a_lane_s_grant_is_carved_from_what_the_plan_has_left() -> None:
    """A plan can never outspend its own budget: live grants are held against it."""
    rec = _plan(
        _task("a", budget=f.Budget(wall_s=8.0)),
        _task("b", budget=f.Budget(wall_s=8.0, cpu_s=2.0)),
        budget=f.Budget(wall_s=10.0),
    )
    a = _place(rec, "a")
    b = _place(rec, "b")
    assert a.budget == f.Budget(wall_s=8.0)
    assert b.budget == f.Budget(wall_s=2.0, cpu_s=2.0)
    _end(rec, a, "succeeded", wall_s=1.0)  # 7 s of its grant come back
    assert rec.grant_for(rec.spec.tasks[0]) == f.Budget(wall_s=7.0)


def test_a_lost_lane_is_charged_the_time_that_passed_and_re_runs() -> None:
    rec = _plan(_task(budget=f.Budget(wall_s=100.0, cpu_s=4.0)))
    _place(rec, now=T0)
    rec.lose_shard("shard-0", None, max_worker_loss=3, now=T0 + 2)
    assert rec.tasks["a"].status is S.PAUSED  # a loss pauses the work (invariant 5)
    assert rec.spent == f.Spend(wall_s=2.0, cpu_s=2.0)
    assert rec.grant_for(rec.spec.tasks[0]) == f.Budget(wall_s=98.0, cpu_s=2.0)


def test_a_lane_taken_over_by_a_sibling_retry_holds_nothing_and_counts_nowhere() -> None:
    """The lane a one_for_all retry cancels ends its attempt at once, charged the time that
    passed: if its shard dies before its cancelled result comes, no phantom lane holds the
    plan's budget or the tenant's concurrency quota for ever. Its late result changes nothing."""
    rec = _plan(
        _task(retries=1, backoff_s=0.1),
        _task("b", retries=1, budget=f.Budget(wall_s=50.0)),
        strategy="one_for_all",
        tenant="acme",
    )
    a = _place(rec, "a")
    b = _place(rec, "b")
    assert _end(rec, a) == [("shard-0", b.lane)]  # b is taken over by a's retry (at T0 + 1)
    assert rec.held() == f.Spend()
    assert breach(Quota(concurrency=1), "acme", [rec], T0 + 2) is None
    spent = rec.spent
    assert rec.tasks["b"].spent == f.Spend(wall_s=1.0, cpu_s=1.0)
    rec.lose_shard("shard-0", None, max_worker_loss=3, now=T0 + 9)
    late = f.LaneResult(
        lane=b.lane,
        plan=rec.id,
        task="b",
        shard="shard-0",
        status="cancelled",
        exit_code=None,
        duration_s=0.3,
        output_tail="",
        sandbox=None,
        commit=None,
        error="cancelled by request",
        spent=f.Spend(wall_s=0.3),
    )
    assert rec.apply(late, T0 + 10) == (False, [], False)
    assert rec.spent == spent and rec.tasks["b"].status is S.PENDING


# --- sibling groups -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "rerun"),
    [("one_for_one", set()), ("one_for_all", {"a", "c"}), ("rest_for_one", {"c"})],
)
def test_a_retry_re_runs_the_sibling_group(strategy: str, rerun: set[str]) -> None:
    rec = _plan(_task("a"), _task("b", retries=1), _task("c"), strategy=strategy)
    _end(rec, _place(rec, "a"), "succeeded")
    c = _place(rec, "c")
    cancel = _end(rec, _place(rec, "b"))
    assert rec.tasks["b"].status is S.PENDING
    assert {t for t in ("a", "c") if rec.tasks[t].status is S.PENDING} == rerun
    assert cancel == ([("shard-0", c.lane)] if "c" in rerun else [])


# --- HITL -----------------------------------------------------------------------------------------


def test_approve_true_waits_for_a_human_and_runs_once_approved() -> None:
    rec = _plan(_task(approve=True))
    assert rec.ready(T0) == []
    assert rec.hold_for_approval(T0) == ["a"]
    t = rec.tasks["a"]
    assert t.status is S.AWAITING_APPROVAL and t.pending is not None
    assert rec.waiting_on("p1-a-1") == "a"
    assert plan_report(rec).tasks[0].status == "awaiting_approval"
    rec.record_answer("a", _answer(grant=f.Budget(wall_s=5.0)))
    assert rec.unsettled() == ["a"]  # recorded, not acted on yet
    effect = rec.act_on_answer("a", T0)
    assert "approved" in effect.outcome and effect.answer is None
    assert [s.id for s in rec.ready(T0)] == ["a"]
    assert rec.hold_for_approval(T0) == []  # approved once: never asked again
    assert _place(rec).lane == "p1-a-1"


def test_a_rejection_fails_the_task_with_the_reason_in_its_error() -> None:
    rec = _plan(_task(approve=True))
    rec.hold_for_approval(T0)
    rec.record_answer("a", _answer("reject", text="not on a Friday"))
    rec.act_on_answer("a", T0)
    t = rec.tasks["a"]
    assert (t.status, t.failure) == (S.FAILED, C.PREFLIGHT_ESCALATION)
    assert t.error == "rejected by root: not on a Friday"
    assert t.attempts == 0  # nothing ran


def test_a_redirect_runs_with_its_text_as_feedback() -> None:
    rec = _plan(_task(approve=True))
    rec.hold_for_approval(T0)
    rec.record_answer("a", _answer("redirect", text="use the staging database"))
    rec.act_on_answer("a", T0)
    assert _place(rec).feedback == "use the staging database"


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (_answer("reject"), "needs a text"),
        (_answer("redirect", text="  "), "needs a text"),
        (_answer("reject", text="x", retries=1), "only an approval grants"),
        (_answer("accept_partial", grant=f.Budget(wall_s=1.0)), "only an approval grants"),
    ],
)
def test_an_answer_that_does_not_fit_is_refused(answer: f.Answer, why: str) -> None:
    rec = _plan(_task(approve=True))
    rec.hold_for_approval(T0)
    with pytest.raises(AnswerError, match=why):
        rec.record_answer("a", answer)
    assert rec.tasks["a"].answers == {}


def test_a_failure_under_on_failure_pause_waits_for_review() -> None:
    rec = _plan(_task(on_failure="pause", retries=1))
    start = _place(rec)
    _end(rec, start)
    t = rec.tasks["a"]
    assert t.status is S.AWAITING_APPROVAL and t.pending is not None
    assert t.pending.kind == "review" and rec.waiting_on(start.lane) == "a"
    rec.record_answer("a", _answer("reject", text="also check the config"))
    effect = rec.act_on_answer("a", T0 + 2)
    assert effect.outcome == "task a retried"
    retry = _place(rec, now=T0 + 3)
    assert retry.feedback == "also check the config" and retry.attempt == 2
    _end(rec, retry, now=T0 + 4)  # the cap is used up: an approval must grant retries
    with pytest.raises(AnswerError, match="used 1 of 1 retries"):
        rec.record_answer("a", _answer())
    rec.record_answer("a", _answer("accept_partial"))
    rec.act_on_answer("a", T0 + 5)
    assert rec.tasks["a"].status is S.SUCCEEDED and rec.ok


def test_a_question_is_answered_to_the_live_lane() -> None:
    rec = _plan(_task(program="m:P"))
    start = _place(rec)
    pause = _ask(start.lane)
    assert rec.pause_for_question(pause)
    assert plan_report(rec).tasks[0].status == "awaiting_approval"
    assert rec.tasks["a"].status is S.RUNNING  # its lane is live and holds a slot
    rec.record_answer("a", _answer())
    effect = rec.act_on_answer("a", T0)
    assert effect.shard == "shard-0"
    assert effect.answer == f.HitlAnswer(lane=start.lane, key="q1", answer=_answer())
    assert not rec.pause_for_question(pause)  # answered: a re-sent pause changes nothing


def test_a_question_survives_the_loss_of_its_shard_and_the_re_run_gets_the_answer() -> None:
    rec = _plan(_task(program="m:P"))
    start = _place(rec)
    rec.pause_for_question(_ask(start.lane))
    rec.lose_shard("shard-0", None, max_worker_loss=1, now=T0 + 1)
    t = rec.tasks["a"]
    assert (t.status, t.worker_losses) == (S.AWAITING_APPROVAL, 0)  # waiting is not a loss
    assert rec.waiting_on(start.lane) == "a"
    rec.record_answer("a", _answer())
    assert rec.act_on_answer("a", T0 + 2).answer is None
    again = _place(rec, now=T0 + 3)
    assert again.answers == {"q1": _answer()}


# --- quotas ---------------------------------------------------------------------------------------


def _tenant_plan(n_live: int, n_ended: int, wall: float) -> PlanRecord:
    tasks = [_task(f"t{i}") for i in range(n_live + n_ended)]
    rec = _plan(*tasks, tenant="acme")
    for i in range(n_live + n_ended):
        start = _place(rec, f"t{i}", now=T0)
        if i >= n_live:
            _end(rec, start, "succeeded", now=T0 + 10, wall_s=wall)
    return rec


@pytest.mark.parametrize(
    ("quota", "why"),
    [
        (Quota(concurrency=2), "has 2 live lanes (quota concurrency = 2)"),
        (Quota(rate=3), "started 3 lanes in the last 3600 s (quota rate = 3)"),
        (Quota(wall_s=5.0), "spent 6 wall seconds"),
        (Quota(concurrency=3, rate=4, wall_s=7.0), None),
        (Quota(rate=3, window_s=50.0), None),  # the starts are older than the window
    ],
)
def test_quota_breach(quota: Quota, why: str | None) -> None:
    plans = [_tenant_plan(n_live=2, n_ended=1, wall=6.0), _plan(_task(), tenant="other")]
    got = breach(quota, "acme", plans, now=T0 + 60)
    assert got == why if why is None else why in (got or "")


def test_a_quota_breach_fails_the_task_without_an_attempt() -> None:
    rec = _plan(_task())
    rec.fail("a", C.QUOTA_BREACH, "quota breach: x", T0)
    t = rec.tasks["a"]
    assert (t.status, t.failure, t.attempts, t.history) == (S.FAILED, C.QUOTA_BREACH, 0, [])


def test_tasks_without_a_budget_of_their_own_share_the_plan_s() -> None:
    rec = _plan(_task("a"), _task("b"), _task("c"), budget=f.Budget(wall_s=9.0))
    a = _place(rec, "a")
    assert a.budget == f.Budget(wall_s=3.0)  # a third: three tasks still to run
    b = _place(rec, "b")
    assert b.budget == f.Budget(wall_s=3.0)  # (9 - 3 held) / 2
    _end(rec, a, "succeeded", wall_s=1.0)
    _end(rec, b, "succeeded", wall_s=1.0)
    assert _place(rec, "c").budget == f.Budget(wall_s=7.0)  # the last one gets what is left


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (_answer(grant=f.Budget(wall_s=float("nan"))), "must be positive"),
        (_answer(grant=f.Budget(cpu_s=-1e9)), "must be positive"),
        (_answer(grant=f.Budget(wall_s=float("inf"))), "must be positive"),
        (_answer(grant=f.Budget(output_bytes=10**19)), "at most"),
        (_answer(grant=f.Budget()), "must name"),
        (_answer(retries=-5), "retries must be from 0 to 100"),
        (_answer(retries=2**63 - 1), "retries must be from 0 to 100"),
        (_answer("reject", text="x" * (64 * 1024 + 1)), "at most 65536 bytes"),
        (_answer("accept_partial"), "nothing ran yet"),
    ],
    ids=[
        "nan",
        "negative",
        "inf",
        "huge bytes",
        "empty",
        "negative retries",
        "huge retries",
        "long text",
        "accept-partial before it ran",
    ],
)
def test_an_answer_from_outside_is_checked_at_the_coordinator(answer: f.Answer, why: str) -> None:
    """Whatever the CLI checked, a raw frame can carry anything: a NaN grant would poison the
    plan's budget, an overflowing one make its record unencodable."""
    rec = _plan(_task(approve=True))
    rec.hold_for_approval(T0)
    with pytest.raises(AnswerError, match=why):
        rec.record_answer("a", answer)
    assert rec.tasks["a"].answers == {}


def test_the_first_of_two_answers_to_one_pause_stands() -> None:
    rec = _plan(_task(approve=True))
    rec.hold_for_approval(T0)
    rec.record_answer("a", _answer("reject", text="no"))
    with pytest.raises(AnswerError, match=r"already answered \(reject by root\)"):
        rec.record_answer("a", _answer())
    rec.act_on_answer("a", T0)
    assert rec.tasks["a"].status is S.FAILED


def test_grants_add_up_but_stay_encodable() -> None:
    rec = _plan(_task(approve=True, budget=f.Budget(output_bytes=10)), budget=f.Budget(wall_s=1.0))
    big = f.Budget(output_bytes=2**53, wall_s=1e9)
    for _ in range(3):
        rec.tasks["a"].granted = budget.plus(rec.tasks["a"].granted, big)
    assert rec.tasks["a"].granted == f.Budget(output_bytes=2**53, wall_s=1e9)
    msgspec.msgpack.encode(rec)


def test_a_note_is_kept_once_however_often_the_inbox_is_applied() -> None:
    """Every coordinator start applies its whole inbox again: a note must not pile up."""
    rec = _plan(_task(program="m:P"))
    start = _place(rec)
    note = f.LaneNote(lane=start.lane, plan="p1", task="a", text="halfway", at=T0)
    assert rec.note(note, f"note:{start.lane}:1")
    assert not rec.note(note, f"note:{start.lane}:1")
    assert rec.note(note, f"note:{start.lane}:2")  # said twice is kept twice
    assert rec.tasks["a"].notes == [f"{start.lane}: halfway"] * 2


def test_a_retried_attempt_asks_its_questions_afresh() -> None:
    """An answer is handed to the next lane only when the lane that asked is gone before it
    could go on; a failure that retries the task (a rejection the program turned into a quality
    miss) clears it, so the new attempt's question waits for a human again."""
    rec = _plan(_task(program="m:P", retries=1, backoff_s=0.1))
    first = _place(rec)

    def ask(lane: str) -> f.HitlPause:
        return _ask(lane, key="publish")

    assert rec.pause_for_question(ask(first.lane))
    rec.record_answer("a", _answer("reject", text="list the authors"))
    assert rec.act_on_answer("a", T0).answer is not None
    _end(rec, first, failure=C.QUALITY_MISS)
    second = _place(rec, now=T0 + 5)
    assert second.answers == {}
    assert rec.pause_for_question(ask(second.lane))
    assert plan_report(rec).tasks[0].status == "awaiting_approval"
    assert [k.split(":")[-1] for k in rec.tasks["a"].answers] == ["publish"]


def test_a_task_s_own_tenant_counts_against_that_tenant_s_quota() -> None:
    rec = _plan(_task("mine", tenant="acme"), _task("theirs"), tenant="other")
    _place(rec, "mine")
    _place(rec, "theirs")
    assert breach(Quota(concurrency=1), "acme", [rec], T0) is not None
    assert breach(Quota(concurrency=2), "acme", [rec], T0) is None  # only "mine" is acme's
    assert breach(Quota(concurrency=1), "other", [rec], T0) is not None


def test_rest_for_one_also_re_runs_what_needs_a_re_run_task() -> None:
    """b (first in file order) needs a (after the failing x): when x's retry re-runs a, b
    cannot stand on a's first output; it runs again too."""
    rec = _plan(
        _task("b", needs=["a"]),
        _task("x", retries=1),
        _task("a"),
        strategy="rest_for_one",
    )
    _end(rec, _place(rec, "a"), "succeeded")
    b = _place(rec, "b")
    cancel = _end(rec, _place(rec, "x"))
    assert {t: rec.tasks[t].status for t in ("a", "b", "x")} == {
        "a": S.PENDING,
        "b": S.PENDING,
        "x": S.PENDING,
    }
    assert cancel == [("shard-0", b.lane)]


def test_a_second_question_of_a_lane_does_not_replace_the_first() -> None:
    """A lane asks one question at a time; a pause for another key (forged, or a program
    that got around the rule) must not take the place of the one an operator is answering."""
    rec = _plan(_task(program="m:P"))
    start = _place(rec)

    def ask(key: str) -> f.HitlPause:
        return _ask(start.lane, key=key, question=key)

    assert rec.pause_for_question(ask("first"))
    assert not rec.pause_for_question(ask("zz"))
    assert rec.pause_for_question(ask("first"))  # the same pause again (a re-send) is harmless
    assert rec.tasks["a"].pending is not None and rec.tasks["a"].pending.asked == "first"


def test_a_task_keeps_its_newest_notes_short() -> None:
    rec = _plan(_task(program="m:P"))
    start = _place(rec)
    for n in range(1, 31):
        note = f.LaneNote(lane=start.lane, plan="p1", task="a", text=f"{n} " + "x" * 4000, at=T0)
        rec.note(note, f"note:{start.lane}:{n}")
    notes = rec.tasks["a"].notes
    assert len(notes) == 20 and notes[0].startswith(f"{start.lane}: 11 ")
    assert all(len(n) <= len(start.lane) + 2 + 500 for n in notes)

"""The supervision of lanes as tables: strategy x failure class -> action, and the gates that
bound every retry (`coordinator.strategy`)."""

from __future__ import annotations

import pytest

from orchestra_sup.coordinator.strategy import (
    MAX_BACKOFF_S,
    Action,
    Decision,
    Escalate,
    Gates,
    OneForAll,
    OneForOne,
    RestForOne,
    Scope,
    SelectiveReplan,
    backoff,
    decide,
    task_strategy,
)
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.frames import FailureClass as C

A = Action
OPEN = Gates(retries_used=0, retry_cap=3, losses=1, loss_cap=3, budget_left=True)

REPLAN = SelectiveReplan(
    actions={
        C.TIMEOUT: A.RETRY,
        C.QUALITY_MISS: A.RETRY_WITH_FEEDBACK,
        C.TOOL_FAILURE: A.REACQUIRE,
        C.PREFLIGHT_ESCALATION: A.PAUSE,
        C.WORKER_PROCESS_LOSS: A.ESCALATE,
    },
    otherwise=Escalate(),
)

STRATEGIES = {
    "escalate": Escalate(),
    "one_for_one(retry)": OneForOne(A.RETRY),
    "one_for_one(pause)": OneForOne(A.PAUSE),
    "one_for_all(retry)": OneForAll(A.RETRY),
    "rest_for_one(retry)": RestForOne(A.RETRY),
    "selective_replan": REPLAN,
}

# Expected action with every gate open, per strategy, in FailureClass order:
# quality_miss, tool_failure, budget_exhaustion, timeout, preflight_escalation,
# worker_process_loss, quota_breach.
TABLE: dict[str, list[Action]] = {
    "escalate": [
        A.ESCALATE,
        A.ESCALATE,
        A.ESCALATE,
        A.ESCALATE,
        A.ESCALATE,
        A.REACQUIRE,
        A.ESCALATE,
    ],
    "one_for_one(retry)": [A.RETRY, A.RETRY, A.RETRY, A.RETRY, A.RETRY, A.REACQUIRE, A.RETRY],
    "one_for_one(pause)": [A.PAUSE, A.PAUSE, A.PAUSE, A.PAUSE, A.PAUSE, A.REACQUIRE, A.PAUSE],
    "one_for_all(retry)": [A.RETRY, A.RETRY, A.RETRY, A.RETRY, A.RETRY, A.REACQUIRE, A.RETRY],
    "rest_for_one(retry)": [A.RETRY, A.RETRY, A.RETRY, A.RETRY, A.RETRY, A.REACQUIRE, A.RETRY],
    "selective_replan": [
        A.RETRY_WITH_FEEDBACK,
        A.REACQUIRE,
        A.ESCALATE,
        A.RETRY,
        A.PAUSE,
        A.ESCALATE,
        A.ESCALATE,
    ],
}


@pytest.mark.parametrize(
    ("name", "failure", "expected"),
    [(name, failure, TABLE[name][i]) for name in STRATEGIES for i, failure in enumerate(C)],
    ids=lambda v: str(v),
)
def test_strategy_by_failure_class_with_the_gates_open(
    name: str, failure: C, expected: Action
) -> None:
    assert decide(STRATEGIES[name], failure, OPEN).action is expected


def test_the_table_covers_every_failure_class() -> None:
    assert all(len(row) == len(C) for row in TABLE.values())


@pytest.mark.parametrize(
    ("strategy", "scope"),
    [
        (OneForOne(A.RETRY), Scope.ONE),
        (OneForAll(A.RETRY), Scope.ALL),
        (RestForOne(A.RETRY), Scope.REST),
        (SelectiveReplan(actions={C.TIMEOUT: A.RETRY}, otherwise=OneForAll(A.PAUSE)), Scope.ALL),
    ],
    ids=["one_for_one", "one_for_all", "rest_for_one", "replan over one_for_all"],
)
def test_a_retry_re_runs_the_strategy_s_scope(strategy: object, scope: Scope) -> None:
    assert decide(strategy, C.TIMEOUT, OPEN).scope is scope  # type: ignore[arg-type]


@pytest.mark.parametrize("action", [A.RETRY, A.RETRY_WITH_FEEDBACK, A.REACQUIRE])
@pytest.mark.parametrize(
    ("gates", "why"),
    [
        (Gates(retries_used=3, retry_cap=3, budget_left=True), "retry cap reached (3 of 3"),
        (Gates(retries_used=0, retry_cap=0, budget_left=True), "retry cap reached (0 of 0"),
        (Gates(retries_used=0, retry_cap=5, budget_left=False), "budget cannot cover"),
    ],
    ids=["cap reached", "no retries", "budget spent"],
)
def test_every_retry_degrades_to_escalate_at_a_closed_gate(
    action: Action, gates: Gates, why: str
) -> None:
    """Invariant 10: every retry passes the cap and budget gates; nothing spins."""
    decision = decide(SelectiveReplan(actions={C.TOOL_FAILURE: action}), C.TOOL_FAILURE, gates)
    assert decision.action is A.ESCALATE
    assert why in decision.why


def test_retries_stop_at_the_cap_however_often_the_task_fails() -> None:
    """Feeding each decision's retry back in: exactly `retry_cap` retries, then escalate."""
    used, actions = 0, []
    while True:
        d = decide(OneForOne(A.RETRY), C.TOOL_FAILURE, Gates(retries_used=used, retry_cap=2))
        actions.append(d.action)
        if d.action is not A.RETRY:
            break
        used += 1
    assert actions == [A.RETRY, A.RETRY, A.ESCALATE]


def test_a_lost_worker_counts_against_max_worker_loss_not_the_retry_cap() -> None:
    no_retries = Gates(retries_used=0, retry_cap=0, losses=1, loss_cap=2)
    assert decide(Escalate(), C.WORKER_PROCESS_LOSS, no_retries).action is A.REACQUIRE
    at_cap = Gates(retries_used=0, retry_cap=9, losses=2, loss_cap=2)
    decision = decide(OneForOne(A.RETRY), C.WORKER_PROCESS_LOSS, at_cap)
    assert decision.action is A.ESCALATE and "max_worker_loss = 2" in decision.why


def test_a_pause_passes_no_gate() -> None:
    """A human decides; the budget or the cap being spent does not skip asking."""
    closed = Gates(retries_used=9, retry_cap=0, budget_left=False)
    assert decide(OneForOne(A.PAUSE), C.QUALITY_MISS, closed) == Decision(action=A.PAUSE)


def test_backoff_doubles_from_the_first_delay_and_is_capped() -> None:
    assert [backoff(0.5, n) for n in range(4)] == [0.5, 1.0, 2.0, 4.0]
    assert backoff(1.0, 1000) == MAX_BACKOFF_S
    assert (
        decide(OneForOne(A.RETRY), C.TIMEOUT, Gates(retries_used=2, retry_cap=5), 0.25).delay_s
        == 1.0
    )


def _task(**kw: object) -> f.TaskSpec:
    return f.TaskSpec(id="t", run="true", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("task", "plan", "expected"),
    [
        (_task(), {}, Escalate()),
        (_task(retries=2), {}, OneForOne(A.RETRY)),
        (_task(retries=2, on_failure="escalate"), {}, Escalate()),
        (_task(on_failure="pause"), {}, OneForOne(A.PAUSE)),
        (_task(retries=1), {"strategy": "one_for_all"}, OneForAll(A.RETRY)),
        (_task(retries=1), {"strategy": "rest_for_one"}, RestForOne(A.RETRY)),
        (
            _task(),
            {"replan": {"timeout": "retry"}},
            SelectiveReplan(actions={C.TIMEOUT: A.RETRY}, otherwise=Escalate()),
        ),
    ],
    ids=[
        "default escalate",
        "retries mean retry",
        "explicit escalate",
        "pause",
        "one_for_all",
        "rest_for_one",
        "replan table",
    ],
)
def test_task_strategy_from_plan_keys(task: f.TaskSpec, plan: dict, expected: object) -> None:
    spec = f.PlanSpec(name="p", tasks=[task], **plan)
    assert task_strategy(spec, task) == expected

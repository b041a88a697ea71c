"""Supervision of lanes: typed failures resolved by named strategies into bounded actions.

ARCHITECTURE.md §7 and seeds/003 ("Supervision: typed failures, named strategies"): a failure
carries a class (`frames.FailureClass`); the task's strategy turns it into one action, and every
action that runs the task again first passes the universal gates, so a failure can never spin.
Pure logic, no IO and no clock: `decide` is tested as a strategy x failure-class table.

Strategies, named after Erlang/OTP's:

- `Escalate` (the default, a task with `retries = 0`): every failure climbs to the plan, which
  records it (the task fails, with its failure class and a durable final record).
- `OneForOne(action)`: the failed task alone gets `action`.
- `OneForAll(action)`, `RestForOne(action)`: the sibling-group strategies. A retry re-runs the
  failed task and every other task of its plan (`one_for_all`), or it and every task after it
  in file order (`rest_for_one`); their live lanes are cancelled and their results dropped.
- `SelectiveReplan(actions, otherwise)`: an action per failure class (a plan's `replan` table);
  a class it does not name is left to `otherwise`.

Actions (`Action`): escalate; retry with exponential backoff; retry with revision feedback (the
next attempt sees why the last one failed); re-acquire a fresh worker (re-place at once on a
shard other than the one that failed); pause for a human (`ctl approve | reject | redirect |
accept-partial`).

The gates (seeds/003: "it degrades to escalation if the budget can't cover a retry or the retry
cap is hit"): a retry, a retry with feedback and a re-acquire degrade to escalate when the retry
cap is reached (`Gates.retries_used >= Gates.retry_cap`) or the task's or its plan's budget has
nothing left in a dimension it limits (`Gates.budget_left`). Losing the worker process is an
infrastructure failure (ARCHITECTURE.md §11 invariant 5): every strategy re-acquires for it unless
a `replan` table says otherwise, and it counts against `[lanes] max_worker_loss`, not the retry
cap. A pause is not a retry and passes no gate: the human decides, and may grant more budget or
retries with the approval.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.frames import FailureClass

MAX_BACKOFF_S = 300.0
"""The longest wait before a retry (seconds), however many came before it."""


class Action(enum.StrEnum):
    """What a strategy does with one failure."""

    ESCALATE = "escalate"
    RETRY = "retry"
    RETRY_WITH_FEEDBACK = "retry_with_feedback"
    REACQUIRE = "reacquire"
    PAUSE = "pause"


RETRYING = frozenset({Action.RETRY, Action.RETRY_WITH_FEEDBACK, Action.REACQUIRE})
"""The actions that run the task again, so pass the gates first."""


class Scope(enum.StrEnum):
    """Which tasks of the plan a retry re-runs."""

    ONE = "one"
    ALL = "all"
    REST = "rest"


@dataclass(frozen=True)
class OneForOne:
    """The failed task alone gets `action` (a lost worker is re-acquired whatever it is)."""

    action: Action
    name = "one_for_one"
    scope = Scope.ONE

    def choose(self, failure: FailureClass) -> Action:
        if failure is FailureClass.WORKER_PROCESS_LOSS:
            return Action.REACQUIRE
        return self.action


@dataclass(frozen=True)
class Escalate(OneForOne):
    """Every failure climbs to the plan (the default)."""

    action: Action = Action.ESCALATE
    name = "escalate"


@dataclass(frozen=True)
class OneForAll(OneForOne):
    """`action`; a retry re-runs every task of the plan."""

    name = "one_for_all"
    scope = Scope.ALL


@dataclass(frozen=True)
class RestForOne(OneForOne):
    """`action`; a retry re-runs the failed task and every task after it in file order."""

    name = "rest_for_one"
    scope = Scope.REST


@dataclass(frozen=True)
class SelectiveReplan:
    """An action per failure class; the others are `otherwise`'s (its scope is the scope)."""

    actions: Mapping[FailureClass, Action]
    otherwise: Strategy = field(default_factory=Escalate)
    name = "selective_replan"

    @property
    def scope(self) -> Scope:
        return self.otherwise.scope

    def choose(self, failure: FailureClass) -> Action:
        action = self.actions.get(failure)
        return action if action is not None else self.otherwise.choose(failure)


Strategy = Escalate | OneForOne | OneForAll | RestForOne | SelectiveReplan

_SIBLINGS: dict[str, type[OneForOne]] = {
    "one_for_one": OneForOne,
    "one_for_all": OneForAll,
    "rest_for_one": RestForOne,
}


def task_strategy(plan: f.PlanSpec, task: f.TaskSpec) -> Strategy:
    """The strategy that supervises `task`: its `on_failure` ("escalate" -> `Escalate`; "retry"
    or "pause" -> the plan's sibling `strategy` with that action; unset -> "retry" when it has
    `retries`, else "escalate"), under a `SelectiveReplan` when the plan has a `replan` table.
    `plan.replan` must be valid (`coordinator.plan` checks it)."""
    on_failure = task.on_failure or ("retry" if task.retries > 0 else "escalate")
    base: Strategy = Escalate()
    if on_failure != "escalate":
        base = _SIBLINGS[plan.strategy](Action(on_failure))
    if plan.replan:
        actions = {FailureClass(k): Action(v) for k, v in plan.replan.items()}
        return SelectiveReplan(actions=actions, otherwise=base)
    return base


@dataclass(frozen=True)
class Gates:
    """What the universal gates look at, for one failure of one task.

    - `retries_used`: retries the task has had (attempts that were not a re-acquire after a
      lost worker), `retry_cap`: how many it may have (`retries` plus what humans granted);
    - `losses`: its worker processes lost, this one included; `loss_cap`: `[lanes]
      max_worker_loss`;
    - `budget_left`: the task's and its plan's budgets have something left in every dimension
      they limit (`coordinator.budget.covers`).
    """

    retries_used: int
    retry_cap: int
    losses: int = 0
    loss_cap: int = 1
    budget_left: bool = True


@dataclass(frozen=True)
class Decision:
    """What to do: `action`, over `scope`, after `delay_s` seconds; `why` says why a retry was
    degraded to escalate ("" when it was not)."""

    action: Action
    scope: Scope = Scope.ONE
    delay_s: float = 0.0
    why: str = ""


def backoff(first_s: float, retries_used: int) -> float:
    """Seconds before the retry that follows `retries_used` earlier ones: `first_s` doubled
    for each, at most `MAX_BACKOFF_S`."""
    return min(MAX_BACKOFF_S, first_s * 2.0 ** min(retries_used, 64))


def decide(
    strategy: Strategy, failure: FailureClass, gates: Gates, backoff_s: float = 1.0
) -> Decision:
    """Resolve `failure` under `strategy` into a bounded `Decision` (see the module docstring).
    `backoff_s` is the task's first retry delay in seconds."""
    action = strategy.choose(failure)
    if action not in RETRYING:
        return Decision(action=action)
    loss = failure is FailureClass.WORKER_PROCESS_LOSS and action is Action.REACQUIRE
    if loss and gates.losses >= gates.loss_cap:
        return Decision(
            action=Action.ESCALATE,
            why=f"worker process lost {gates.losses} times (max_worker_loss = {gates.loss_cap})",
        )
    if not loss and gates.retries_used >= gates.retry_cap:
        return Decision(
            action=Action.ESCALATE,
            why=f"retry cap reached ({gates.retries_used} of {gates.retry_cap} retries used)",
        )
    if not gates.budget_left:
        return Decision(action=Action.ESCALATE, why="the budget cannot cover another attempt")
    if action is Action.REACQUIRE:
        return Decision(action=action, scope=Scope.ONE)
    return Decision(
        action=action,
        scope=strategy.scope,
        delay_s=backoff(backoff_s, gates.retries_used),
    )

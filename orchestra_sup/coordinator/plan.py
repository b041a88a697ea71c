"""Plan files: parse and validate a TOML plan into a `PlanSpec`, refusing a bad one before it runs.

A plan looks like this::

    name = "selfcheck"            # required, non-empty string
    tenant = "acme"               # optional: whom it runs for; only shards serving it take it
                                  # (and the [quotas.acme] it counts against)
    budget = { wall_s = 600, cpu_s = 300, output_bytes = 10_000_000 }
                                  # optional: what all its lanes together may spend
    strategy = "one_for_one"      # optional: which tasks a retry re-runs: "one_for_one" (the
                                  # failed one), "one_for_all" (all), "rest_for_one" (it and
                                  # every task after it in file order)
    replan = { timeout = "retry", quality_miss = "retry_with_feedback" }
                                  # optional: failure class -> action, for every task
                                  # (coordinator/strategy.py: SelectiveReplan)
    coordinator = "bisect"        # optional: what decides (coordinator/context.py): "dag" (the
                                  # default: the [[task]] graph), another built-in ("fanout",
                                  # "refine", "bisect": coordinator/programs/), or
                                  # "module:Class", listed in the tree's [coordinator] programs
    [args]                        # optional: handed to a coordinator program's constructor;
    good = "v1.0"                 # a program's plan has [args] and no [[task]]

    [[task]]
    id = "lint"                   # required, unique, matches [A-Za-z0-9][A-Za-z0-9_.-]{0,63}
    run = "ruff check ."          # the shell command (required for shell); a program's argument
    needs = ["other-id"]          # optional: ids of tasks that must succeed first
    timeout_s = 60                # optional: positive wall seconds (int or float)
    commit = false                # optional: commit the task's sandbox changes
    requires = ["gpu"]            # optional: capabilities its shard must offer
    program = "shell"             # optional: what the lane runs (shards/program.py)
    retries = 2                   # optional: retries after the first attempt (0..100)
    backoff_s = 1.0               # optional: seconds before the first retry, doubling after
                                  # (at most 300 s, as is every later wait)
    on_failure = "retry"          # optional: "escalate" | "retry" | "pause" (default "retry"
                                  # when retries > 0, else "escalate")
    approve = true                # optional: a human approves before it runs (ctl approve)
    budget = { wall_s = 60 }      # optional: what all its attempts together may spend
    tenant = "beta"               # optional: whom this task runs for, instead of the plan's
    rev = "HEAD~3"                # optional: the workspace revision its sandbox is made at (a
                                  # sha, a short sha, a branch; at most 256 characters, no
                                  # whitespace); default: the head when its lane starts
    feedback = "use tabs"         # optional: revision feedback for its first attempt
                                  # ($ORCHESTRA_FEEDBACK; at most 64 KiB of UTF-8)

Every problem is reported as one `PlanError` whose message names the task (by id, or by position
as "#N" when it has no usable id) and the key or value at fault: invalid TOML (with tomllib's line
and column), unknown keys, missing or empty required keys, values of the wrong type, a duplicate
id, a dependency on a missing task or on the task itself, and a dependency cycle (named in order,
"dependency cycle a -> b -> a"), and a plan of more than `MAX_TASKS` tasks. Tasks keep their file
order in `PlanSpec.tasks`. Checking costs O(tasks + needs): a plan at the limit is checked in
well under a second.
"""

from __future__ import annotations

import heapq
import tomllib
import unicodedata
from pathlib import Path
from typing import Any

import msgspec

from orchestra_sup.coordinator.plantask import budget_table, describe, parse_task
from orchestra_sup.coordinator.strategy import Action
from orchestra_sup.errors import PlanError, did_you_mean
from orchestra_sup.protocol.frames import FailureClass, PlanSpec, TaskSpec
from orchestra_sup.protocol.patterns import (
    BUILTIN_COORDINATORS,
    COORDINATOR_PATTERN,
    DAG,
    NAME_PATTERN,
)

__all__ = ["load_plan", "parse_plan", "plan_from_mapping", "topological_order", "validate_plan"]

_TOP_KEYS = frozenset(
    {"name", "task", "tenant", "budget", "strategy", "replan", "coordinator", "args"}
)
MAX_TASKS = 20_000
"""The most tasks a plan may hold. The coordinator keeps every plan in memory and runs each in
time linear in its tasks and needs; `bench plan` settles 10,000-task chains, fan-outs and fan-ins
with the coordinator's loop-lag p99 under 50 ms, and this leaves twice that room. A bigger plan
is refused before anything of it is converted or stored (README: "Plans")."""
STRATEGIES = ("one_for_one", "one_for_all", "rest_for_one")


def load_plan(path: Path) -> PlanSpec:
    """Read and parse the plan file at `path`.

    Raises:
        PlanError: the file is missing, unreadable or not UTF-8 (the message names the path), or
            the plan is invalid (see `parse_plan`).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError(f"cannot read plan file: {exc.strerror or exc}", source=str(path)) from exc
    except UnicodeDecodeError as exc:
        raise PlanError(
            f"plan file is not UTF-8 text (byte {exc.start})", source=str(path)
        ) from exc
    return parse_plan(text, source=str(path))


def parse_plan(text: str, *, source: str = "<plan>") -> PlanSpec:
    """Parse and validate plan TOML `text`; `source` names it in error messages (a path).

    Returns the `PlanSpec` with tasks in file order; `timeout_s` is converted to float seconds.

    Raises:
        PlanError: the first problem found, one line naming the task and the key or value.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"invalid TOML: {exc}", source=source) from exc
    except RecursionError:  # tomllib recurses per nesting level: some 500 arrays deep
        raise PlanError("invalid TOML: values nested too deeply", source=source) from None
    return plan_from_mapping(data, source=source)


def validate_plan(spec: PlanSpec, *, source: str = "<submitted plan>") -> PlanSpec:
    """Check a `PlanSpec` that arrived over the wire exactly as a plan file is checked.

    The coordinator calls this on every submission: the CLI's own check is a convenience, not a
    boundary, and a plan stored without it could poison the coordinator at every start.

    Raises:
        PlanError: as `parse_plan` does.
    """
    _check_size(len(spec.tasks), source)  # before converting a million tasks to refuse them
    data = msgspec.to_builtins(msgspec.structs.replace(spec, tasks=[]))
    # TOML has no null: an unset optional is an absent key there. One task at a time: a call
    # into msgspec holds the interpreter, and this may run beside the coordinator's loop.
    data["task"] = [_without_nulls(msgspec.to_builtins(t)) for t in spec.tasks]
    del data["tasks"]
    data = _without_nulls(data)
    return plan_from_mapping(data, source=source)


def _check_size(count: int, source: str) -> None:
    if count > MAX_TASKS:
        raise PlanError(
            f"{count:,} tasks: a plan holds at most {MAX_TASKS:,} (split it into plans)",
            source=source,
        )


def _without_nulls(table: dict[str, Any]) -> dict[str, Any]:
    """`table` with every None value (and every None inside a budget table) left out."""
    out = {k: v for k, v in table.items() if v is not None}
    if isinstance(out.get("budget"), dict):
        out["budget"] = {k: v for k, v in out["budget"].items() if v is not None}
    return out


def _replan(value: Any) -> dict[str, str]:
    """The `replan` table: failure class -> action. Raises `ValueError` with the problem."""
    if not isinstance(value, dict):
        raise ValueError(
            f"key 'replan' must be a table of failure class = action, got {describe(value)}"
        )
    classes = [c.value for c in FailureClass]
    actions = [a.value for a in Action]
    for failure, action in value.items():
        if failure not in classes:
            raise ValueError(
                f"key 'replan' names unknown failure class {failure!r}"
                f"{did_you_mean(failure, classes)} (known: {', '.join(classes)})"
            )
        if not isinstance(action, str) or action not in actions:
            raise ValueError(
                f"key 'replan' maps {failure!r} to {describe(action)}; "
                f"expected one of {', '.join(actions)}{did_you_mean(action, actions)}"
            )
    return dict(value)


def plan_from_mapping(data: dict[str, Any], *, source: str = "<plan>") -> PlanSpec:
    """Validate a plan already parsed into plain values (as TOML gives them); see `parse_plan`.

    Raises:
        PlanError: the first problem found.
    """
    for key in data:
        if key not in _TOP_KEYS:
            raise PlanError(
                f"unknown top-level key {key!r}{did_you_mean(key, _TOP_KEYS)} (expected "
                "'name', 'tenant', 'budget', 'strategy', 'replan', 'coordinator', [args] and "
                "[[task]] tables)",
                source=source,
            )

    if "name" not in data:
        raise PlanError("missing required key 'name'", source=source)
    name = data["name"]
    if not isinstance(name, str):
        raise PlanError(f"key 'name' must be a string, got {describe(name)}", source=source)
    if not name.strip():
        raise PlanError("key 'name' must not be empty", source=source)
    if any(unicodedata.category(c) == "Cc" for c in name):
        raise PlanError(
            "key 'name' must not contain control characters (it is printed on terminals)",
            source=source,
        )

    tenant = data.get("tenant")
    if tenant is not None and (not isinstance(tenant, str) or not NAME_PATTERN.fullmatch(tenant)):
        raise PlanError(
            f"key 'tenant' must be a name matching {NAME_PATTERN.pattern}, got {describe(tenant)}",
            source=source,
        )

    try:
        budget = None if "budget" not in data else budget_table(data["budget"], "")
        replan = _replan(data.get("replan", {}))
    except ValueError as exc:
        raise PlanError(str(exc), source=source) from exc
    strategy = data.get("strategy", "one_for_one")
    if strategy not in STRATEGIES:
        raise PlanError(
            f"key 'strategy' must be one of {', '.join(STRATEGIES)}, got {describe(strategy)}"
            f"{did_you_mean(strategy, STRATEGIES)}",
            source=source,
        )

    coordinator, args = _coordinator(data, source)
    if coordinator != DAG:
        if data.get("task"):
            raise PlanError(
                f"coordinator {coordinator!r} decides which lanes run: a plan naming it has "
                "[args] and no [[task]] tables",
                source=source,
            )
        return PlanSpec(
            name=name, tasks=[], tenant=tenant, budget=budget, coordinator=coordinator, args=args
        )
    raw_tasks = data.get("task")
    if raw_tasks is None or raw_tasks == []:
        raise PlanError("no tasks: add at least one [[task]] table", source=source)
    if not isinstance(raw_tasks, list):
        raise PlanError(
            f"'task' must be an array of [[task]] tables, got {describe(raw_tasks)}",
            source=source,
        )
    _check_size(len(raw_tasks), source)

    tasks: list[TaskSpec] = []
    position: dict[str, int] = {}
    for number, raw in enumerate(raw_tasks, start=1):
        task = parse_task(raw, number, source)
        if task.id in position:
            raise PlanError(
                f"duplicate id (task #{number}; first defined as task #{position[task.id]})",
                task=task.id,
                source=source,
            )
        position[task.id] = number
        tasks.append(task)

    plan = PlanSpec(
        name=name,
        tasks=tasks,
        tenant=tenant,
        budget=budget,
        strategy=strategy,
        replan=replan,
    )
    topological_order(plan, source=source)  # dependency and cycle checks
    return plan


def _coordinator(data: dict[str, Any], source: str) -> tuple[str, dict[str, Any]]:
    """The plan's `coordinator` (default "dag") and `[args]` ({}); raises `PlanError` for a
    name that is neither built in nor `module:Class`, and for `[args]` that is no table or is
    given to the dag coordinator (which takes none)."""
    name = data.get("coordinator", DAG)
    if not isinstance(name, str) or not (
        name in BUILTIN_COORDINATORS or COORDINATOR_PATTERN.fullmatch(name)
    ):
        shown = name if isinstance(name, str) else ""
        raise PlanError(
            f"key 'coordinator' must be a built-in ({', '.join(BUILTIN_COORDINATORS)}) or "
            f"'module:Class', got {describe(name)}{did_you_mean(shown, BUILTIN_COORDINATORS)}",
            source=source,
        )
    args = data.get("args", {})
    if not isinstance(args, dict):
        raise PlanError(f"'args' must be a table, got {describe(args)}", source=source)
    if args and name == DAG:
        raise PlanError(
            "[args] are for a coordinator program: the dag coordinator takes none (name one "
            "with coordinator = ...)",
            source=source,
        )
    return name, args


def topological_order(plan: PlanSpec, *, source: str | None = None) -> list[str]:
    """Task ids in an order where every task comes after all it needs.

    Stable: among tasks that are ready at the same time, file order wins (a plan without
    dependencies comes back in file order).

    Raises:
        PlanError: a task needs a task that is not in the plan, needs itself, or the tasks form a
            cycle; the message names the cycle in order ("dependency cycle a -> b -> a", where
            each task needs the next).
    """
    index = {task.id: i for i, task in enumerate(plan.tasks)}
    for task in plan.tasks:
        for dep in task.needs:
            if dep == task.id:
                raise PlanError("needs itself", task=task.id, source=source)
            if dep not in index:
                raise PlanError(f"needs unknown task {dep!r}", task=task.id, source=source)

    waiting = {task.id: len(set(task.needs)) for task in plan.tasks}
    dependents: dict[str, list[str]] = {task.id: [] for task in plan.tasks}
    for task in plan.tasks:
        for dep in dict.fromkeys(task.needs):
            dependents[dep].append(task.id)

    ready = [index[tid] for tid, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        tid = plan.tasks[heapq.heappop(ready)].id
        order.append(tid)
        for child in dependents[tid]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, index[child])

    if len(order) < len(plan.tasks):
        cycle = _find_cycle(plan, set(order), index)
        raise PlanError(
            f"dependency cycle {' -> '.join([*cycle, cycle[0]])}", task=cycle[0], source=source
        )
    return order


def _find_cycle(plan: PlanSpec, done: set[str], index: dict[str, int]) -> list[str]:
    """One cycle among the tasks not in `done`, starting at its member first in file order.

    Every such task still needs at least one other such task, so following the first unfinished
    need from any of them must come back to a task already seen.
    """
    needs = {task.id: task.needs for task in plan.tasks}
    start = next(task.id for task in plan.tasks if task.id not in done)
    path: list[str] = []
    seen: dict[str, int] = {}
    node = start
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = next(dep for dep in needs[node] if dep not in done)
    cycle = path[seen[node] :]
    first = min(range(len(cycle)), key=lambda i: index[cycle[i]])
    return cycle[first:] + cycle[:first]

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
    rev = "HEAD~3"                # optional: the workspace revision its sandbox is made at
    feedback = "use tabs"         # optional: its first attempt's $ORCHESTRA_FEEDBACK (64 KiB)

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
import math
import re
import tomllib
import unicodedata
from pathlib import Path
from typing import Any

import msgspec

from orchestra_sup.coordinator.strategy import MAX_BACKOFF_S, Action
from orchestra_sup.errors import PlanError, did_you_mean
from orchestra_sup.protocol.frames import Budget, FailureClass, PlanSpec, TaskSpec
from orchestra_sup.protocol.patterns import NAME_PATTERN, PROGRAM_PATTERN, SHELL

__all__ = ["load_plan", "parse_plan", "plan_from_mapping", "topological_order", "validate_plan"]

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""What a task id must match, in full."""

_TOP_KEYS = frozenset({"name", "task", "tenant", "budget", "strategy", "replan"})
_TASK_KEYS = frozenset(
    {
        "id",
        "run",
        "needs",
        "timeout_s",
        "commit",
        "requires",
        "program",
        "retries",
        "backoff_s",
        "on_failure",
        "approve",
        "budget",
        "tenant",
        "rev",
        "feedback",
    }
)
MAX_RETRIES = 100
"""The largest `retries` a task may declare."""
MAX_TASKS = 20_000
"""The most tasks a plan may hold. The coordinator keeps every plan in memory and runs each in
time linear in its tasks and needs; `bench plan` settles 10,000-task chains, fan-outs and fan-ins
with the coordinator's loop-lag p99 under 50 ms, and this leaves twice that room. A bigger plan
is refused before anything of it is converted or stored (README: "Plans")."""
REV_PATTERN = re.compile(r"[^\s\x00]{1,256}")
"""What a task's `rev` must match, in full: 1 to 256 characters, no whitespace or NUL."""
MAX_FEEDBACK_BYTES = 64 * 1024
"""The most a task's `feedback` may hold (bytes of UTF-8), as much as a lane message."""
STRATEGIES = ("one_for_one", "one_for_all", "rest_for_one")
ON_FAILURE = ("escalate", "retry", "pause")
_BUDGET_KEYS = ("wall_s", "cpu_s", "output_bytes")

_TOML_TYPES: dict[type, str] = {
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "float",
    list: "array",
    dict: "table",
}


def _describe(value: Any) -> str:
    """`value` as a short, one-line repr with its TOML type, for error messages."""
    text = ("true" if value else "false") if isinstance(value, bool) else repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    kind = _TOML_TYPES.get(type(value), type(value).__name__)
    return f"{text} ({kind})"


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


def _budget(value: Any, where: str) -> Budget:
    """A `budget` table: `wall_s` and `cpu_s` positive finite seconds, `output_bytes` a positive
    integer, at least one of them. Raises `ValueError` with the problem."""
    if not isinstance(value, dict):
        raise ValueError(
            f"key 'budget'{where} must be a table like {{ wall_s = 60 }}, got {_describe(value)}"
        )
    unknown = sorted(set(value) - set(_BUDGET_KEYS))
    if unknown:
        raise ValueError(
            f"key 'budget'{where} has unknown key {unknown[0]!r}"
            f"{did_you_mean(unknown[0], _BUDGET_KEYS)} (allowed: {', '.join(_BUDGET_KEYS)})"
        )
    if not value:
        raise ValueError(f"key 'budget'{where} is empty: give wall_s, cpu_s or output_bytes")
    for key, limit in value.items():
        if key == "output_bytes":
            if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
                raise ValueError(
                    f"budget key 'output_bytes'{where} must be a positive integer, "
                    f"got {_describe(limit)}"
                )
        elif (
            isinstance(limit, bool)
            or not isinstance(limit, int | float)
            or not math.isfinite(limit)
            or limit <= 0
        ):
            raise ValueError(
                f"budget key {key!r}{where} must be a positive finite number of seconds, "
                f"got {_describe(limit)}"
            )
    return Budget(
        wall_s=None if "wall_s" not in value else float(value["wall_s"]),
        cpu_s=None if "cpu_s" not in value else float(value["cpu_s"]),
        output_bytes=value.get("output_bytes"),
    )


def _replan(value: Any) -> dict[str, str]:
    """The `replan` table: failure class -> action. Raises `ValueError` with the problem."""
    if not isinstance(value, dict):
        raise ValueError(
            f"key 'replan' must be a table of failure class = action, got {_describe(value)}"
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
                f"key 'replan' maps {failure!r} to {_describe(action)}; "
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
                "'name', 'tenant', 'budget', 'strategy', 'replan' and [[task]] tables)",
                source=source,
            )

    if "name" not in data:
        raise PlanError("missing required key 'name'", source=source)
    name = data["name"]
    if not isinstance(name, str):
        raise PlanError(f"key 'name' must be a string, got {_describe(name)}", source=source)
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
            f"key 'tenant' must be a name matching {NAME_PATTERN.pattern}, got {_describe(tenant)}",
            source=source,
        )

    try:
        budget = None if "budget" not in data else _budget(data["budget"], "")
        replan = _replan(data.get("replan", {}))
    except ValueError as exc:
        raise PlanError(str(exc), source=source) from exc
    strategy = data.get("strategy", "one_for_one")
    if strategy not in STRATEGIES:
        raise PlanError(
            f"key 'strategy' must be one of {', '.join(STRATEGIES)}, got {_describe(strategy)}"
            f"{did_you_mean(strategy, STRATEGIES)}",
            source=source,
        )

    raw_tasks = data.get("task")
    if raw_tasks is None or raw_tasks == []:
        raise PlanError("no tasks: add at least one [[task]] table", source=source)
    if not isinstance(raw_tasks, list):
        raise PlanError(
            f"'task' must be an array of [[task]] tables, got {_describe(raw_tasks)}",
            source=source,
        )
    _check_size(len(raw_tasks), source)

    tasks: list[TaskSpec] = []
    position: dict[str, int] = {}
    for number, raw in enumerate(raw_tasks, start=1):
        task = _parse_task(raw, number, source)
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


def _parse_task(raw: Any, number: int, source: str) -> TaskSpec:
    """Validate the `number`-th (1-based) [[task]] table and build its `TaskSpec`."""
    label = f"#{number}"
    if not isinstance(raw, dict):
        raise PlanError(
            f"must be a [[task]] table, got {_describe(raw)}", task=label, source=source
        )

    if "id" not in raw:
        raise PlanError("missing required key 'id'", task=label, source=source)
    task_id = raw["id"]
    if not isinstance(task_id, str):
        raise PlanError(
            f"key 'id' must be a string, got {_describe(task_id)}", task=label, source=source
        )
    if not ID_PATTERN.fullmatch(task_id):
        raise PlanError(
            f"key 'id' value {task_id!r} must match {ID_PATTERN.pattern}",
            task=label,
            source=source,
        )

    def refuse(problem: str) -> PlanError:
        return PlanError(problem, task=task_id, source=source)

    for key in raw:
        if key not in _TASK_KEYS:
            raise refuse(
                f"unknown key {key!r}{did_you_mean(key, _TASK_KEYS)} "
                f"(allowed: {', '.join(sorted(_TASK_KEYS))})"
            )

    program = raw.get("program", SHELL)
    if not isinstance(program, str) or not PROGRAM_PATTERN.fullmatch(program):
        raise refuse(f"key 'program' must be 'shell' or 'module:Class', got {_describe(program)}")

    if "run" not in raw and program == SHELL:
        raise refuse("missing required key 'run'")
    run = raw.get("run", "")
    if not isinstance(run, str):
        raise refuse(f"key 'run' must be a string, got {_describe(run)}")
    if not run.strip() and program == SHELL:
        raise refuse("key 'run' must not be empty")

    needs_raw = raw.get("needs", [])
    if not isinstance(needs_raw, list):
        raise refuse(f"key 'needs' must be an array of task ids, got {_describe(needs_raw)}")
    needs: list[str] = []
    listed: set[str] = set()  # not `dep in needs`: a fan-in of 10,000 needs made that quadratic
    for dep in needs_raw:
        if not isinstance(dep, str):
            raise refuse(f"key 'needs' must hold task id strings, got {_describe(dep)}")
        if dep == task_id:
            raise refuse("needs itself")
        if dep in listed:
            raise refuse(f"key 'needs' lists {dep!r} twice")
        listed.add(dep)
        needs.append(dep)

    timeout_s: float | None = None
    if "timeout_s" in raw:
        value = raw["timeout_s"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise refuse(f"key 'timeout_s' must be a number of seconds, got {_describe(value)}")
        if not math.isfinite(value) or value <= 0:
            raise refuse(f"key 'timeout_s' must be a positive finite number, got {value!r}")
        timeout_s = float(value)

    commit = raw.get("commit", False)
    if not isinstance(commit, bool):
        raise refuse(f"key 'commit' must be a boolean, got {_describe(commit)}")

    requires_raw = raw.get("requires", [])
    if not isinstance(requires_raw, list):
        raise refuse(
            f"key 'requires' must be an array of capability names, got {_describe(requires_raw)}"
        )
    for capability in requires_raw:
        if not isinstance(capability, str) or not NAME_PATTERN.fullmatch(capability):
            raise refuse(
                f"key 'requires' must hold names matching {NAME_PATTERN.pattern}, "
                f"got {_describe(capability)}"
            )
    requires = list(dict.fromkeys(requires_raw))

    retries = raw.get("retries", 0)
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
        raise refuse(
            f"key 'retries' must be an integer from 0 to {MAX_RETRIES}, got {_describe(retries)}"
        )
    backoff_s = raw.get("backoff_s", 1.0)
    if (
        isinstance(backoff_s, bool)
        or not isinstance(backoff_s, int | float)
        or not math.isfinite(backoff_s)
        or not 0 < backoff_s <= MAX_BACKOFF_S
    ):
        raise refuse(
            f"key 'backoff_s' must be a number of seconds in (0, {MAX_BACKOFF_S:g}], "
            f"got {_describe(backoff_s)}"
        )
    on_failure = raw.get("on_failure")
    if on_failure is not None and on_failure not in ON_FAILURE:
        raise refuse(
            f"key 'on_failure' must be one of {', '.join(ON_FAILURE)}, got {_describe(on_failure)}"
            f"{did_you_mean(on_failure, ON_FAILURE)}"
        )
    if on_failure == "retry" and retries == 0:
        raise refuse("on_failure = 'retry' needs retries >= 1 (how many times to retry)")
    approve = raw.get("approve", False)
    if not isinstance(approve, bool):
        raise refuse(f"key 'approve' must be a boolean, got {_describe(approve)}")
    try:
        budget = None if "budget" not in raw else _budget(raw["budget"], "")
    except ValueError as exc:
        raise refuse(str(exc)) from exc
    tenant = raw.get("tenant")
    if tenant is not None and (not isinstance(tenant, str) or not NAME_PATTERN.fullmatch(tenant)):
        raise refuse(
            f"key 'tenant' must be a name matching {NAME_PATTERN.pattern}, got {_describe(tenant)}"
        )
    rev, feedback = raw.get("rev"), raw.get("feedback")
    if rev is not None and not (isinstance(rev, str) and REV_PATTERN.fullmatch(rev)):
        raise refuse(f"key 'rev' must be 1 to 256 characters, no whitespace, got {_describe(rev)}")
    if feedback is not None and not (
        isinstance(feedback, str) and len(feedback.encode(errors="replace")) <= MAX_FEEDBACK_BYTES
    ):
        raise refuse(
            f"key 'feedback' must be a string of at most 64 KiB, got {_describe(feedback)}"
        )

    return TaskSpec(
        id=task_id,
        run=run,
        needs=needs,
        timeout_s=timeout_s,
        commit=commit,
        requires=requires,
        program=program,
        retries=retries,
        backoff_s=float(backoff_s),
        on_failure=on_failure,
        approve=approve,
        budget=budget,
        tenant=tenant,
        rev=rev,
        feedback=feedback,
    )


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

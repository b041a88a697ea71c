"""One `[[task]]` table of a plan file, checked and built into a `TaskSpec` (`parse_task`).

`coordinator.plan` checks the plan around its tasks and says which keys a task takes (its
module docstring); this module checks each task's keys and values, one problem as one
`PlanError` naming the task and the key, and the value shapes a plan and its tasks share
(`budget_table`, `describe`).
"""

from __future__ import annotations

import math
import re
from typing import Any

from orchestra_sup.coordinator.strategy import MAX_BACKOFF_S
from orchestra_sup.errors import PlanError, did_you_mean
from orchestra_sup.protocol.frames import Budget, TaskSpec
from orchestra_sup.protocol.patterns import NAME_PATTERN, PROGRAM_PATTERN, SHELL

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""What a task id must match, in full."""

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
MAX_REV_CHARS = 256
"""The longest `rev` a task may name (characters)."""
MAX_FEEDBACK_BYTES = 64 * 1024
"""The most a task's `feedback` may hold (bytes of UTF-8), as much as a lane message."""
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


def describe(value: Any) -> str:
    """`value` as a short, one-line repr with its TOML type, for error messages."""
    text = ("true" if value else "false") if isinstance(value, bool) else repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    kind = _TOML_TYPES.get(type(value), type(value).__name__)
    return f"{text} ({kind})"


def budget_table(value: Any, where: str) -> Budget:
    """A `budget` table: `wall_s` and `cpu_s` positive finite seconds, `output_bytes` a positive
    integer, at least one of them. Raises `ValueError` with the problem."""
    if not isinstance(value, dict):
        raise ValueError(
            f"key 'budget'{where} must be a table like {{ wall_s = 60 }}, got {describe(value)}"
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
                    f"got {describe(limit)}"
                )
        elif (
            isinstance(limit, bool)
            or not isinstance(limit, int | float)
            or not math.isfinite(limit)
            or limit <= 0
        ):
            raise ValueError(
                f"budget key {key!r}{where} must be a positive finite number of seconds, "
                f"got {describe(limit)}"
            )
    return Budget(
        wall_s=None if "wall_s" not in value else float(value["wall_s"]),
        cpu_s=None if "cpu_s" not in value else float(value["cpu_s"]),
        output_bytes=value.get("output_bytes"),
    )


def parse_task(raw: Any, number: int, source: str) -> TaskSpec:
    """Validate the `number`-th (1-based) [[task]] table and build its `TaskSpec`."""
    label = f"#{number}"
    if not isinstance(raw, dict):
        raise PlanError(f"must be a [[task]] table, got {describe(raw)}", task=label, source=source)

    if "id" not in raw:
        raise PlanError("missing required key 'id'", task=label, source=source)
    task_id = raw["id"]
    if not isinstance(task_id, str):
        raise PlanError(
            f"key 'id' must be a string, got {describe(task_id)}", task=label, source=source
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
        raise refuse(f"key 'program' must be 'shell' or 'module:Class', got {describe(program)}")

    if "run" not in raw and program == SHELL:
        raise refuse("missing required key 'run'")
    run = raw.get("run", "")
    if not isinstance(run, str):
        raise refuse(f"key 'run' must be a string, got {describe(run)}")
    if not run.strip() and program == SHELL:
        raise refuse("key 'run' must not be empty")

    needs_raw = raw.get("needs", [])
    if not isinstance(needs_raw, list):
        raise refuse(f"key 'needs' must be an array of task ids, got {describe(needs_raw)}")
    needs: list[str] = []
    listed: set[str] = set()  # not `dep in needs`: a fan-in of 10,000 needs made that quadratic
    for dep in needs_raw:
        if not isinstance(dep, str):
            raise refuse(f"key 'needs' must hold task id strings, got {describe(dep)}")
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
            raise refuse(f"key 'timeout_s' must be a number of seconds, got {describe(value)}")
        if not math.isfinite(value) or value <= 0:
            raise refuse(f"key 'timeout_s' must be a positive finite number, got {value!r}")
        timeout_s = float(value)

    commit = raw.get("commit", False)
    if not isinstance(commit, bool):
        raise refuse(f"key 'commit' must be a boolean, got {describe(commit)}")

    requires_raw = raw.get("requires", [])
    if not isinstance(requires_raw, list):
        raise refuse(
            f"key 'requires' must be an array of capability names, got {describe(requires_raw)}"
        )
    for capability in requires_raw:
        if not isinstance(capability, str) or not NAME_PATTERN.fullmatch(capability):
            raise refuse(
                f"key 'requires' must hold names matching {NAME_PATTERN.pattern}, "
                f"got {describe(capability)}"
            )
    requires = list(dict.fromkeys(requires_raw))

    retries = raw.get("retries", 0)
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
        raise refuse(
            f"key 'retries' must be an integer from 0 to {MAX_RETRIES}, got {describe(retries)}"
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
            f"got {describe(backoff_s)}"
        )
    on_failure = raw.get("on_failure")
    if on_failure is not None and on_failure not in ON_FAILURE:
        raise refuse(
            f"key 'on_failure' must be one of {', '.join(ON_FAILURE)}, got {describe(on_failure)}"
            f"{did_you_mean(on_failure, ON_FAILURE)}"
        )
    if on_failure == "retry" and retries == 0:
        raise refuse("on_failure = 'retry' needs retries >= 1 (how many times to retry)")
    approve = raw.get("approve", False)
    if not isinstance(approve, bool):
        raise refuse(f"key 'approve' must be a boolean, got {describe(approve)}")
    try:
        budget = None if "budget" not in raw else budget_table(raw["budget"], "")
    except ValueError as exc:
        raise refuse(str(exc)) from exc
    tenant = raw.get("tenant")
    if tenant is not None and (not isinstance(tenant, str) or not NAME_PATTERN.fullmatch(tenant)):
        raise refuse(
            f"key 'tenant' must be a name matching {NAME_PATTERN.pattern}, got {describe(tenant)}"
        )
    rev = raw.get("rev")
    if rev is not None and (
        not isinstance(rev, str)
        or not 0 < len(rev) <= MAX_REV_CHARS
        or any(c.isspace() or c == "\0" for c in rev)
    ):
        raise refuse(
            f"key 'rev' must be a revision of 1 to {MAX_REV_CHARS} characters with no "
            f"whitespace (a sha, a branch, HEAD~3), got {describe(rev)}"
        )
    feedback = raw.get("feedback")
    if feedback is not None and (
        not isinstance(feedback, str)
        or len(feedback.encode("utf-8", "surrogatepass")) > MAX_FEEDBACK_BYTES
    ):
        raise refuse(
            f"key 'feedback' must be a string of at most {MAX_FEEDBACK_BYTES} bytes of UTF-8, "
            f"got {describe(feedback)}"
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

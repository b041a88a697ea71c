"""Budgets: what a plan and its tasks may spend, and the grant each lane is carved at spawn.

seeds/003 ("Cost and budget enforcement"): "a parent's allocator reserves a child's budget from
its own when the child is created, so a subtree can never outspend its parent. Exceeding a
declared dimension raises a budget failure into supervision." Here the parent is the plan, the
children its tasks' lanes: a lane's grant (`LaneStart.budget`) is, in each dimension, the least
of what its task has left (its `budget`, plus what humans granted, minus what its earlier
attempts spent) and what its plan has left (its `budget` minus what ended lanes spent and what
live lanes hold as grants); in a dimension its task does not limit, an equal share of what the
plan has left among the tasks still to run (`carve`). The shard stops a lane that spends its
grant in any dimension (failure class `budget_exhaustion`). Pure arithmetic over `frames.Budget`
and `frames.Spend`.

Units: `wall_s` and `cpu_s` are seconds (float), `output_bytes` bytes (int); None in a `Budget`
is no limit in that dimension.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from orchestra_sup.protocol.frames import Budget, Spend

DIMENSIONS = ("wall_s", "cpu_s", "output_bytes")
MAX_SECONDS = 1e9
"""The most seconds a grant may add, or a budget hold, in `wall_s` or `cpu_s` (about 31 years)."""
MAX_BYTES = 2**53
"""The most bytes a grant may add, or a budget hold, in `output_bytes` (exact in a float)."""


def grant_problem(grant: Budget) -> str | None:
    """Why a human's `grant` cannot be taken, in one line, or None: each dimension it names must
    be a positive finite number, at most `MAX_SECONDS` seconds or `MAX_BYTES` bytes (an integer).
    A grant arrives from outside (`ctl approve --grant`, or a raw frame): it is checked here,
    at the coordinator, whatever the CLI checked."""
    for name in DIMENSIONS:
        value = getattr(grant, name)
        if value is None:
            continue
        cap = MAX_BYTES if name == "output_bytes" else MAX_SECONDS
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"grant {name} must be a number"
        if name == "output_bytes" and not isinstance(value, int):
            return "grant output_bytes must be an integer"
        if not math.isfinite(value) or not 0 < value <= cap:
            return f"grant {name} = {value!r} must be positive and at most {cap:g}"
    if all(getattr(grant, name) is None for name in DIMENSIONS):
        return "a grant must name wall_s, cpu_s or output_bytes"
    return None


def add(a: Spend, b: Spend) -> Spend:
    """`a` + `b`, dimension by dimension."""
    return Spend(
        wall_s=round(a.wall_s + b.wall_s, 6),
        cpu_s=round(a.cpu_s + b.cpu_s, 6),
        output_bytes=a.output_bytes + b.output_bytes,
    )


def total(spends: Iterable[Spend]) -> Spend:
    out = Spend()
    for spend in spends:
        out = add(out, spend)
    return out


def as_spend(grant: Budget | None) -> Spend:
    """A grant as the spend it reserves (an unlimited dimension reserves nothing)."""
    if grant is None:
        return Spend()
    return Spend(
        wall_s=grant.wall_s or 0.0,
        cpu_s=grant.cpu_s or 0.0,
        output_bytes=grant.output_bytes or 0,
    )


def extend(limit: Budget | None, extra: Budget | None) -> Budget | None:
    """`limit` raised by a human's `extra` grant in the dimensions `limit` limits (a dimension
    with no limit stays unlimited; one `extra` names that `limit` does not is ignored)."""
    if limit is None or extra is None:
        return limit
    return Budget(
        wall_s=_plus(limit.wall_s, extra.wall_s),
        cpu_s=_plus(limit.cpu_s, extra.cpu_s),
        output_bytes=_plus(limit.output_bytes, extra.output_bytes),
    )


def plus(a: Budget | None, b: Budget) -> Budget:
    """Two grants added up, dimension by dimension (None counts as 0 unless both are None)."""
    if a is None:
        return b
    out = _sum(a.output_bytes, b.output_bytes)
    return Budget(
        wall_s=_sum(a.wall_s, b.wall_s),
        cpu_s=_sum(a.cpu_s, b.cpu_s),
        output_bytes=None if out is None else int(out),
    )


def left(limit: Budget | None, spent: Spend, held: Spend | None = None) -> Budget | None:
    """What is left of `limit` after `spent` and `held` (grants of live lanes; None: none),
    never below 0; None when `limit` is None."""
    held = held or Spend()
    if limit is None:
        return None

    def rest(cap: float | None, used: float) -> float | None:
        return None if cap is None else max(0.0, cap - used)

    out = rest(limit.output_bytes, spent.output_bytes + held.output_bytes)
    return Budget(
        wall_s=rest(limit.wall_s, spent.wall_s + held.wall_s),
        cpu_s=rest(limit.cpu_s, spent.cpu_s + held.cpu_s),
        output_bytes=None if out is None else int(out),
    )


def carve(task_left: Budget | None, plan_left: Budget | None, share: int = 1) -> Budget | None:
    """The grant of a lane: in each dimension, the least of what its task and its plan have
    left; in a dimension its task does not limit, a `share`-th of what the plan has left (its
    tasks still to run share it equally, so the first lane does not hold the whole plan's budget
    while its siblings starve). None when neither limits anything."""
    if plan_left is None:
        return task_left
    task_left = task_left or Budget()

    def one(mine: float | None, plans: float | None) -> float | None:
        if plans is None:
            return mine
        if mine is None:
            return plans / max(1, share)
        return min(mine, plans)

    out = one(task_left.output_bytes, plan_left.output_bytes)
    return Budget(
        wall_s=one(task_left.wall_s, plan_left.wall_s),
        cpu_s=one(task_left.cpu_s, plan_left.cpu_s),
        output_bytes=None if out is None else int(out),
    )


def empty(grant: Budget | None) -> str | None:
    """The first dimension in which `grant` has nothing left ("wall_s", ...), or None when it
    covers another attempt (something is left in every dimension it limits)."""
    if grant is None:
        return None
    for name in DIMENSIONS:
        value = getattr(grant, name)
        if value is not None and value <= 0:
            return name
    return None


def describe(budget: Budget | None) -> str:
    """`budget` in one line ("wall_s 60, output_bytes 1000"; "unlimited")."""
    if budget is None:
        return "unlimited"
    parts = [
        f"{name} {getattr(budget, name):g}"
        for name in DIMENSIONS
        if getattr(budget, name) is not None
    ]
    return ", ".join(parts) or "unlimited"


def _plus(a: float | None, b: float | None) -> float | None:
    if a is None:
        return None
    return a + (b or 0)


def _sum(a: float | None, b: float | None) -> float | None:
    """a + b (None counts as 0 unless both are None), held at the caps (`MAX_SECONDS`,
    `MAX_BYTES`): grants add up over many answers, and a record must stay encodable."""
    if a is None and b is None:
        return None
    return min((a or 0) + (b or 0), MAX_BYTES if isinstance(a or b, int) else MAX_SECONDS)


def _least(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)

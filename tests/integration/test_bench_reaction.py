"""The stamps `bench reaction` reads: a shard's receipt of a LaneStart, the coordinator's of
a result."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.harness import Tree, plan, task

pytestmark = pytest.mark.integration


def ordered(steps: list[list[int | None]]) -> bool:
    """Every stamp is there, each lane's start before its result, each result before the next
    lane's start: one clock, in the order the program's steps took."""
    flat = [stamp for step in steps for stamp in step]
    return all(isinstance(s, int) for s in flat) and flat == sorted(flat)  # type: ignore[type-var]


def test_a_finished_task_reports_when_its_start_and_its_result_arrived(
    tree_factory: Callable[..., Tree], repo: Path
) -> None:
    """The plumbing on its own, through a plain plan: a chain's tasks each show the shard's
    receipt of their LaneStart and the coordinator's receipt of their result, in order."""
    tree = tree_factory(workspace=repo)
    plan_id = tree.submit(
        plan("chain", task("a", "true"), task("b", "true", ["a"]), task("c", "true", ["b"]))
    )
    report = tree.wait_plan(plan_id)
    assert report.ok
    steps = [[t.start_received_ns, t.result_received_ns] for t in report.tasks]
    assert ordered(steps), steps

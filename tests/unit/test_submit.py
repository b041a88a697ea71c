"""A plan's acceptance (`Coordinator._submit`): the plan and its first placements go to disk
in the same commit when they can, and no one hears of a plan before it is durable: not its
submitter, not a second submitter of the same idempotency key, not a shard."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from orchestra_sup.coordinator.role import Coordinator
from orchestra_sup.protocol import frames as f
from tests.unit.test_coordinator_scaling import Shards
from tests.unit.test_start_lane import with_coordinator


def spec() -> f.PlanSpec:
    return f.PlanSpec(name="p", tasks=[f.TaskSpec(id="a", run="true")])


def test_two_submissions_of_one_key_at_once_make_one_plan(tmp_path: Path) -> None:
    """Two `start_lane key=k` at once (a program's retry racing its first try): one plan, one
    lane started, both answered with its id."""

    async def body(coordinator: Coordinator, node: Shards) -> Any:
        answers = await asyncio.gather(
            coordinator._submit(spec(), key="k"), coordinator._submit(spec(), key="k")
        )
        await node.settle()
        assert coordinator.book is not None
        return answers, len(coordinator.book.plans), len(node.started)

    (first, second), plans, started = with_coordinator(tmp_path, body)
    assert isinstance(first, f.PlanAccepted) and first == second
    assert (plans, started) == (1, 1)


def test_a_submission_is_answered_only_once_its_plan_is_committed(tmp_path: Path) -> None:
    """The answer to a submission, and to a second one of its key, come after the commit that
    holds the plan."""
    commits: list[int] = []

    async def body(coordinator: Coordinator, node: Shards) -> Any:
        seen: list[tuple[str, int]] = []

        async def submit(tag: str) -> None:
            await coordinator._submit(spec(), key="k")
            seen.append((tag, len(commits)))

        await asyncio.gather(submit("first"), submit("second"))
        await node.settle()
        return seen

    seen = with_coordinator(tmp_path, body, on_commit=commits.append)
    assert sorted(tag for tag, _ in seen) == ["first", "second"]
    assert all(count >= 1 for _, count in seen), seen

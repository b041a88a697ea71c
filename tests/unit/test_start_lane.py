"""`start_lane rev= commit= feedback=` (issue 19): the coordinator reads each parameter into the
task it places, a first attempt gets the task's feedback, the sha its sandbox was made at reaches
the report (the custodian's side: test_sandbox_rev.py).

The coordinator runs with a real LMDB store and a stand-in node (`Shards`), as in
test_coordinator_scaling.py; a real tree runs all of it in
tests/integration/test_start_lane_rev.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from orchestra_sup.coordinator.backoff import Backoffs
from orchestra_sup.coordinator.placement import ShardView
from orchestra_sup.coordinator.planstore import DBS
from orchestra_sup.coordinator.report import plan_report
from orchestra_sup.coordinator.role import Coordinator
from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import tools
from orchestra_sup.state.store import Store
from tests.unit.test_backoff import Clocks
from tests.unit.test_coordinator_scaling import Shards, ended

Steps = Callable[[Coordinator, Shards], Awaitable[Any]]


def with_coordinator(
    tmp_path: Path, steps: Steps, on_commit: Callable[[int], None] | None = None
) -> Any:
    """Run `steps` against a coordinator with one shard of room; `on_commit` is its store's
    (`Store`: called after each commit)."""

    async def main() -> Any:
        store = Store(tmp_path / "coordinator", ["inbox", *DBS], on_commit=on_commit)
        store.start()
        try:
            node = Shards()
            coordinator = Coordinator()
            coordinator.attach(node, store)  # type: ignore[arg-type]
            coordinator.shards["shard-0"] = ShardView(
                name="shard-0", generation=1, up=True, capacity=8
            )
            return await steps(coordinator, node)
        finally:
            store.close()

    return asyncio.run(main())


async def start(coordinator: Coordinator, node: Shards, **params: str) -> f.LaneStart:
    """`start_lane` with `params` through the toolkit, as `ctl call` reaches it; the
    `LaneStart` it placed."""
    parsed = tools.TOOLS["start_lane"].parse(params)
    assert isinstance(parsed, tools.StartLane)
    await coordinator._start_lane(parsed)
    await node.settle()
    return node.started.pop()


def test_rev_commit_and_feedback_reach_the_lane_start(tmp_path: Path) -> None:
    async def steps(coordinator: Coordinator, node: Shards) -> list[f.LaneStart]:
        return [
            await start(
                coordinator, node, run="x", rev="HEAD~2", commit="true", feedback="use tabs"
            ),
            await start(coordinator, node, run="x", commit="FALSE"),
            await start(coordinator, node, run="x", rev="", feedback=""),
        ]

    given, false, empty = with_coordinator(tmp_path, steps)
    assert (given.task.rev, given.task.commit, given.feedback) == ("HEAD~2", True, "use tabs")
    assert (false.task.rev, false.task.commit, false.feedback) == (None, False, None)
    assert (empty.task.rev, empty.task.commit, empty.feedback) == (None, False, None)


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"commit": "yes"}, "parameter 'commit' must be true or false, got 'yes'"),
        ({"commit": "1"}, "parameter 'commit'"),
        ({"rev": "main two"}, "key 'rev'"),
        ({"rev": "a" * 257}, "key 'rev'"),
        ({"feedback": "x" * (64 * 1024 + 1)}, "key 'feedback'"),
    ],
)
def test_a_bad_parameter_is_bad_request_naming_it(
    tmp_path: Path, params: dict[str, str], needle: str
) -> None:
    async def steps(coordinator: Coordinator, node: Shards) -> None:
        with pytest.raises(RemoteError) as info:
            await start(coordinator, node, run="x", **params)
        assert info.value.code is ErrorCode.BAD_REQUEST
        assert needle in info.value.message and "\n" not in info.value.message
        assert node.started == [] and coordinator.book is not None
        assert coordinator.book.plans == {}  # nothing was accepted

    with_coordinator(tmp_path, steps)


def test_the_tasks_feedback_is_for_its_first_attempt_only(tmp_path: Path) -> None:
    """A plain retry runs without the task's feedback; a retry with feedback gets its own."""

    async def steps(coordinator: Coordinator, node: Shards) -> list[str | None]:
        assert coordinator.placer is not None
        clocks = Clocks()
        clocks.wall_s = time.time()  # the runner stores what the system's clock says
        coordinator.placer.backoffs = Backoffs(wall=clocks.wall, monotonic=clocks.monotonic)
        replan = {"timeout": "retry_with_feedback"}
        task = f.TaskSpec(id="a", run="false", retries=2, backoff_s=1.0, feedback="first")
        await coordinator._submit(f.PlanSpec(name="p", tasks=[task], replan=replan))
        await node.settle()
        seen = []
        for failure in (f.FailureClass.TOOL_FAILURE, f.FailureClass.TIMEOUT):
            lane = node.started.pop()
            seen.append(lane.feedback)
            coordinator._apply(
                f.LaneResult(**{**_fields(ended(lane, "failed")), "failure": failure})
            )
            clocks.mono_s += 10.0  # past its backoff
            coordinator._pump()
            await node.settle()
        seen.append(node.started.pop().feedback)
        return seen

    # the first attempt, a plain retry, then a retry with the timeout's error as feedback
    assert with_coordinator(tmp_path, steps) == ["first", None, "exit 1"]


def test_the_sha_a_sandbox_was_made_at_reaches_the_report(tmp_path: Path) -> None:
    sha = "0123456789abcdef0123456789abcdef01234567"

    async def steps(coordinator: Coordinator, node: Shards) -> f.PlanReport:
        lane = await start(coordinator, node, run="x", rev="main")
        assert coordinator.book is not None
        plan = coordinator.book.plans[lane.plan]
        assert plan_report(plan).tasks[0].rev is None  # not yet: no lane of it ended
        result = ended(lane, "succeeded")
        coordinator._apply(f.LaneResult(**{**_fields(result), "rev": sha, "sandbox": "/sb"}))
        return plan_report(plan)

    (task,) = with_coordinator(tmp_path, steps).tasks
    assert (task.rev, task.sandbox, task.status) == (sha, "/sb", "succeeded")


def _fields(result: f.LaneResult) -> dict[str, Any]:
    return {name: getattr(result, name) for name in result.__struct_fields__}

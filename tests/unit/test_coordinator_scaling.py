"""The coordinator's own work per plan is linear (issue 24): submitting, placing, applying every
lane's result, skipping and finishing a plan 4 x as big costs at most `LINEAR` x the lines of
Python and the bytes written to LMDB, for a chain listed goal first, a fan-out and a fan-in, run
to success or with their first task failing.

`Coordinator` runs with a real LMDB store; its node is stood in for (`Shards`: a start is taken
at once, and the test reports each lane's end), as in test_coordinator_hitl.py: the cost counted
is the coordinator's, not the messaging's. Real trees run big plans in
tests/integration/test_big_plans.py, and `bench plan` times them.
"""

from __future__ import annotations

import asyncio
import gc
import shutil
import tempfile
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestra_sup.coordinator.placement import ShardView
from orchestra_sup.coordinator.report import plan_report, sliced_report
from orchestra_sup.coordinator.role import FREEZE_TASKS, Coordinator
from orchestra_sup.coordinator.runner import Attempt, PlanRecord, TaskRecord, TaskStatus
from orchestra_sup.coordinator.slices import Slicer
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.childargs import ChildArgs
from tests.unit.test_plan_scaling import LINEAR, SHAPES, lines_run
from tests.unit.test_planstore import Counting

SMALL, BIG = 150, 600
LANES = 8


class Shards:
    """The coordinator's node, as far as placing and finishing plans use it: `call` takes a
    `LaneStart` at once and keeps it in `started`, `spawn` runs the coroutine as a task."""

    def __init__(self) -> None:
        self.args = ChildArgs(
            role="coordinator",
            name="coordinator",
            generation=1,
            run_dir="/nonexistent",
            state_dir="/nonexistent",
            workspace=None,
            lanes_per_shard=LANES,
            supervisor_pid=1,
        )
        self.peers = {"shard-0": object()}
        self.started: list[f.LaneStart] = []
        self.tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def retitle(self) -> None:
        pass

    async def call(self, name: str, body: f.Body, *, timeout_s: float) -> f.Body:
        assert isinstance(body, f.LaneStart)
        self.started.append(body)
        return f.Ack()

    async def settle(self) -> None:
        while self.tasks:
            await asyncio.gather(*self.tasks)


def ended(start: f.LaneStart, status: str) -> f.LaneResult:
    return f.LaneResult(
        lane=start.lane,
        plan=start.plan,
        task=start.task.id,
        shard="shard-0",
        status=status,  # type: ignore[arg-type]
        exit_code=0 if status == "succeeded" else 1,
        duration_s=0.0,
        output_tail="",
        sandbox=None,
        commit=None,
        error=None if status == "succeeded" else "exit 1",
    )


def run(path: Path, shape: str, n: int, fail: str | None) -> tuple[int, int]:
    """(lines of Python, bytes written) for the coordinator to run one plan to its end."""
    store = Counting(path)

    async def main() -> None:
        store.start()
        node = Shards()
        coordinator = Coordinator()
        coordinator.attach(node, store)  # type: ignore[arg-type]
        coordinator.shards["shard-0"] = ShardView(
            name="shard-0", generation=1, up=True, capacity=LANES
        )
        spec = f.PlanSpec(name=shape, tasks=SHAPES[shape](n))
        accepted = await coordinator._submit(spec)
        assert isinstance(accepted, f.PlanAccepted)
        plan = coordinator.book.plans[accepted.id]
        await node.settle()
        while not plan.done:
            assert node.started, "nothing runs and the plan is not done"
            start = node.started.pop(0)
            coordinator._apply(ended(start, "failed" if start.task.id == fail else "succeeded"))
            await node.settle()
        statuses = {t.status for t in plan.tasks.values()}
        assert TaskStatus.SKIPPED in statuses if fail else statuses == {TaskStatus.SUCCEEDED}

    try:
        lines = lines_run(lambda: asyncio.run(main()))
    finally:
        store.close()
    return lines, sum(store.queued.values())


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory in memory when the machine has one (every placement is a synced commit)."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(dir=shm, prefix="osup-scaling-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fail", [None, "t0"])
def test_the_coordinator_runs_a_plan_in_linear_work(
    fast_dir: Path, shape: str, fail: str | None
) -> None:
    """BIG tasks cost at most LINEAR x the lines and the bytes written of SMALL tasks."""
    lines_small, bytes_small = run(fast_dir / "small", shape, SMALL, fail)
    lines_big, bytes_big = run(fast_dir / "big", shape, BIG, fail)
    assert lines_big <= LINEAR * lines_small, (lines_small, lines_big, lines_big / lines_small)
    assert bytes_big <= LINEAR * bytes_small, (bytes_small, bytes_big, bytes_big / bytes_small)


def test_a_long_skip_cascade_is_sliced_and_the_loop_serves_meanwhile(fast_dir: Path) -> None:
    """The first task of a 10,000-task fan-out fails: the result's own step skips one slice,
    the rest is skipped in slices a task runs, a callback queued before the result runs while
    the cascade is under way, and the plan ends with every dependent skipped and its final
    record written."""
    store = Counting(fast_dir / "c")

    async def main() -> None:
        store.start()
        node = Shards()
        coordinator = Coordinator()
        coordinator.attach(node, store)  # type: ignore[arg-type]
        coordinator.shards["shard-0"] = ShardView(
            name="shard-0", generation=1, up=True, capacity=LANES
        )
        accepted = await coordinator._submit(f.PlanSpec(name="w", tasks=SHAPES["fan_out"](10_000)))
        assert isinstance(accepted, f.PlanAccepted)
        plan = coordinator.book.plans[accepted.id]
        await node.settle()
        (start,) = node.started
        seen: list[int] = []
        loop = asyncio.get_running_loop()
        loop.call_soon(lambda: seen.append(plan.progress.counts[TaskStatus.SKIPPED]))
        coordinator._apply(ended(start, "failed"))
        assert accepted.id in coordinator.book.settling and not plan.done
        await node.settle()
        assert 0 < seen[0] < 9_999, seen  # the callback ran between two slices
        assert plan.done and plan.progress.counts[TaskStatus.SKIPPED] == 9_999
        assert accepted.id in coordinator.book.final and not coordinator.book.settling

    try:
        asyncio.run(main())
    finally:
        gc.unfreeze()
        store.close()


def test_a_big_plan_is_frozen_out_of_full_collections_when_accepted_and_when_done(
    fast_dir: Path,
) -> None:
    """A plan of FREEZE_TASKS tasks: once accepted, its records are in the GC's permanent
    generation (`gc.freeze`); once it ran to success, so are the attempts its run added."""
    store = Counting(fast_dir / "c")

    def unfrozen(kind: type) -> int:
        return sum(type(o) is kind for o in gc.get_objects())

    async def main() -> None:
        store.start()
        node = Shards()
        coordinator = Coordinator()
        coordinator.attach(node, store)  # type: ignore[arg-type]
        coordinator.shards["shard-0"] = ShardView(
            name="shard-0", generation=1, up=True, capacity=LANES
        )
        spec = f.PlanSpec(name="big", tasks=SHAPES["fan_out"](FREEZE_TASKS))
        accepted = await coordinator._submit(spec)
        assert isinstance(accepted, f.PlanAccepted)
        assert unfrozen(TaskRecord) == 0
        plan = coordinator.book.plans[accepted.id]
        await node.settle()
        while not plan.done:
            coordinator._apply(ended(node.started.pop(0), "succeeded"))
            await node.settle()
        assert unfrozen(Attempt) == 0

    try:
        asyncio.run(main())
    finally:
        gc.unfreeze()
        store.close()


def test_a_big_report_is_built_in_slices() -> None:
    """sliced_report hands the loop back between slices (a slice of 0 s: after every task)
    and gives what plan_report gives."""

    async def main() -> None:
        plan = PlanRecord.new("p", f.PlanSpec(name="p", tasks=SHAPES["chain"](50)), 0.0)
        slicer = Slicer(0.0)
        assert await sliced_report(plan, slicer) == plan_report(plan)
        assert slicer.yields == 50

    asyncio.run(main())

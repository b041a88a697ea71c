"""A retry backoff is waited out on the monotonic clock (`coordinator.backoff`): a wall-clock
step neither fires a retry early nor holds it back; wall time is only what the record stores."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

from orchestra_sup.coordinator.backoff import Backoffs
from orchestra_sup.coordinator.placement import AffinityTicket, ShardView
from orchestra_sup.coordinator.planstore import DBS
from orchestra_sup.coordinator.role import Coordinator
from orchestra_sup.coordinator.runner import PlanRecord
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.frames import FailureClass
from orchestra_sup.state.store import Store
from tests.unit.test_coordinator_scaling import Shards, ended

T0 = 1_700_000_000.0
TICKET = AffinityTicket(shard="shard-0", generation=1, boot="b")


class Clocks:
    """A wall clock and a monotonic clock that tests move by hand."""

    def __init__(self) -> None:
        self.wall_s = T0
        self.mono_s = 500.0

    def wall(self) -> float:
        return self.wall_s

    def monotonic(self) -> float:
        return self.mono_s

    def sleep(self, seconds: float) -> None:
        self.wall_s += seconds
        self.mono_s += seconds


def backing_off(backoff_s: float = 10.0) -> PlanRecord:
    """A plan whose task failed its first attempt at T0 and backs off `backoff_s` seconds."""
    spec = f.PlanSpec(
        name="p", tasks=[f.TaskSpec(id="a", run="false", retries=2, backoff_s=backoff_s)]
    )
    plan = PlanRecord.new("p1", spec, submitted_at=T0)
    plan.place(spec.tasks[0], TICKET, T0)
    plan.fail("a", FailureClass.TOOL_FAILURE, "exited with status 1", T0)
    assert plan.tasks["a"].retry_at == T0 + backoff_s  # stored as wall time
    return plan


def test_a_backoff_ends_when_the_monotonic_clock_says_so() -> None:
    clocks = Clocks()
    backoffs = Backoffs(wall=clocks.wall, monotonic=clocks.monotonic)
    plan = backing_off(10.0)
    assert backoffs.holds("p1", "a", T0 + 10.0, clocks.monotonic())
    assert backoffs.wake_in([plan], clocks.monotonic()) == 10.0
    clocks.sleep(9.0)
    assert backoffs.holds("p1", "a", T0 + 10.0, clocks.monotonic())
    assert backoffs.wake_in([plan], clocks.monotonic()) == 1.0
    clocks.sleep(1.0)
    assert not backoffs.holds("p1", "a", T0 + 10.0, clocks.monotonic())
    assert backoffs.wake_in([plan], clocks.monotonic()) is None


def test_a_wall_clock_step_forward_does_not_fire_a_retry() -> None:
    clocks = Clocks()
    backoffs = Backoffs(wall=clocks.wall, monotonic=clocks.monotonic)
    plan = backing_off(10.0)
    assert backoffs.wake_in([plan], clocks.monotonic()) == 10.0
    clocks.wall_s += 3600.0  # an operator's `date`, an NTP step
    clocks.mono_s += 1.0
    assert backoffs.holds("p1", "a", T0 + 10.0, clocks.monotonic())
    assert backoffs.wake_in([plan], clocks.monotonic()) == 9.0


def test_a_wall_clock_step_back_does_not_delay_a_retry() -> None:
    clocks = Clocks()
    backoffs = Backoffs(wall=clocks.wall, monotonic=clocks.monotonic)
    plan = backing_off(10.0)
    assert backoffs.holds("p1", "a", T0 + 10.0, clocks.monotonic())
    clocks.wall_s -= 3600.0
    clocks.mono_s += 10.0
    assert not backoffs.holds("p1", "a", T0 + 10.0, clocks.monotonic())
    assert backoffs.wake_in([plan], clocks.monotonic()) is None


def test_a_new_backoff_of_the_same_task_is_read_again() -> None:
    """A later failure sets a new `retry_at`: it is read onto the monotonic clock afresh; one
    no longer waited on is forgotten."""
    clocks = Clocks()
    backoffs = Backoffs(wall=clocks.wall, monotonic=clocks.monotonic)
    plan = backing_off(10.0)
    assert backoffs.wake_in([plan], clocks.monotonic()) == 10.0
    clocks.sleep(30.0)
    # a second failure's, 30 s ahead:
    assert backoffs.holds("p1", "a", T0 + 60.0, clocks.monotonic())
    assert backoffs.wake_in([], clocks.monotonic()) is None


@contextlib.asynccontextmanager
async def failed_once(
    tmp_path: Path, clocks: Clocks, backoff_s: float
) -> AsyncIterator[tuple[Coordinator, Shards]]:
    """A coordinator with one shard of room, its backoffs on `clocks`, whose one task (one
    retry, `backoff_s` seconds of backoff) has just failed its first attempt: the pump that
    failure ran has seen the backoff."""
    store = Store(tmp_path / "coordinator", ["inbox", *DBS])
    store.start()
    try:
        node = Shards()
        coordinator = Coordinator()
        coordinator.attach(node, store)  # type: ignore[arg-type]
        assert coordinator.placer is not None
        clocks.wall_s = time.time()  # the runner stores what the system's clock says
        coordinator.placer.backoffs = Backoffs(wall=clocks.wall, monotonic=clocks.monotonic)
        coordinator.shards["shard-0"] = ShardView(name="shard-0", generation=1, up=True, capacity=8)
        task = f.TaskSpec(id="a", run="false", retries=1, backoff_s=backoff_s)
        accepted = await coordinator._submit(f.PlanSpec(name="p", tasks=[task]))
        assert isinstance(accepted, f.PlanAccepted)
        await node.settle()
        clocks.wall_s = time.time()
        coordinator._apply(ended(node.started.pop(0), "failed"))  # pumps: it backs off
        yield coordinator, node
    finally:
        store.close()


def test_the_coordinator_retries_on_the_monotonic_clock(tmp_path: Path) -> None:
    """Through the coordinator: a failed lane's retry is not placed when the wall clock jumps an
    hour ahead, and is once the monotonic clock has passed its backoff."""

    async def main() -> list[int]:
        clocks = Clocks()
        async with failed_once(tmp_path, clocks, backoff_s=30.0) as (coordinator, node):
            await node.settle()
            attempts = [len(node.started)]
            clocks.wall_s += 3600.0
            coordinator._pump()
            await node.settle()
            attempts.append(len(node.started))
            clocks.mono_s += 31.0  # the backoff, and the time the test took since its start
            coordinator._pump()
            await node.settle()
            attempts.append(len(node.started))
            return attempts

    assert asyncio.run(main()) == [0, 0, 1]


class Ticking(Clocks):
    """A monotonic clock that moves `step` seconds at every reading: a coordinator preempted
    between any two reads, as on a loaded machine."""

    def __init__(self, step: float) -> None:
        super().__init__()
        self.step = step

    def monotonic(self) -> float:
        self.mono_s += self.step
        return self.mono_s


def test_a_backoff_that_ends_while_the_pump_runs_still_wakes_a_pump(tmp_path: Path) -> None:
    """The pump that finds a task backing off sets the wake-up that places it, even when the
    backoff ends before the pump is through (seen in CI: a 0.05 s retry never placed, the plan
    never done). The clock moves 1 s at every reading here, past the 0.5 s backoff."""

    async def main() -> int:
        async with failed_once(tmp_path, Ticking(step=1.0), backoff_s=0.5) as (_, node):
            deadline = time.monotonic() + 10.0
            while not node.started and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # nothing but the wake-up may pump now
            await node.settle()
            return len(node.started)

    assert asyncio.run(main()) == 1

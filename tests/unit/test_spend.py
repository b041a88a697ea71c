"""What a lane spends and when it has spent its grant: the meter's clock (held while a human is
asked), CPU counted per command, the one-line reasons, the shard's watch, and lane states."""

from __future__ import annotations

import asyncio

import pytest

from orchestra_sup.protocol import frames as f
from orchestra_sup.shards.lane import FINAL, TRANSITIONS, Lane, LaneState
from orchestra_sup.shards.spend import BudgetWatch, Meter, overspent


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_wall_time_counts_earlier_generations_and_not_the_waits_for_a_human() -> None:
    """A meter resumed from 2 s goes on from there; 5 s held for an answer do not count."""
    clock = Clock()
    meter = Meter(f.Spend(wall_s=2.0, cpu_s=0.5, output_bytes=10), clock)
    clock.now += 1.0
    meter.hold()
    clock.now += 5.0
    assert meter.wall_s() == pytest.approx(3.0)
    assert meter.release() == pytest.approx(5.0)
    assert meter.release() == 0.0
    clock.now += 1.0
    assert meter.spent() == f.Spend(wall_s=4.0, cpu_s=0.5, output_bytes=10)


def test_cpu_counts_each_command_once_it_ends_and_the_running_one_live() -> None:
    meter = Meter()
    used = [0.25]
    meter.command(lambda: used[0])
    assert meter.cpu_s() == 0.25
    used[0] = 1.0
    meter.command_ended()
    used[0] = 99.0  # the probe is not asked again
    meter.command(lambda: 0.5)
    assert meter.cpu_s() == 1.5


@pytest.mark.parametrize(
    ("grant", "spent", "reason"),
    [
        (f.Budget(), f.Spend(wall_s=1e9, cpu_s=1e9, output_bytes=10**12), None),
        (f.Budget(cpu_s=2.0), f.Spend(cpu_s=2.0), None),
        (f.Budget(cpu_s=2.0), f.Spend(cpu_s=2.031), "budget exhausted: cpu_s 2.03 of 2 s used"),
        (f.Budget(wall_s=1.5), f.Spend(wall_s=1.6), "budget exhausted: wall_s 1.60 of 1.5 s used"),
        (f.Budget(output_bytes=100), f.Spend(output_bytes=100), None),
        (
            f.Budget(output_bytes=0),
            f.Spend(output_bytes=1),
            "budget exhausted: output_bytes 1 of 0 bytes used",
        ),
    ],
)
def test_a_lane_has_spent_its_grant_once_it_used_more(
    grant: f.Budget, spent: f.Spend, reason: str | None
) -> None:
    assert overspent(grant, spent) == reason


def test_the_watch_stops_an_overspending_lane_once_and_forgets_it() -> None:
    """Output is checked at once, on the chunk that overspends; wall time on the next tick; a
    lane stopped is watched no more, and the ticker ends with the last watched lane."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stopped: list[tuple[str, str]] = []
        watch = BudgetWatch(loop.create_task)
        chatty, slow = Meter(), Meter(f.Spend(wall_s=10.0))
        watch.watch("chatty", f.Budget(output_bytes=4), chatty, lambda r: stopped.append(("c", r)))
        watch.watch("slow", f.Budget(wall_s=1.0), slow, lambda r: stopped.append(("s", r)))
        chatty.output_bytes = 4
        watch.check_output("chatty")
        assert stopped == []
        chatty.output_bytes = 5
        watch.check_output("chatty")
        watch.check_output("chatty")
        assert stopped == [("c", "budget exhausted: output_bytes 5 of 4 bytes used")]
        task = watch._task
        assert task is not None
        async with asyncio.timeout(5):
            await task  # the slow lane is stopped on a tick; then nothing is watched
        assert [who for who, _ in stopped] == ["c", "s"]

    asyncio.run(main())


def test_lane_states_change_only_along_the_table() -> None:
    """awaiting_approval is entered from running and left to running, moving or an end; an
    ended lane goes nowhere."""
    lane = Lane(f.LaneStart(lane="L", plan="p", task=f.TaskSpec(id="t", run="", program="m:C")))
    assert lane.state is LaneState.STARTING
    with pytest.raises(ValueError, match="no transition"):
        lane.enter(LaneState.AWAITING_APPROVAL)
    lane.enter(LaneState.RUNNING)
    lane.enter(LaneState.AWAITING_APPROVAL)
    lane.enter(LaneState.RUNNING)
    lane.enter(LaneState.CANCELLED)
    assert all(not TRANSITIONS[state] for state in FINAL)
    with pytest.raises(ValueError, match="no transition"):
        lane.enter(LaneState.RUNNING)

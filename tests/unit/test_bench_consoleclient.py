"""`bench.consoleclient`'s bookkeeping: a seq out of turn counted as a gap or a repeat, and a
plan's GETs coalesced to one in flight and one more (the consoles' request rate is a figure of
`bench console`, so it must be what the module says)."""

from __future__ import annotations

import asyncio
from typing import Any

from orchestra_sup.bench.consoleclient import Console, Window


def _console(since: int = 10) -> Console:
    return Console(session=None, url="http://x/v1/", since=since, window=Window())  # type: ignore[arg-type]


def _event(seq: int, kind: str = "child.running", plan: str = "") -> dict[str, Any]:
    return {"seq": seq, "at": 0.0, "kind": kind, "plan": plan}


def test_seqs_out_of_turn_are_gaps_or_repeats() -> None:
    console = _console(since=10)
    for seq in (11, 12, 14, 14, 13, 15):
        console.message(_event(seq), 1.0)
    console.message({"status": "not a log event"}, 1.0)
    assert (console.gaps, console.repeats, console.other) == (1, 2, 1)
    assert (console.first, console.last) == (11, 15)


def test_only_the_window_counts_events_and_their_lag() -> None:
    console = _console(since=0)
    console.message(_event(1), 5.0)
    console.window.open = True
    console.message({**_event(2), "at": 4.75}, 5.0)
    assert console.window.events == 1 and console.window.lags_ms == [250.0]


def test_a_plans_gets_are_one_in_flight_and_one_more() -> None:
    """Events of a plan before its GET is sent are covered by it; five while it is in flight
    make one more GET, not five."""

    async def scenario() -> list[str]:
        console = _console(since=0)
        gets: list[str] = []
        answer = asyncio.Event()

        async def get(what: str, path: str) -> None:
            gets.append(path)
            await answer.wait()

        console.get = get  # type: ignore[method-assign]
        console.message(_event(1, "task.running", "p1"), 1.0)
        console.message(_event(2, "task.running", "p1"), 1.0)  # before it is sent: covered
        await asyncio.sleep(0)
        assert gets == ["plans/p1"]
        for seq in range(3, 8):
            console.message(_event(seq, "task.running", "p1"), 1.0)
        answer.set()
        await asyncio.gather(*console.tasks)
        assert console.again == {}
        return gets

    assert asyncio.run(scenario()) == ["plans/p1", "plans/p1"]

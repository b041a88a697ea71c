"""Coordinator programs the seat's tests run (listed in their trees' `[coordinator] programs`).

They use only the contract (`coordinator.context`), as a platform's own program would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any


class Squares:
    """Starts one lane per number in `args["numbers"]` (each prints its square) and returns the
    sum of what they printed: a value computed from the lanes' outputs."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.numbers = [int(n) for n in args["numbers"]]

    async def run(self, ctx: Any) -> Any:
        lanes = [await ctx.tools.start_lane(run=f"echo $(({n} * {n}))") for n in self.numbers]
        outcomes = [await ctx.wait(lane) for lane in lanes]
        if any(o["status"] != "succeeded" for o in outcomes):
            return ctx.failure("a lane failed")
        return {"sum": sum(int(o["output_tail"]) for o in outcomes), "lanes": len(lanes)}


class Inbox:
    """Echoes operator messages: each "message" event is answered by a lane that prints it, and
    the session checkpoints only after every second message (so a restart between two redelivers
    the first). Ends on the message "stop", returning every message it handled, in order, with
    the run it was handled in (`ctx.resumed` counts runs)."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.marker = Path(args["marker"])

    async def run(self, ctx: Any) -> Any:
        state = ctx.resumed or {"handled": [], "runs": 0}
        state["runs"] += 1
        pending: list[str] = []
        async for event in ctx.events():
            if event.kind != "message":
                continue
            if event.text == "stop":
                return state
            lane = await ctx.tools.start_lane(run=f"echo {event.text}")
            await ctx.wait(lane)
            pending.append(event.text)
            self.marker.write_text(f"{state['runs']} {' '.join(state['handled'] + pending)}\n")
            if len(pending) == 2:
                state["handled"] += pending
                pending = []
                await ctx.checkpoint(state)
        return state


class Blocks:
    """On its first run, blocks the coordinator's loop for `args["block_s"]` seconds after its
    first checkpoint; resumed, it starts one lane and returns its output."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.block_s = float(args["block_s"])

    async def run(self, ctx: Any) -> Any:
        if ctx.resumed is None:
            await ctx.checkpoint({"blocked": True})
            time.sleep(self.block_s)  # the mistake this program exists to make
        lane = await ctx.tools.start_lane(run="echo resumed")
        return (await ctx.wait(lane))["output_tail"].strip()


class Wedges:
    """Blocks the coordinator's loop at every run, before any checkpoint."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.block_s = float(args["block_s"])

    async def run(self, ctx: Any) -> Any:
        time.sleep(self.block_s)
        return "never"


class Returns:
    """Returns `args["kind"]` of value: a set, bytes or NaN, none of them JSON."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.kind = args["kind"]

    async def run(self, ctx: Any) -> Any:
        return {"set": {1, 2}, "bytes": b"abc", "nan": float("nan")}[self.kind]


class Waits:
    """Starts one lane that sleeps for a minute and waits for it."""

    def __init__(self, args: dict[str, Any]) -> None:
        pass

    async def run(self, ctx: Any) -> Any:
        return await ctx.wait(await ctx.tools.start_lane(run="sleep 60"))


class Exits:
    """Leaves as a program must not: `args["kind"]` is "sys_exit", "keyboard", "base",
    "cancelled" (each raised from `run`) or "os_exit" (the process ends at once)."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.kind = args["kind"]

    async def run(self, ctx: Any) -> Any:
        if self.kind == "os_exit":
            os._exit(7)
        raise {
            "sys_exit": SystemExit(3),
            "keyboard": KeyboardInterrupt(),
            "base": BaseException("boom"),
            "cancelled": asyncio.CancelledError(),
        }[self.kind]


class Keys:
    """Gives a start the key "0.1", shaped like the next call's own effect id, then starts
    another lane without a key: two lanes, and the first key again with another command is
    refused."""

    def __init__(self, args: dict[str, Any]) -> None:
        pass

    async def run(self, ctx: Any) -> Any:
        a = await ctx.wait(await ctx.tools.start_lane(run="echo A", key="0.1"))
        b = await ctx.wait(await ctx.tools.start_lane(run="echo B"))
        try:
            await ctx.tools.start_lane(run="echo C", key="0.1")
        except Exception as exc:
            refused = str(exc)
        return {"a": a["output_tail"], "b": b["output_tail"], "refused": refused}


class Overspends:
    """Starts `sleep 2` lanes at once until one is refused; answers how many started and the
    refusal. With a session budget of wall_s = 3, the first lane holds all of it."""

    def __init__(self, args: dict[str, Any]) -> None:
        pass

    async def run(self, ctx: Any) -> Any:
        started = []
        try:
            for _ in range(6):
                started.append(await ctx.tools.start_lane(run="sleep 2"))
        except Exception as exc:
            refused = str(exc)
        for lane in started:
            await ctx.wait(lane)
        return {"started": len(started), "refused": refused}


class Rereads:
    """Reads one event, leaves the loop with `break`, and reads on with a new loop at once."""

    def __init__(self, args: dict[str, Any]) -> None:
        pass

    async def run(self, ctx: Any) -> Any:
        texts = []
        async for event in ctx.events():
            texts.append(event.text)
            break
        async for event in ctx.events():
            texts.append(event.text)
            if len(texts) == 2:
                break
        return texts


class Notes:
    """Starts a lane whose program tells the coordinator notes (`args["lane_program"]`), reads its
    inbox until a "note" event, cancels the lane and answers the note."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.program = args["lane_program"]

    async def run(self, ctx: Any) -> Any:
        await ctx.tools.start_lane(program=self.program, run="3")
        async for event in ctx.events():
            if event.kind == "note":
                await ctx.tools.cancel_lane(lane=event.lane)
                return {"text": event.text, "lane": event.lane}
        return None


class Gathers:
    """Makes four `sleep 2` starts at once; answers how many started and the refusals."""

    def __init__(self, args: dict[str, Any]) -> None:
        pass

    async def run(self, ctx: Any) -> Any:
        starts = [ctx.tools.start_lane(run="sleep 2") for _ in range(4)]
        done = await asyncio.gather(*starts, return_exceptions=True)
        started = [d for d in done if not isinstance(d, BaseException)]
        for lane in started:
            await ctx.wait(lane)
        refused = [str(d) for d in done if isinstance(d, BaseException)]
        return {"started": len(started), "refused": refused}


class Stubborn:
    """Starts a lane, swallows the cancellation of its wait, then returns "won"."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.marker = Path(args["marker"])

    async def run(self, ctx: Any) -> Any:
        await ctx.tools.start_lane(run="sleep 60")
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
        self.marker.touch()
        return {"won": True}


class Many:
    """Starts `args["n"]` lanes of `sleep 60` and waits for them."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.n = int(args["n"])

    async def run(self, ctx: Any) -> Any:
        lanes = [await ctx.tools.start_lane(run="sleep 60") for _ in range(self.n)]
        return [await ctx.wait(lane) for lane in lanes]


class Busy:
    """Starts one lane, then keeps the loop busy in short steps (each some milliseconds of CPU)
    until the file `args["stop"]` exists."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.stop = Path(args["stop"])

    async def run(self, ctx: Any) -> Any:
        await ctx.tools.start_lane(run="true")
        while not self.stop.exists():
            sum(range(100_000))
            await asyncio.sleep(0)
        return "stopped"


class Raises:
    """Fails its plan by raising."""

    def __init__(self, args: dict[str, Any]) -> None:
        pass

    async def run(self, ctx: Any) -> Any:
        raise RuntimeError("the program gave up")


class Asks:
    """Asks a human, and returns the answer's verdict and text."""

    def __init__(self, args: dict[str, Any]) -> None:
        pass

    async def run(self, ctx: Any) -> Any:
        answer = await ctx.ask_human("ship it?")
        return {"verdict": answer["verdict"], "text": answer["text"]}


def write_pid(marker: Path) -> None:
    """This process's pid into `marker`, whole or not at all (written aside, then renamed): a
    test that waits for the file to exist reads the pid, never the empty file `write_text`
    leaves between its open and its write."""
    aside = marker.with_name(marker.name + ".part")
    aside.write_text(str(os.getpid()))
    os.replace(aside, marker)


class Spins:
    """Writes its process's pid to `args["marker"]`, then spins on the coordinator's loop without
    ever blocking: a runaway, which in real time holds its CPU until RLIMIT_RTTIME stops it."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.marker = Path(args["marker"])

    async def run(self, ctx: Any) -> Any:
        write_pid(self.marker)
        while True:  # the mistake this program exists to make
            pass


class Hogs:
    """Like `Spins`, but blocks for 0.1 ms every 50 ms (each block starts RLIMIT_RTTIME's
    count again): it holds its CPU all the same, and only the real-time guard sees it."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.marker = Path(args["marker"])

    async def run(self, ctx: Any) -> Any:
        write_pid(self.marker)
        while True:
            end = time.monotonic() + 0.05
            while time.monotonic() < end:
                pass
            time.sleep(0.0001)  # a real block (10 µs would not be: the timer fires first)

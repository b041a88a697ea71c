"""`fanout`: one lane per command of a list, then one reduce lane fed all their outputs.

Args (the plan's `[args]`):
    runs: the shell commands, one lane each (a list of 1 to `MAX_RUNS` strings; required).
    reduce: the shell command of the reduce lane, which reads the runs' outputs from
        `$ORCHESTRA_FEEDBACK` (a string; required).
    rev: the workspace revision every lane's sandbox is made at (a sha, a branch, `HEAD~3`;
        default: the head when each lane starts).

Rounds:
    1. Start one lane per run, in the list's order, and wait for them all. A run that fails is
       an output like any other: the reduce lane judges. Checkpoint their outputs.
    2. Start the reduce lane with `feedback=` the JSON list [{"run", "status",
       "output_tail"}] in the runs' order, and wait for it.
    A session restarted during round 1 replays its starts, which answer the lanes already
    started (their effect ids); one restarted during round 2 starts from round 1's checkpoint.

Result: {"outputs": [{"run", "lane", "status", "exit_code", "output_tail"}, ...] in the runs'
order, "reduce": {"status", "exit_code", "output_tail"}}. Output tails (each a lane's last 4 KiB)
are cut, keeping their ends, so that the feedback fits the 64 KiB `start_lane` takes
(`plantask.MAX_FEEDBACK_BYTES`) and the outputs half of `RESULT_MAX_BYTES`; commands are cut too,
keeping their starts, when theirs alone would not.

Fails the plan when the reduce lane does not succeed: "reduce lane L failed (exit 1): <its last
line of output>".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from orchestra_sup.coordinator.context import RESULT_MAX_BYTES, Context, Failure
from orchestra_sup.coordinator.plantask import MAX_FEEDBACK_BYTES
from orchestra_sup.coordinator.programs.args import Args
from orchestra_sup.coordinator.programs.lanes import ended, summary

__all__ = ["Fanout"]

MAX_RUNS = 1000
"""The most commands `runs` may hold."""


def _largest(fits: Callable[[int], bool], most: int) -> int:
    """The largest n in 0..`most` with `fits(n)`, for a `fits` true up to some n and false
    after it; 0 when none fits."""
    low, high = 0, most
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def fit(entries: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """`entries` (each with "run" and "output_tail") with every output tail cut to its last c
    characters for the largest c that makes their JSON at most `limit` bytes, and, when even
    empty tails are too many, every "run" cut to its first r characters likewise. Each try
    encodes them all (a fan-out of 1000 lanes' 4 KiB tails: some 4 MB, a dozen times), so the
    program runs it in a thread, off the coordinator's loop."""

    def cut(tail: int, run: int) -> list[dict[str, Any]]:
        return [
            {**e, "run": e["run"][:run], "output_tail": e["output_tail"][-tail:] if tail else ""}
            for e in entries
        ]

    def size(tail: int, run: int) -> int:
        return len(json.dumps(cut(tail, run), ensure_ascii=False).encode())

    longest_run = max(len(e["run"]) for e in entries)
    longest_tail = max(len(e["output_tail"]) for e in entries)
    if size(longest_tail, longest_run) <= limit:
        return entries
    tail = _largest(lambda n: size(n, longest_run) <= limit, longest_tail)
    if tail or size(0, longest_run) <= limit:
        return cut(tail, longest_run)
    return cut(0, _largest(lambda n: size(0, n) <= limit, longest_run))


class Fanout:
    """The `fanout` coordinator program (see the module docstring). Raises `ValueError` naming
    the arg at fault."""

    def __init__(self, args: dict[str, Any]) -> None:
        table = Args("fanout", args, required=("runs", "reduce"), optional=("rev",))
        self.runs = table.commands("runs", most=MAX_RUNS)
        self.reduce = table.command("reduce")
        self.rev = table.revision("rev") if table.given("rev") else None

    async def run(self, ctx: Context) -> dict[str, Any] | Failure:
        if ctx.resumed is None:
            lanes = [await ctx.tools.start_lane(run=run, rev=self.rev) for run in self.runs]
            outputs = []
            for run, lane in zip(self.runs, lanes, strict=True):
                outcome = await ctx.wait(lane)
                outputs.append({"run": run, "lane": outcome["lane"], **summary(outcome)})
            outputs = await asyncio.to_thread(fit, outputs, RESULT_MAX_BYTES // 2)
            await ctx.checkpoint({"outputs": outputs})
        else:
            outputs = ctx.resumed["outputs"]
        fed = [{k: o[k] for k in ("run", "status", "output_tail")} for o in outputs]
        feedback = await asyncio.to_thread(fit, fed, MAX_FEEDBACK_BYTES)
        lane = await ctx.tools.start_lane(
            run=self.reduce, rev=self.rev, feedback=json.dumps(feedback, ensure_ascii=False)
        )
        outcome = await ctx.wait(lane)
        if outcome["status"] != "succeeded":
            return ctx.failure(f"reduce {ended(outcome)}")
        return {"outputs": outputs, "reduce": summary(outcome)}

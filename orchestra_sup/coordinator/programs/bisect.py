"""`bisect`: find the first revision at which a check command fails, between a good revision
and a bad one, testing `parallel` revisions per round in parallel lanes (k-ary bisection).

Args (the plan's `[args]`):
    good: a revision the check passes at (a sha, a branch, a tag, `HEAD~20`; required).
    bad: a later revision it fails at, descending from `good` (required).
    check: the shell command run in a sandbox made at each tested revision: exit 0 is good, 125
        skips the revision (it cannot be tested, as `git bisect run` takes it), any other exit
        code is bad (a string; required).
    parallel: k, the revisions tested per round (an integer, 1 to `MAX_PARALLEL`; default 3).

The candidates are the commits after `good` up to `bad` included: the custodian's `log` from
`bad` (newest first, at most `MAX_CANDIDATES`) down to `good`, which on a linear history is
`bad`'s first-parent chain. `good` and `bad` are taken as given, not tested: `bad` is the answer
when every revision before it is good.

Rounds:
    0. List the candidates; checkpoint them.
    1, 2, ...: the first bad revision is one of an interval of the candidates (all n at first).
       Start one lane per revision of k evenly spaced in it (`start_lane(run=check, rev=sha)`),
       all before waiting for any, and narrow the interval to the part after the last good one
       before the first bad one, up to that bad one: each round leaves one part of k + 1, so
       n candidates take ceil(log_{k+1}(n)) rounds. Checkpoint the interval and what was
       tested. A restarted session starts the round after its last checkpoint; a round it
       replays answers the lanes it started already (their effect ids), so no revision is
       tested twice. A skipped revision narrows nothing and is not picked again.

Result: {"first_bad": its full sha, "tested": [{"rev": full sha, "status": "good", "bad" or
"skip", "round": n}, ...] in the order tested, "rounds": the rounds taken, "candidates": n}.

Fails the plan when `good` or `bad` names no commit, when `good` is not among the
`MAX_CANDIDATES` newest commits reaching `bad` (or is `bad`), when a check lane ends without an
exit code ("check at <sha> did not finish: lane L cancelled: ..."), and when only skipped
revisions are left beside the answer ("the first bad revision is one of <sha> ...: the others
skipped").
"""

from __future__ import annotations

from typing import Any

from orchestra_sup.coordinator.context import Context, Failure
from orchestra_sup.coordinator.programs.args import Args
from orchestra_sup.coordinator.programs.lanes import ended
from orchestra_sup.errors import RemoteError

__all__ = ["Bisect"]

MAX_PARALLEL = 32
"""The largest `parallel`."""
DEFAULT_PARALLEL = 3
"""`parallel` when the plan gives none."""
MAX_CANDIDATES = 1000
"""The most commits bisected: the largest `limit` the custodian's `log` takes."""
SKIP_EXIT = 125
"""The check's exit code for a revision that cannot be tested."""


class Bisect:
    """The `bisect` coordinator program (see the module docstring). Raises `ValueError` naming
    the arg at fault."""

    def __init__(self, args: dict[str, Any]) -> None:
        table = Args("bisect", args, required=("good", "bad", "check"), optional=("parallel",))
        self.good = table.revision("good")
        self.bad = table.revision("bad")
        self.check = table.command("check")
        self.parallel = table.count(
            "parallel", default=DEFAULT_PARALLEL, least=1, most=MAX_PARALLEL
        )

    async def run(self, ctx: Context) -> dict[str, Any] | Failure:
        state = ctx.resumed
        if state is None:
            try:
                state = await self._candidates(ctx)
            except (RemoteError, LookupError) as exc:
                return ctx.failure(f"bisect {self.good}..{self.bad}: {exc}")
            await ctx.checkpoint(state)
        candidates: list[str] = state["candidates"]
        while picks := _picks(state, self.parallel):
            round_ = state["rounds"] + 1
            lanes = [await ctx.tools.start_lane(run=self.check, rev=candidates[i]) for i in picks]
            verdicts = []
            for i, lane in zip(picks, lanes, strict=True):
                outcome = await ctx.wait(lane)
                if outcome.get("exit_code") is None:
                    return ctx.failure(f"check at {candidates[i]} did not finish: {ended(outcome)}")
                verdicts.append(_verdict(outcome["exit_code"]))
            state = _narrowed(state, picks, verdicts, round_)
            await ctx.checkpoint(state)
        low, high = state["low"], state["high"]
        if low < high:
            shown = ", ".join(candidates[low : high + 1])
            return ctx.failure(f"the first bad revision is one of {shown}: the others skipped")
        return {
            "first_bad": candidates[high],
            "tested": state["tested"],
            "rounds": state["rounds"],
            "candidates": len(candidates),
        }

    async def _candidates(self, ctx: Context) -> dict[str, Any]:
        """Round 0's state: the candidates oldest first, the whole of them the interval.
        Raises `RemoteError` for a revision that names no commit, `LookupError` when `good` is
        not found below `bad`."""
        good = (await ctx.tools.log(rev=self.good, limit=1))["commits"][0]["sha"]
        newest_first = []
        for commit in (await ctx.tools.log(rev=self.bad, limit=MAX_CANDIDATES))["commits"]:
            if commit["sha"] == good:
                break
            newest_first.append(commit["sha"])
        else:
            raise LookupError(f"good is not among the {MAX_CANDIDATES} newest commits reaching bad")
        if not newest_first:
            raise LookupError("good and bad are the same commit")
        candidates = newest_first[::-1]
        return {
            "candidates": candidates,
            "low": 0,
            "high": len(candidates) - 1,
            "tested": [],
            "rounds": 0,
        }


def _verdict(exit_code: int) -> str:
    """A check's exit code as "good", "skip" or "bad"."""
    return "good" if exit_code == 0 else "skip" if exit_code == SKIP_EXIT else "bad"


def _picks(state: dict[str, Any], parallel: int) -> list[int]:
    """The candidates (indices, ascending) the next round tests: at most `parallel`, splitting
    the interval's untested candidates and its end (the bad one it ends at) into as many parts
    plus one, as even as they come, each pick the last of its part. [] when the interval holds
    nothing more to test."""
    candidates, low, high = state["candidates"], state["low"], state["high"]
    tried = {t["rev"] for t in state["tested"]}
    open_ = [i for i in range(low, high) if candidates[i] not in tried] + [high]
    parts = min(parallel, len(open_) - 1) + 1
    picks, end = [], 0
    for part in range(parts - 1):
        end += len(open_) // parts + (part < len(open_) % parts)
        picks.append(open_[end - 1])
    return picks


def _narrowed(
    state: dict[str, Any], picks: list[int], verdicts: list[str], round_: int
) -> dict[str, Any]:
    """`state` after round `round_` tested `picks` with `verdicts`: the interval starts after
    the last good pick before the first bad one and ends at that bad one (or where it ended)."""
    low, high = state["low"], state["high"]
    for i, verdict in zip(picks, verdicts, strict=True):
        if verdict == "bad":
            high = i
            break
        if verdict == "good":
            low = i + 1
    tested = [
        {"rev": state["candidates"][i], "status": verdict, "round": round_}
        for i, verdict in zip(picks, verdicts, strict=True)
    ]
    return {
        **state,
        "low": low,
        "high": high,
        "tested": state["tested"] + tested,
        "rounds": round_,
    }

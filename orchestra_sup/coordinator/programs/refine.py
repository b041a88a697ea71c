"""`refine`: run a command that changes the workspace, judge it with a check command, and run
it again with the check's output as feedback until the check passes or the rounds or the
budget end (evaluate-and-refine).

Args (the plan's `[args]`):
    run: the shell command that makes a change; its lane commits what it changed
        (`commit=true`), and from round 2 it reads the last check's output from
        `$ORCHESTRA_FEEDBACK` (a string; required).
    check: the shell command that judges: exit 0 passes (a string; required).
    max_rounds: the most rounds (an integer, 1 to `MAX_ROUNDS`; default 5).

Rounds, each:
    1. A `run` lane, `commit=true`, with `feedback=` the last check's output tail (none in
       round 1); wait for it. One that fails still goes to the check, which judges what the
       workspace holds.
    2. A `check` lane at `rev=` the run lane's commit, or at the workspace's head (`log`) when
       it made none; wait for it. A pass ends the session.
    3. Checkpoint the round and the check's output: a restarted session starts the next round.

Result, when a check passes: {"rounds": n, "commit": the full sha the passing check ran at (the
run lane's commit, or the head), "check_output": its output tail}.

Fails the plan when `max_rounds` rounds end without a pass ("check still fails after 5
rounds: <the last check's last line of output>"), or when the session's budget refuses the next
lane ("budget spent after 2 rounds (<why>): <the last check's last line>").
"""

from __future__ import annotations

from typing import Any

from orchestra_sup.coordinator.context import Context, Failure
from orchestra_sup.coordinator.programs.args import Args
from orchestra_sup.coordinator.programs.lanes import last_line
from orchestra_sup.errors import ErrorCode, RemoteError

__all__ = ["Refine"]

MAX_ROUNDS = 100
"""The largest `max_rounds`."""
DEFAULT_ROUNDS = 5
"""`max_rounds` when the plan gives none."""


class Refine:
    """The `refine` coordinator program (see the module docstring). Raises `ValueError` naming
    the arg at fault."""

    def __init__(self, args: dict[str, Any]) -> None:
        table = Args("refine", args, required=("run", "check"), optional=("max_rounds",))
        self.run_command = table.command("run")
        self.check = table.command("check")
        self.max_rounds = table.count(
            "max_rounds", default=DEFAULT_ROUNDS, least=1, most=MAX_ROUNDS
        )

    async def run(self, ctx: Context) -> dict[str, Any] | Failure:
        done, feedback = (0, None) if ctx.resumed is None else ctx.resumed
        for round_ in range(done + 1, self.max_rounds + 1):
            try:
                made = await ctx.wait(
                    await ctx.tools.start_lane(run=self.run_command, commit=True, feedback=feedback)
                )
                rev = made.get("commit") or (await ctx.tools.log(limit=1))["commits"][0]["sha"]
                judged = await ctx.wait(await ctx.tools.start_lane(run=self.check, rev=rev))
            except RemoteError as exc:
                if exc.code != ErrorCode.FORBIDDEN:
                    raise
                return ctx.failure(
                    f"budget spent after {round_ - 1} rounds ({exc.message}): {_said(feedback)}"
                )
            rev = judged.get("rev") or rev  # a replayed start answers the lane it started first
            feedback = judged.get("output_tail") or ""
            if judged["status"] == "succeeded":
                return {"rounds": round_, "commit": rev, "check_output": feedback}
            await ctx.checkpoint([round_, feedback])
        return ctx.failure(f"check still fails after {self.max_rounds} rounds: {_said(feedback)}")


def _said(check_output: str | None) -> str:
    """The last check's verdict line, for a failure's text."""
    if check_output is None:
        return "no check ran"
    return last_line(check_output) or "the check printed nothing"

# A lane program that reviews what a command prints, and asks a human before it publishes.
#
# The shard imports this file, so put `examples` on PYTHONPATH and list the program in the
# config's `[lanes] programs` (examples/review.config.toml does). From the repository root:
#
#   PYTHONPATH=examples orchestra-sup start --workspace . --config examples/review.config.toml &
#   orchestra-sup ctl submit examples/review.toml --wait
#
# While it waits, in another terminal:
#
#   orchestra-sup ctl lanes                   # the lane awaiting approval, and its question
#   orchestra-sup ctl approve LANE            # publish; or, with the reason as feedback:
#   orchestra-sup ctl reject LANE --reason "also list the authors"
#
# (`orchestra-sup run examples/review.toml --config examples/review.config.toml --workspace .`
# with the same PYTHONPATH does it in one go, on a private tree whose run directory it prints
# on stderr first: pass that directory to `ctl --run-dir` to answer.)
"""`Review`: run the task's command in the sandbox, summarise its output, ask a human whether
to publish the summary, then write it to REVIEW.md (the task commits it: the irreversible step).

A rejection fails the attempt as a `quality_miss` with the human's reason, which the coordinator
gives the next attempt as `feedback`; the program then says what it revises. The checkpoint
after the review means a rollover while it waits does not run the command again.
"""

from __future__ import annotations

import shlex

from orchestra_sup.protocol.frames import FailureClass
from orchestra_sup.shards.program import LaneContext, Outcome


class Review:
    async def run(self, lane: LaneContext) -> Outcome:
        if lane.feedback:
            lane.emit(f"revising after: {lane.feedback}")
        summary = lane.resumed
        if summary is None:  # a fresh start: review (a resumed lane has its summary already)
            ran = await lane.exec(lane.task.run, timeout_s=60)
            if ran.exit_code != 0:
                return Outcome(status="failed", exit_code=ran.exit_code, error="review failed")
            lines = ran.output_tail.splitlines() or ["-"]
            summary = f"{len(lines)} lines from `{lane.task.run}`; last: {lines[-1]}"
            await lane.checkpoint(summary)
        lane.emit(f"summary: {summary}")
        if lane.budget is not None and lane.budget.cpu_s is not None:
            left = lane.budget.cpu_s - lane.spent().cpu_s
            lane.emit(f"cpu left: {left:.2f} s of {lane.budget.cpu_s:g}")

        answer = await lane.ask_human(f"Publish this review? {summary}", key="publish")
        if answer.verdict in ("reject", "redirect"):
            why = answer.text or "not published"
            return Outcome(status="failed", error=why, failure=FailureClass.QUALITY_MISS)
        write = f"printf '%s\\n' {shlex.quote(summary)} > REVIEW.md"
        wrote = await lane.exec(write, timeout_s=10)
        if wrote.exit_code != 0:
            return Outcome(status="failed", exit_code=wrote.exit_code, error="no REVIEW.md")
        await lane.tell_coordinator(f"published, approved by {answer.responder or 'a human'}")
        return Outcome(status="succeeded", exit_code=0)

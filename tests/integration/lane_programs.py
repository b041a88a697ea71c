"""Lane programs the integration tests run inside a shard (importable through PYTHONPATH)."""

from __future__ import annotations

from orchestra_sup.shards.program import LaneContext, Outcome


class Raises:
    """Waits for one message, then raises: a program bug."""

    async def run(self, lane: LaneContext) -> Outcome:
        await lane.recv()
        raise RuntimeError("a bug in the program")


class Runs:
    """Runs each message as a shell command in the sandbox until `exit`; fails on the first
    command that fails."""

    async def run(self, lane: LaneContext) -> Outcome:
        while (command := await lane.recv()) != "exit":
            outcome = await lane.exec(str(command), 30.0)
            if outcome.exit_code != 0:
                return Outcome(status="failed", exit_code=outcome.exit_code, error=str(command))
        return Outcome(status="succeeded", exit_code=0)


class Interrupted:
    """Claims a status only the shard may give."""

    async def run(self, lane: LaneContext) -> Outcome:
        return Outcome(status="interrupted")


class NotAnOutcome:
    async def run(self, lane: LaneContext) -> object:
        return "done"


class HugeExitCode:
    async def run(self, lane: LaneContext) -> Outcome:
        return Outcome(status="failed", exit_code=-(10**30))

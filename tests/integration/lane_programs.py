"""Lane programs the integration tests run inside a shard (importable through PYTHONPATH)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from orchestra_sup.protocol.frames import FailureClass
from orchestra_sup.shards.program import LaneContext, Outcome

PREFLIGHT = FailureClass.PREFLIGHT_ESCALATION


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


class Steps:
    """`run` is "N FILE": N steps, each appending "<task> <step>" to FILE with a command in the
    sandbox and then checkpointing the next step; before each step but the first it waits for a
    message. A resumed lane starts at its checkpoint, so no step runs twice unless one was
    interrupted mid-way."""

    async def run(self, lane: LaneContext) -> Outcome:
        steps, path = lane.task.run.split(" ", 1)
        step = int(lane.resumed or 0)
        while step < int(steps):
            if step > 0:
                lane.emit(f"step {step}: {await lane.recv()}")
            outcome = await lane.exec(f"echo '{lane.task.id} {step}' >> '{path}'", 30.0)
            if outcome.exit_code != 0:
                return Outcome(status="failed", exit_code=outcome.exit_code, error=f"step {step}")
            step += 1
            await lane.checkpoint(step)
        return Outcome(status="succeeded", exit_code=0)


class Gated:
    """`run` is "FILE GATE": appends "<task> start" to FILE and waits, in a command, until GATE
    exists (an `exec`: no quiet point while it waits); then checkpoints and appends
    "<task> got <text>" to FILE for each message until one says "done". A lane resumed from the
    checkpoint goes straight to its messages; a fresh start (a re-placed task) starts again."""

    async def run(self, lane: LaneContext) -> Outcome:
        path, gate = lane.task.run.split(" ", 1)
        if lane.resumed is None:
            wait = f"while [ ! -e '{gate}' ]; do sleep 0.02; done"
            outcome = await lane.exec(f"echo '{lane.task.id} start' >> '{path}'; {wait}", 60.0)
            if outcome.exit_code != 0:
                return Outcome(status="failed", exit_code=outcome.exit_code, error="start")
            await lane.checkpoint("gated")
        while (text := await lane.recv()) != "done":
            lane.emit(f"got {text}")
            outcome = await lane.exec(f"echo '{lane.task.id} got {text}' >> '{path}'", 30.0)
            if outcome.exit_code != 0:
                return Outcome(status="failed", exit_code=outcome.exit_code, error=str(text))
        return Outcome(status="succeeded", exit_code=0)


class Asks:
    """Tells the coordinator it is about to ask, asks a human `run` (the question, key "q1"),
    then "sure?" (key "confirm"), emitting each verdict and text; succeeds, or fails with
    `preflight_escalation` on a rejection."""

    async def run(self, lane: LaneContext) -> Outcome:
        await lane.tell_coordinator("asking")
        for question, key in ((lane.task.run, None), ("sure?", "confirm")):
            answer = await lane.ask_human(question, key)
            lane.emit(f"{answer.verdict}: {answer.text}")
            if answer.verdict == "reject":
                return Outcome(status="failed", error=answer.text, failure=PREFLIGHT)
        return Outcome(status="succeeded")


class Chatty:
    """Sends the coordinator notes of `run` bytes each until it is stopped or refused."""

    async def run(self, lane: LaneContext) -> Outcome:
        while True:
            await lane.tell_coordinator("n" * int(lane.task.run))


class AsksTwice:
    """Asks two questions at once (keys "a" and "b"), which a lane may not."""

    async def run(self, lane: LaneContext) -> Outcome:
        await asyncio.gather(lane.ask_human("A?", key="a"), lane.ask_human("B?", key="b"))
        return Outcome(status="succeeded")


class Strays:
    """`run` is a pid file: leaves a command running in a task of its own (it writes its group
    id there, leaves a grandchild and sleeps), then returns succeeded while it still runs."""

    def __init__(self) -> None:
        self.left: list[asyncio.Future[object]] = []

    async def run(self, lane: LaneContext) -> Outcome:
        pidfile = Path(lane.task.run)
        self.left.append(
            asyncio.ensure_future(lane.exec(f"echo $$ > {pidfile}; sleep 300 & sleep 300"))
        )
        async with asyncio.timeout(30):
            while not pidfile.exists() or not pidfile.read_text().strip():
                await asyncio.sleep(0.02)
        return Outcome(status="succeeded", exit_code=0)


class Twice:
    """Runs its `run` command twice in its sandbox (a program's two `exec`s); fails when the
    second fails."""

    async def run(self, lane: LaneContext) -> Outcome:
        for _ in range(2):
            ran = await lane.exec(lane.task.run, 30.0)
        return Outcome(
            status="succeeded" if ran.exit_code == 0 else "failed",
            exit_code=ran.exit_code,
            error=None if ran.exit_code == 0 else "second run failed",
        )

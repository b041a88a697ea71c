"""Lane programs: loading by name against the allow-list, the shell verdict table, and the
quiet points and checkpoints a rollover parks and resumes a program lane by."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from orchestra_sup.bench.scale import PARKED, Parked
from orchestra_sup.protocol import frames as f
from orchestra_sup.shards.program import (
    CHECKPOINT_MAX_BYTES,
    LaneContext,
    Mailbox,
    Outcome,
    ProgramError,
    QuietPoints,
    Shell,
    judge,
    load_program,
)
from orchestra_sup.shards.shell import ShellOutcome


def test_shell_needs_no_permission() -> None:
    assert isinstance(load_program("shell", frozenset()), Shell)


def test_an_allowed_program_is_loaded_fresh_each_time() -> None:
    first = load_program(PARKED, frozenset({PARKED}))
    assert isinstance(first, Parked)
    assert load_program(PARKED, frozenset({PARKED})) is not first


@pytest.mark.parametrize(
    ("name", "allowed", "why"),
    [
        (PARKED, frozenset(), "is not in [lanes] programs"),
        ("os.system", frozenset({"os.system"}), "is not 'shell' or 'module:Class'"),
        ("no_such_module:X", frozenset({"no_such_module:X"}), "cannot be loaded"),
        ("os:NoSuchThing", frozenset({"os:NoSuchThing"}), "cannot be loaded"),
        ("os:getcwd", frozenset({"os:getcwd"}), "is not a class with a run method"),
        ("builtins:int", frozenset({"builtins:int"}), "is not a class with a run method"),
    ],
)
def test_programs_that_may_not_or_cannot_run_are_refused(
    name: str, allowed: frozenset[str], why: str
) -> None:
    with pytest.raises(ProgramError, match="program") as info:
        load_program(name, allowed)
    assert why in str(info.value)


def outcome(**kw: object) -> ShellOutcome:
    base = {
        "exit_code": None,
        "signal": None,
        "timed_out": False,
        "cancelled": False,
        "duration_s": 0.1,
        "output_tail": "",
        "output_bytes": 0,
    }
    return ShellOutcome(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("shell", "verdict"),
    [
        (outcome(exit_code=0), Outcome(status="succeeded", exit_code=0)),
        (
            outcome(exit_code=3),
            Outcome(status="failed", exit_code=3, error="exited with status 3"),
        ),
        (outcome(signal=9), Outcome(status="failed", error="killed by signal 9")),
        (
            outcome(signal=9, timed_out=True),
            Outcome(status="failed", error="timed out after 2 s; its process group was killed"),
        ),
    ],
)
def test_judge(shell: ShellOutcome, verdict: Outcome) -> None:
    assert judge(shell, 2.0) == verdict


# --- quiet points and checkpoints (rollovers) ----------------------------------------------------


def _context(quiet: QuietPoints, mailbox: Mailbox | None = None) -> LaneContext:
    start = f.LaneStart(lane="L", plan="p", task=f.TaskSpec(id="t", run="", program="m:C"))

    async def no_exec(command: str, timeout_s: float | None) -> ShellOutcome:
        raise AssertionError("no command runs here")

    return LaneContext(
        start, Path("/nowhere"), no_exec, lambda text: None, mailbox or Mailbox(), quiet
    )


def test_a_checkpoint_resumes_as_the_next_generation_decodes_it() -> None:
    """A checkpoint is kept as msgpack gives it back (what `resumed` is after a move); a fresh
    lane has `resumed` None; an unencodable or oversized value is refused, the last one kept."""

    async def main() -> None:
        quiet = QuietPoints()
        context = _context(quiet)
        assert context.resumed is None
        await context.checkpoint({"step": 2, "done": ("a", "b"), "raw": b"\x00"})
        with pytest.raises(TypeError):
            await context.checkpoint(object())
        with pytest.raises(ValueError, match="at most"):
            await context.checkpoint("x" * (CHECKPOINT_MAX_BYTES + 1))
        snapshot = f.LaneSnapshot(
            start=f.LaneStart(lane="L", plan="p", task=f.TaskSpec(id="t", run="")),
            checkpoint=quiet.checkpoint,
        )
        wire = msgspec.msgpack.decode(msgspec.msgpack.encode(snapshot), type=f.LaneSnapshot)
        resumed = _context(QuietPoints(wire.checkpoint))
        assert resumed.resumed == {"step": 2, "done": ["a", "b"], "raw": b"\x00"}

    asyncio.run(main())


def test_recv_and_checkpoint_are_quiet_points_and_nothing_else() -> None:
    """A drain's request resolves at once for a lane waiting in `recv`, and the message that
    arrives as it is parked stays unread; a lane between quiet points is reached at its next
    `checkpoint`, where it stays (the shard cancels it there)."""

    async def main() -> None:
        quiet, mailbox = QuietPoints(), Mailbox()
        context = _context(quiet, mailbox)
        waiting = asyncio.ensure_future(context.recv())
        await asyncio.sleep(0)
        reached = quiet.request()
        assert reached.done()
        mailbox.put_nowait("hello")  # wakes the reader, which the shard cancels first
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert mailbox.unread() == ["hello"] and not quiet.quiet

        quiet = QuietPoints()
        context = _context(quiet)
        gate = asyncio.Event()

        async def program() -> None:
            await gate.wait()  # working: not a quiet point
            await context.checkpoint(7)
            raise AssertionError("a parked lane does not go on")

        running = asyncio.ensure_future(program())
        await asyncio.sleep(0)
        reached = quiet.request()
        assert not reached.done()
        gate.set()
        async with asyncio.timeout(5):
            await reached
        assert quiet.quiet and quiet.checkpoint == 7
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        assert not quiet.quiet

    asyncio.run(main())

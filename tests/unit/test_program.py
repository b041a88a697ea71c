"""Lane programs: loading by name against the allow-list, the shell verdict table, what a
program may return, the quiet points and checkpoints a rollover parks and resumes a program lane
by, and asking a human (`ask_human`) and telling the coordinator."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from orchestra_sup.bench.scale import PARKED, Parked
from orchestra_sup.protocol import frames as f
from orchestra_sup.shards.hitl import Questions
from orchestra_sup.shards.host import Host, LaneServices
from orchestra_sup.shards.lane import Lane, LaneState
from orchestra_sup.shards.program import (
    CHECKPOINT_MAX_BYTES,
    NOTES_MAX,
    TEXT_MAX_BYTES,
    LaneContext,
    Mailbox,
    Outcome,
    ProgramError,
    QuietPoints,
    Shell,
    checked,
    judge,
    load_program,
)
from orchestra_sup.shards.shell import ShellOutcome
from orchestra_sup.shards.spend import BudgetWatch

TOOL = f.FailureClass.TOOL_FAILURE
APPROVE = f.Answer(verdict="approve", responder="ana", uid=1000)


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
            Outcome(status="failed", exit_code=3, error="exited with status 3", failure=TOOL),
        ),
        (outcome(signal=9), Outcome(status="failed", error="killed by signal 9", failure=TOOL)),
        (
            outcome(signal=9, timed_out=True),
            Outcome(
                status="failed",
                error="timed out after 2 s; its process group was killed",
                failure=f.FailureClass.TIMEOUT,
            ),
        ),
    ],
)
def test_judge(shell: ShellOutcome, verdict: Outcome) -> None:
    """A command's end as a verdict with its failure class."""
    assert judge(shell, 2.0) == verdict


@pytest.mark.parametrize(
    ("returned", "failure"),
    [
        (Outcome(status="succeeded"), None),
        (Outcome(status="failed"), TOOL),
        (Outcome(status="failed", failure=f.FailureClass.QUALITY_MISS), "quality_miss"),
        (Outcome(status="failed", failure=TOOL), "tool_failure"),
        (
            Outcome(status="failed", failure=f.FailureClass.PREFLIGHT_ESCALATION),
            "preflight_escalation",
        ),
    ],
)
def test_a_failed_program_says_its_class_or_is_a_tool_failure(
    returned: Outcome, failure: str | None
) -> None:
    """The classes a program may give are kept; a failure without one is a tool failure."""
    assert checked("m:C", returned).failure == failure


@pytest.mark.parametrize(
    "returned",
    [
        *(
            Outcome(status="failed", failure=cls)
            for cls in (
                f.FailureClass.TIMEOUT,
                f.FailureClass.BUDGET_EXHAUSTION,
                f.FailureClass.WORKER_PROCESS_LOSS,
                f.FailureClass.QUOTA_BREACH,
            )
        ),
        Outcome(status="succeeded", failure=f.FailureClass.QUALITY_MISS),
    ],
)
def test_a_program_may_not_claim_the_shards_failure_classes(returned: Outcome) -> None:
    """Timeouts, budgets, worker loss and quotas are the shard's and the coordinator's to say;
    a succeeded outcome has no class."""
    with pytest.raises(ProgramError, match="returned failure"):
        checked("m:C", returned)


# --- quiet points and checkpoints (rollovers) ----------------------------------------------------


class FakeHost:
    """A shard as a lane's context sees it, with no process: it records what the lane asked and
    said, and `on_record(key)` runs the moment a pause is recorded."""

    def __init__(self, on_record: Callable[[str], object] | None = None) -> None:
        self.on_record = on_record
        self.paused: list[tuple[str, str]] = []
        self.waits: list[str | None] = []
        self.notes: list[str] = []
        self.commands: list[str] = []
        self.running = asyncio.Event()  # set while a command "runs"
        self.finish = asyncio.Event()  # a command "runs" until this is set

    async def exec(self, command: str, timeout_s: float | None) -> ShellOutcome:
        self.commands.append(command)
        self.running.set()
        try:
            await self.finish.wait()
        finally:
            self.running.clear()
        return outcome(exit_code=0)

    def emit(self, text: str) -> None:
        raise AssertionError("nothing is emitted here")

    def spent(self) -> f.Spend:
        return f.Spend(wall_s=1.5)

    async def record_pause(self, key: str, question: str) -> None:
        self.paused.append((key, question))
        if self.on_record is not None:
            self.on_record(key)

    def waiting(self, question: str | None) -> None:
        self.waits.append(question)

    async def tell(self, text: str) -> None:
        self.notes.append(text)


def _context(
    quiet: QuietPoints,
    mailbox: Mailbox | None = None,
    host: FakeHost | None = None,
    questions: Questions | None = None,
) -> LaneContext:
    start = f.LaneStart(
        lane="L",
        plan="p",
        task=f.TaskSpec(id="t", run="", program="m:C"),
        feedback="shorter, please",
        budget=f.Budget(cpu_s=2.0),
    )
    return LaneContext(
        start,
        Path("/nowhere"),
        host or FakeHost(),
        mailbox or Mailbox(),
        quiet,
        questions or Questions(),
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


# --- asking a human, telling the coordinator -----------------------------------------------------


def test_the_context_gives_feedback_budget_and_spend() -> None:
    """What the attempt was told, its grant, and what it spent so far, as the host counts it."""
    context = _context(QuietPoints())
    assert context.feedback == "shorter, please"
    assert context.budget == f.Budget(cpu_s=2.0)
    assert context.spent() == f.Spend(wall_s=1.5)


def test_an_answer_that_comes_the_moment_the_pause_is_recorded_resumes_the_lane() -> None:
    """ARCHITECTURE.md §11 invariant 9: the waiter is installed before the pause is recorded, so
    an answer given synchronously as the pause lands (before `ask_human` runs again) resolves
    it; the lane is shown waiting and then not."""

    async def main() -> None:
        questions = Questions()
        host = FakeHost(on_record=lambda key: questions.answer(key, APPROVE))
        context = _context(QuietPoints(), host=host, questions=questions)
        async with asyncio.timeout(5):
            answer = await context.ask_human("ship it?")
        assert answer == APPROVE
        assert host.paused == [("q1", "ship it?")]
        assert host.waits == ["ship it?", None]

    asyncio.run(main())


def test_ask_human_waits_parked_until_the_answer_and_numbers_its_questions() -> None:
    """Default keys q1, q2, ...; the wait is a quiet point; a second answer to a key changes
    nothing; a key answered already (a re-run) is answered at once, without a new pause."""

    async def main() -> None:
        quiet, questions = QuietPoints(), Questions()
        host = FakeHost()
        context = _context(quiet, host=host, questions=questions)
        asking = asyncio.ensure_future(context.ask_human("first?"))
        async with asyncio.timeout(5):
            await quiet.request()  # parked in the wait
        assert host.waits == ["first?"] and not asking.done()
        assert questions.answer("q1", APPROVE)
        assert not questions.answer("q1", f.Answer(verdict="reject"))
        async with asyncio.timeout(5):
            assert await asking == APPROVE
        assert not quiet.quiet
        questions.answer("review", f.Answer(verdict="redirect", text="do B"))
        assert (await context.ask_human("again?", key="review")).text == "do B"
        assert host.paused == [("q1", "first?")]
        asking = asyncio.ensure_future(context.ask_human("second?"))
        await asyncio.sleep(0)
        assert host.paused[-1] == ("q2", "second?")
        asking.cancel()
        await asyncio.gather(asking, return_exceptions=True)
        assert host.waits[-1] is None and not quiet.quiet

    asyncio.run(main())


def test_a_resumed_run_numbers_its_questions_from_its_checkpoint() -> None:
    """The count of questions travels with the checkpoint: a re-run from it asks "q2" for the
    question after the checkpoint, and gets the answer recorded for it at once."""

    async def main() -> None:
        first = Questions()
        context = _context(QuietPoints(), host=FakeHost(), questions=first)
        first.answer("q1", APPROVE)
        await context.ask_human("before")
        await context.checkpoint("after q1")
        resumed = Questions({"q2": APPROVE}, asked=first.asked_at_checkpoint)
        host = FakeHost()
        again = _context(QuietPoints("after q1"), host=host, questions=resumed)
        assert await again.ask_human("after") == APPROVE
        assert host.paused == []

    asyncio.run(main())


@pytest.mark.parametrize(
    "key",
    ["", "k" * 129, "a b", "a:b", "a/b", "q\n1", "é", "x" * 100_000],
)
def test_question_keys_are_short_and_plain(key: str) -> None:
    """A key is 1 to 128 of [A-Za-z0-9_.-]: it is part of the pause's message id and shown to
    humans; nothing is recorded for a refused one."""

    async def main() -> None:
        host = FakeHost()
        context = _context(QuietPoints(), host=host)
        with pytest.raises(ValueError, match="key"):
            async with asyncio.timeout(5):
                await context.ask_human("?", key=key)
        assert host.paused == []

    asyncio.run(main())


def test_questions_and_notes_are_bounded() -> None:
    """A question or a note is at most 4 KiB (UTF-8 bytes, so 4,096 ASCII characters pass); a
    128-character key passes."""

    async def main() -> None:
        assert TEXT_MAX_BYTES == 4096
        questions = Questions({"k" * 128: APPROVE})
        host = FakeHost()
        context = _context(QuietPoints(), host=host, questions=questions)
        async with asyncio.timeout(5):
            with pytest.raises(ValueError, match="at most 4096 bytes"):
                await context.ask_human("x" * (TEXT_MAX_BYTES + 1))
            with pytest.raises(ValueError, match="at most 4096 bytes"):
                await context.ask_human("é" * (TEXT_MAX_BYTES // 2 + 1))
        assert await context.ask_human("x" * TEXT_MAX_BYTES, key="k" * 128) == APPROVE
        with pytest.raises(ValueError, match="at most 4096 bytes"):
            await context.tell_coordinator("x" * (TEXT_MAX_BYTES + 1))
        await context.tell_coordinator("x" * TEXT_MAX_BYTES)
        assert host.notes == ["x" * TEXT_MAX_BYTES] and host.paused == []

    asyncio.run(main())


def test_a_lane_asks_one_question_at_a_time() -> None:
    """Two questions at once (`gather`): the second is refused with RuntimeError, whatever its
    key (the coordinator keeps one pending question per task: it would never be answered), and
    the first goes on waiting; once it is answered, the next may be asked."""

    async def main() -> None:
        questions = Questions({"b": APPROVE})
        host = FakeHost()
        context = _context(QuietPoints(), host=host, questions=questions)
        first = asyncio.ensure_future(context.ask_human("A?", key="a"))
        for key in ("b", "a", None):  # answered already, the same key, a default key
            with pytest.raises(RuntimeError, match="one question at a time"):
                async with asyncio.timeout(5):
                    await asyncio.gather(first, context.ask_human("B?", key=key))
            assert not first.done()
        assert host.paused == [("a", "A?")] and questions.asked == 0
        questions.answer("a", APPROVE)
        async with asyncio.timeout(5):
            assert await first == APPROVE
        assert await context.ask_human("B?", key="b") == APPROVE

    asyncio.run(main())


def test_a_lane_never_asks_while_its_command_runs_nor_runs_one_while_it_asks() -> None:
    """`gather(exec(...), ask_human(...))` would hold the lane's wall clock and deadline while
    its command runs: `ask_human` is refused while a command runs (even for a key answered
    already), `exec` while a question is pending; each is allowed again once the other ended."""

    async def main() -> None:
        questions = Questions({"known": APPROVE})
        host = FakeHost()
        context = _context(QuietPoints(), host=host, questions=questions)
        running = asyncio.ensure_future(context.exec("sleep 8"))
        async with asyncio.timeout(5):
            await host.running.wait()
        for key in (None, "known"):
            with pytest.raises(RuntimeError, match="runs a command"):
                async with asyncio.timeout(5):
                    await context.ask_human("meanwhile?", key=key)
        assert host.paused == [] and host.waits == [] and questions.asked == 0
        host.finish.set()
        async with asyncio.timeout(5):
            await running
        host.finish.clear()

        asking = asyncio.ensure_future(context.ask_human("now?"))
        async with asyncio.timeout(5):
            while not host.waits:
                await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="runs no command"):
            async with asyncio.timeout(5):
                await context.exec("sleep 8")
        assert host.commands == ["sleep 8"]
        questions.answer("q1", APPROVE)
        async with asyncio.timeout(5):
            assert await asking == APPROVE
        host.finish.set()
        await context.exec("true")
        assert host.commands == ["sleep 8", "true"]

    asyncio.run(main())


class Outbox:
    """What `Host.tell` hands its notes to."""

    def __init__(self) -> None:
        self.puts: list[f.InboxPut] = []

    async def deliver(self, put: f.InboxPut) -> None:
        self.puts.append(put)


def test_notes_count_as_output_and_are_capped_per_lane() -> None:
    """Every note's bytes are the lane's output: the note that overspends an `output_bytes`
    grant is not sent and stops the lane (CancelledError, `budget_exhaustion`); a lane sends at
    most NOTES_MAX notes over its life (RuntimeError past it)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = f.TaskSpec(id="t", run="", program="m:C")
        budget = f.Budget(output_bytes=25)
        lane = Lane(f.LaneStart(lane="L", plan="p", task=task, budget=budget))
        lane.enter(LaneState.RUNNING)
        watch, outbox = BudgetWatch(loop.create_task), Outbox()
        watch.watch(lane.id, budget, lane.meter, lane.exhaust)
        shard = LaneServices(
            node=None,  # type: ignore[arg-type]
            cgroups=None,  # type: ignore[arg-type]
            limits=None,  # type: ignore[arg-type]
            cpu=None,  # type: ignore[arg-type]
            transcript=None,
            outbox=outbox,  # type: ignore[arg-type]
            budgets=watch,
        )
        host = Host(lane, shard)
        await host.tell("ten bytes.")
        await host.tell("ten bytes.")
        assert lane.meter.output_bytes == 20 and lane.exhausted is None
        with pytest.raises(asyncio.CancelledError):
            await host.tell("ten bytes.")
        assert lane.exhausted == "budget exhausted: output_bytes 30 of 25 bytes used"
        assert [put.msg_id for put in outbox.puts] == ["note:L:1", "note:L:2"]

        chatty = Lane(f.LaneStart(lane="C", plan="p", task=task))
        chatty.notes = NOTES_MAX - 1  # sent by earlier generations
        host = Host(chatty, shard)
        await host.tell("last")
        with pytest.raises(RuntimeError, match=f"at most {NOTES_MAX} notes"):
            await host.tell("one more")
        assert outbox.puts[-1].msg_id == f"note:C:{NOTES_MAX}" and chatty.notes == NOTES_MAX
        assert chatty.meter.output_bytes == len("last")

    asyncio.run(main())

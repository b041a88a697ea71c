"""Lane programs: what a lane runs once its sandbox exists.

A program is a class with one coroutine method, `run(lane: LaneContext) -> Outcome`, constructed
with no arguments for each lane. The task's `program` names it: `shell` (the default, `Shell`:
run the task's `run` command), or `module:Class` for any other, which must also be listed in
`[lanes] programs` (a program is Python code running inside the shard, outside any sandbox, so
only what the tree's owner allowed may run; the coordinator refuses a plan naming another).
`examples/review_program.py` is a short one that uses most of what follows.

What a program gets (`LaneContext`):

- `lane`, `plan`, `task` (the `TaskSpec`: `run` is the program's argument string), `attempt`,
  `sandbox` (the lane's directory, a git checkout of the workspace);
- `feedback`: revision feedback for this attempt (a human's rejection reason, a redirect, the
  previous attempt's error after a quality miss: `LaneStart.feedback`), or None. A shell lane gets
  it as `$ORCHESTRA_FEEDBACK` (set only when there is feedback);
- `budget`: the lane's grant (`frames.Budget`: `wall_s` seconds, `cpu_s` CPU seconds,
  `output_bytes` bytes; None, or None in a dimension, is no limit there), and `spent() -> Spend`:
  what the lane has spent so far, in the same units (`shards.spend` says how each is counted). A
  lane that spends more than its grant in any dimension is stopped at once (its command's group
  killed, `run` cancelled) and fails with `budget_exhaustion`;
- `await exec(command, timeout_s=None) -> ShellOutcome`: run a shell command in the sandbox as the
  lane's own process group, in its cgroup, at its niceness, with its scrubbed environment; its
  output goes to the lane's transcript and tail as it comes (`shards.shell.run_shell`) and counts
  against `budget.output_bytes`;
- `emit(text)`: one line of the lane's own output (a transcript row and its tail; it counts
  against `budget.output_bytes`, newline included);
- `await recv(timeout_s=None) -> str | None`: the next `message_lane` text, in order (None when
  `timeout_s` passes first). A lane waiting here is parked: no process, a suspended coroutine.
- `await checkpoint(value)`: `value` (anything msgpack encodes, at most `CHECKPOINT_MAX_BYTES`)
  is where the lane can resume from; `resumed` is the checkpoint a resumed lane starts from (None
  on a fresh start, and for a lane that never took one).
- `await ask_human(question, key=None) -> frames.Answer`: pause for a human (`shards.hitl`). The
  question (at most `TEXT_MAX_BYTES`) is recorded durably for the coordinator (a `HitlPause`
  through the outbox) and the lane waits, parked, in state "awaiting_approval", until a human's
  answer comes (`ctl approve`, `reject`, `redirect`, `accept-partial`: `Answer.verdict`). `key`
  (`KEY_PATTERN`; default "q1", "q2", ... in the order this run asks) names the question across
  re-runs: one answered already (`LaneStart.answers`, or earlier in this lane) is answered at
  once, the same `Answer`.
- One question at a time, and never beside a command: `ask_human` is refused while another
  question of the lane is pending or one of its commands runs (`exec` in flight, e.g. in an
  `asyncio.gather` with it), and `exec` is refused while a question is pending. So while the lane
  waits for a human it holds no process, and that wait is exactly what is counted neither
  against `budget.wall_s` nor against the task's `timeout_s` (the coordinator also keeps one
  pending question per task: a second would never be answered).
- `await tell_coordinator(text)`: a note to the coordinator (at most `TEXT_MAX_BYTES`; at most
  `NOTES_MAX` over the lane's life), recorded durably and delivered once (a `LaneNote` through
  the outbox). Its bytes count against `budget.output_bytes`, like output: a note that
  overspends the grant is not sent, and the lane is stopped.

Errors: `exec` raises `RuntimeError` while a question is pending, `ValueError` for a timeout
that is not positive and `OSError` when the command cannot be spawned; `checkpoint` raises
`TypeError` for a value msgpack cannot encode and `ValueError` for one over
`CHECKPOINT_MAX_BYTES`; `ask_human` raises `ValueError` for a key not matching `KEY_PATTERN` or a
question over `TEXT_MAX_BYTES`, and `RuntimeError` while another question is pending or a
command runs (even for a key answered already: a program behaves the same on a re-run);
`tell_coordinator` raises `ValueError` for a text over `TEXT_MAX_BYTES` and `RuntimeError` past
`NOTES_MAX` notes. Whatever `run` raises fails the lane with `tool_failure`; a note or an `emit`
that overspends the grant raises `CancelledError` (the lane ends with `budget_exhaustion`).

How a lane ends: `run` returns an `Outcome`. A failed one may give its `failure` class:
`quality_miss` (its result is not good enough), `tool_failure` (the default) or
`preflight_escalation` (it will not go on without a human); the shard gives the others
(`timeout` when the task's `timeout_s` passed, `budget_exhaustion` when it overspent its grant).
Cancelling the lane cancels `run` (an `exec` in flight has its group killed first; a wait for a
human ends).

Rollovers (ARCHITECTURE.md §9): a shard generation being drained parks each program lane at its
next *quiet point* and resumes it on the next generation, where `run` is called again on a fresh
instance with `resumed` set and the unread messages still unread. The quiet points are exactly the
`checkpoint` calls and the `recv` and `ask_human` waits: a program is parked only where it is
suspended in one of them, so whatever it did after its last checkpoint and before a wait it is
parked in is done again only if it checkpointed nothing in between. An `exec` is not a quiet
point, even right after a checkpoint: the code between the checkpoint and the `exec` may have
acted outside the lane (a file written directly), and parking there would hide that it must run
again. A lane not quiet within the drain timeout is stopped (an `exec` in flight has its group
sent SIGTERM, then SIGKILL) and resumed from its last checkpoint with a partial-work warning.
Checkpoints live in the shard's memory and travel with the lane: they serve rollovers, not crash
recovery (a lane whose shard dies re-runs from the start, as before). A lane parked in
`ask_human` asks again on the next generation with the same key: that records the same pause
(same message id: the coordinator de-duplicates it), or finds the answer that came meanwhile. The
number of questions asked travels with the checkpoint, so default keys are numbered as before.
What the lane spent travels with it too.
"""

from __future__ import annotations

import asyncio
import importlib
import re
from pathlib import Path
from typing import Any, Protocol

import msgspec

from orchestra_sup.errors import OrchestraError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.patterns import PROGRAM_PATTERN, SHELL
from orchestra_sup.shards.hitl import Questions
from orchestra_sup.shards.shell import ShellOutcome

MAILBOX_SIZE = 1000
"""Messages a lane's mailbox holds before `message_lane` is refused (`busy`)."""
CHECKPOINT_MAX_BYTES = 1024 * 1024
"""The largest checkpoint (msgpack-encoded bytes): it travels in one frame with its lane."""
TEXT_MAX_BYTES = 4096
"""The largest `ask_human` question and `tell_coordinator` note (UTF-8 bytes): both are kept in
the coordinator's durable records and shown to humans (`ctl lanes`, `ctl status`)."""
KEY_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,128}")
"""What an `ask_human` key must match: 1 to 128 ASCII letters, digits, `_`, `.` and `-` (it is
part of the pause's message id, "pause:<lane>:<key>", and of what `ctl` shows)."""
NOTES_MAX = 100
"""The most `tell_coordinator` notes a lane sends over its life (every generation)."""
PROGRAM_FAILURES = frozenset(
    {f.FailureClass.QUALITY_MISS, f.FailureClass.TOOL_FAILURE, f.FailureClass.PREFLIGHT_ESCALATION}
)
"""The failure classes a program may give its `Outcome`; the shard gives the others."""


class Mailbox:
    """A lane's unread messages, oldest first, at most `MAILBOX_SIZE`, with one reader (its
    program's `recv`). A list and one future: a shard holds one per parked lane, and an
    `asyncio.Queue` costs three deques and an event (about 2.5 KiB) each."""

    __slots__ = ("_items", "_waiter")

    def __init__(self, unread: list[str] | None = None) -> None:
        # an empty deque is a 600-byte block; a list, 56 bytes
        self._items: list[str] = list(unread) if unread else []
        self._waiter: asyncio.Future[None] | None = None

    def unread(self) -> list[str]:
        """The unread messages, oldest first (a copy)."""
        return list(self._items)

    def full(self) -> bool:
        return len(self._items) >= MAILBOX_SIZE

    def put_nowait(self, text: str) -> None:
        """Append `text`; raises `OverflowError` when the mailbox is full."""
        if self.full():
            raise OverflowError(f"mailbox full ({MAILBOX_SIZE} unread messages)")
        self._items.append(text)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self) -> str:
        """The oldest unread message, waiting for one. Raises `RuntimeError` when another
        reader is already waiting."""
        while not self._items:
            if self._waiter is not None and not self._waiter.done():
                raise RuntimeError("a mailbox has one reader")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.pop(0)


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """How a program ended: `status` "succeeded" or "failed", the exit code of the command that
    decided it (None when no command did), a one-line `error` when it failed, and its `failure`
    class (a program may give one of `PROGRAM_FAILURES`; None on a failed outcome is taken as
    `tool_failure`)."""

    status: str
    exit_code: int | None = None
    error: str | None = None
    failure: f.FailureClass | None = None


class QuietPoints:
    """Where a program lane stands for a drain: its last checkpoint, whether it is suspended at
    a quiet point now, and whether a drain asked it to stop at the next one (see the module
    docstring). The shard keeps one per program lane; `LaneContext` enters and leaves."""

    __slots__ = ("_reached", "checkpoint", "quiet")

    def __init__(self, checkpoint: Any = None) -> None:
        self.checkpoint = checkpoint
        """The last checkpoint as msgpack gives it back (None: none taken)."""
        self.quiet = False
        self._reached: asyncio.Future[None] | None = None

    def request(self) -> asyncio.Future[None]:
        """Ask the lane to stop at its next quiet point: the future resolves when it is at one
        (at once when it already waits in `recv`). It stays there until the shard cancels it."""
        self._reached = asyncio.get_running_loop().create_future()
        if self.quiet:
            self._reached.set_result(None)
        return self._reached

    @property
    def requested(self) -> bool:
        return self._reached is not None

    def save(self, value: Any) -> None:
        """Keep `value` as the checkpoint, as the next generation will decode it (tuples become
        lists, Structs dicts). Raises `TypeError` for a value msgpack cannot encode, `ValueError`
        for one over `CHECKPOINT_MAX_BYTES`."""
        data = msgspec.msgpack.encode(value)
        if len(data) > CHECKPOINT_MAX_BYTES:
            raise ValueError(
                f"a checkpoint is at most {CHECKPOINT_MAX_BYTES} bytes, this one {len(data)}"
            )
        self.checkpoint = msgspec.msgpack.decode(data)

    def enter(self) -> None:
        self.quiet = True
        if self._reached is not None and not self._reached.done():
            self._reached.set_result(None)

    def leave(self) -> None:
        self.quiet = False


class LaneHost(Protocol):
    """What the shard does for a lane's context (`shards.host.Host`)."""

    async def exec(self, command: str, timeout_s: float | None) -> ShellOutcome:
        """`LaneContext.exec`."""

    def emit(self, text: str) -> None:
        """`LaneContext.emit`."""

    def spent(self) -> f.Spend:
        """`LaneContext.spent`."""

    async def record_pause(self, key: str, question: str) -> None:
        """Record durably that the lane asks `question` as `key`; returns once it is."""

    def waiting(self, question: str | None) -> None:
        """From now on the lane waits for a human's answer to `question` (None: no more)."""

    async def tell(self, text: str) -> None:
        """`LaneContext.tell_coordinator`: returns once the note is recorded."""


class LaneContext:
    """What a lane program sees of its lane; see the module docstring. `quiet` is the lane's
    `QuietPoints` (its checkpoint when the context is made is `resumed`), `questions` its
    `hitl.Questions`; `host` does the rest."""

    def __init__(
        self,
        start: f.LaneStart,
        sandbox: Path,
        host: LaneHost,
        mailbox: Mailbox,
        quiet: QuietPoints,
        questions: Questions,
    ):
        self.lane = start.lane
        self.plan = start.plan
        self.task = start.task
        self.attempt = start.attempt
        self.sandbox = sandbox
        self.feedback: str | None = start.feedback
        """Revision feedback for this attempt, or None."""
        self.budget: f.Budget | None = start.budget
        """The lane's grant (None: no limit)."""
        self.resumed: Any = quiet.checkpoint
        """The checkpoint this lane resumes from (None: a fresh start, or none was taken)."""
        self._host = host
        self._mailbox = mailbox
        self._quiet = quiet
        self._questions = questions
        self._commands = 0  # commands of the lane running now (`exec` calls in flight)

    async def exec(self, command: str, timeout_s: float | None = None) -> ShellOutcome:
        """Run `command` with `/bin/sh -c` in the sandbox. Raises `RuntimeError` while the lane
        waits for a human (`ask_human`), `ValueError` for a timeout that is not positive,
        `OSError` when it cannot be spawned."""
        if self._questions.pending is not None:
            raise RuntimeError(
                f"the lane waits for an answer to {self._questions.pending!r}: "
                "it runs no command meanwhile"
            )
        self._commands += 1
        try:
            return await self._host.exec(command, timeout_s)
        finally:
            self._commands -= 1

    def emit(self, text: str) -> None:
        """Record `text` as one line of the lane's output."""
        self._host.emit(text)

    def spent(self) -> f.Spend:
        """What the lane has spent so far (seconds, CPU seconds, bytes: see `budget`)."""
        return self._host.spent()

    async def recv(self, timeout_s: float | None = None) -> str | None:
        """The next message sent to this lane, or None after `timeout_s` seconds. A quiet point:
        a drain may park the lane while it waits here (the message stays unread)."""
        self._quiet.enter()
        try:
            async with asyncio.timeout(timeout_s):
                return await self._mailbox.get()
        except TimeoutError:
            return None
        finally:
            self._quiet.leave()

    async def checkpoint(self, value: Any) -> None:
        """Record `value` as where this lane can resume from (`resumed` on the next generation
        after a rollover). A quiet point: when a drain has asked, the lane is parked here and
        this never returns. Raises `TypeError` for a value msgpack cannot encode, `ValueError`
        for one over `CHECKPOINT_MAX_BYTES` (the previous checkpoint is kept)."""
        self._quiet.save(value)
        self._questions.asked_at_checkpoint = self._questions.asked
        if self._quiet.requested:
            self._quiet.enter()
            try:
                await asyncio.get_running_loop().create_future()  # the shard cancels the lane
            finally:
                self._quiet.leave()

    async def ask_human(self, question: str, key: str | None = None) -> f.Answer:
        """A human's answer to `question` (see the module docstring): at once when `key` has
        one already, else once it comes. A quiet point while it waits. Raises `ValueError` for
        a key that does not match `KEY_PATTERN` or a question over `TEXT_MAX_BYTES`;
        `RuntimeError` when the lane already waits on a question (any key) or one of its
        commands runs (`exec`), whether or not `key` has an answer already."""
        _check_text("question", question)
        if key is not None and not KEY_PATTERN.fullmatch(key):
            shown = key if len(key) <= 140 else f"{key[:140]}..."
            raise ValueError(f"a question key matches {KEY_PATTERN.pattern}, got {shown!r}")
        if self._commands:
            raise RuntimeError(
                "the lane runs a command: it asks a human only when none of its commands runs"
            )
        if self._questions.pending is not None:
            raise RuntimeError(
                f"the lane already waits for an answer to {self._questions.pending!r}: "
                "it asks one question at a time"
            )
        if key is None:
            key = self._questions.next_key()
        known = self._questions.answers.get(key)
        if known is not None:
            return known
        # ARCHITECTURE.md §11 invariant 9: the waiter exists before the pause is recorded, so
        # an answer that comes the moment it is (before this coroutine runs again) has
        # something to resolve.
        waiter = self._questions.install(key)
        try:
            await self._host.record_pause(key, question)
            self._host.waiting(question)
            self._quiet.enter()
            try:
                return await waiter
            finally:
                self._quiet.leave()
                self._host.waiting(None)
        finally:
            self._questions.uninstall()

    async def tell_coordinator(self, text: str) -> None:
        """Send `text` to the coordinator as a note; returns once it is recorded durably (the
        outbox delivers it once). Its UTF-8 bytes count as the lane's output. Raises
        `ValueError` for a text over `TEXT_MAX_BYTES`, `RuntimeError` once the lane has sent
        `NOTES_MAX` notes, `CancelledError` when the note overspends the lane's `output_bytes`
        grant (it is not sent; the lane is being stopped)."""
        _check_text("note", text)
        await self._host.tell(text)


def _check_text(what: str, text: str) -> None:
    size = len(text.encode())
    if size > TEXT_MAX_BYTES:
        raise ValueError(f"a {what} is at most {TEXT_MAX_BYTES} bytes, this one {size}")


class LaneProgram(Protocol):
    async def run(self, lane: LaneContext) -> Outcome:
        """Do the lane's work and say how it ended."""


class Shell:
    """The default program: the task's `run` as one shell command, judged by how it ends."""

    async def run(self, lane: LaneContext) -> Outcome:
        outcome = await lane.exec(lane.task.run, lane.task.timeout_s)
        return judge(outcome, lane.task.timeout_s)


def judge(outcome: ShellOutcome, timeout_s: float | None) -> Outcome:
    """A command's verdict from how it ended: `timeout` when it ran past `timeout_s` (its group
    was killed), `tool_failure` when it exited non-zero or a signal ended it."""
    if outcome.timed_out:
        return Outcome(
            status="failed",
            error=f"timed out after {timeout_s:g} s; its process group was killed",
            failure=f.FailureClass.TIMEOUT,
        )
    if outcome.exit_code == 0:
        return Outcome(status="succeeded", exit_code=0)
    if outcome.signal is not None:
        return Outcome(
            status="failed",
            error=f"killed by signal {outcome.signal}",
            failure=f.FailureClass.TOOL_FAILURE,
        )
    return Outcome(
        status="failed",
        exit_code=outcome.exit_code,
        error=f"exited with status {outcome.exit_code}",
        failure=f.FailureClass.TOOL_FAILURE,
    )


class ProgramError(OrchestraError):
    """A program that may not or cannot be loaded, or that returned something other than a
    valid `Outcome`; the message names it and why."""


EXIT_CODE_RANGE = range(-(2**31), 2**31)


def checked(name: str, verdict: object) -> Outcome:
    """`verdict` if it is a valid `Outcome` (status "succeeded" or "failed", `exit_code` None or
    a 32-bit int, `error` None or a string, `failure` None or one of `PROGRAM_FAILURES` on a
    failed outcome only), a failed one given `tool_failure` when it says no class; raises
    `ProgramError` otherwise. A program's return value goes into durable records and across
    processes: nothing unchecked may."""
    if not isinstance(verdict, Outcome):
        raise ProgramError(f"program {name} returned {type(verdict).__name__}, not an Outcome")
    if verdict.status not in ("succeeded", "failed"):
        raise ProgramError(
            f"program {name} returned status {verdict.status!r} (expected 'succeeded' or 'failed')"
        )
    code = verdict.exit_code
    if code is not None and (
        isinstance(code, bool) or not isinstance(code, int) or code not in EXIT_CODE_RANGE
    ):
        raise ProgramError(f"program {name} returned exit code {code!r} (expected a 32-bit int)")
    if verdict.error is not None and not isinstance(verdict.error, str):
        raise ProgramError(f"program {name} returned a non-string error")
    failure = verdict.failure
    if failure is not None and (verdict.status != "failed" or failure not in PROGRAM_FAILURES):
        allowed = ", ".join(sorted(PROGRAM_FAILURES))
        raise ProgramError(
            f"program {name} returned failure {failure!r} with status {verdict.status!r} "
            f"(only a failed outcome has one, and a program may give {allowed})"
        )
    if verdict.status == "failed" and failure is None:
        return msgspec.structs.replace(verdict, failure=f.FailureClass.TOOL_FAILURE)
    return verdict


def load_program(name: str, allowed: frozenset[str]) -> LaneProgram:
    """A fresh instance of program `name`. Raises `ProgramError` when it does not match
    `PROGRAM_PATTERN`, is not `shell` and not in `allowed`, cannot be imported, or is not a
    class with a `run` method."""
    if name == SHELL:
        return Shell()
    if not PROGRAM_PATTERN.fullmatch(name):
        raise ProgramError(f"program {name!r} is not 'shell' or 'module:Class'")
    if name not in allowed:
        raise ProgramError(f"program {name!r} is not in [lanes] programs")
    module_name, _, class_name = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ProgramError(f"program {name!r} cannot be loaded: {exc}") from exc
    if not isinstance(cls, type) or not callable(getattr(cls, "run", None)):
        raise ProgramError(f"program {name!r} is not a class with a run method")
    return cls()

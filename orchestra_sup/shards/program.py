"""Lane programs: what a lane runs once its sandbox exists.

A program is a class with one coroutine method, `run(lane: LaneContext) -> Outcome`, constructed
with no arguments for each lane. The task's `program` names it: `shell` (the default, `Shell`:
run the task's `run` command), or `module:Class` for any other, which must also be listed in
`[lanes] programs` (a program is Python code running inside the shard, outside any sandbox, so
only what the tree's owner allowed may run; the coordinator refuses a plan naming another).

What a program gets (`LaneContext`):

- `lane`, `plan`, `task` (the `TaskSpec`: `run` is the program's argument string), `attempt`,
  `sandbox` (the lane's directory, a git checkout of the workspace);
- `await exec(command, timeout_s=None) -> ShellOutcome`: run a shell command in the sandbox as the
  lane's own process group, in its cgroup, at its niceness, with its scrubbed environment; its
  output goes to the lane's transcript and tail as it comes (`shards.shell.run_shell`);
- `emit(text)`: one line of the lane's own output (transcript row and tail);
- `await recv(timeout_s=None) -> str | None`: the next `message_lane` text, in order (None when
  `timeout_s` passes first). A lane waiting here is parked: no process, a suspended coroutine.
- `await checkpoint(value)`: `value` (anything msgpack encodes, at most `CHECKPOINT_MAX_BYTES`)
  is where the lane can resume from; `resumed` is the checkpoint a resumed lane starts from (None
  on a fresh start, and for a lane that never took one).

Cancelling the lane cancels `run` (an `exec` in flight has its group killed first).

Rollovers (ARCHITECTURE.md §9): a shard generation being drained parks each program lane at its
next *quiet point* and resumes it on the next generation, where `run` is called again on a fresh
instance with `resumed` set and the unread messages still unread. The quiet points are exactly the
`checkpoint` calls and the `recv` waits: a program is parked only where it is suspended in one
of them, so whatever it did after its last checkpoint and before a `recv` it now waits in is done
again only if it checkpointed nothing in between. An `exec` is not a quiet point, even right after
a checkpoint: the code between the checkpoint and the `exec` may have acted outside the lane (a
file written directly), and parking there would hide that it must run again. A lane not quiet
within the drain timeout is stopped (an `exec` in flight has its group sent SIGTERM, then
SIGKILL) and resumed from its last checkpoint with a partial-work warning. Checkpoints live in
the shard's memory and travel with the lane: they serve rollovers, not crash recovery (a lane
whose shard dies re-runs from the start, as before).
"""

from __future__ import annotations

import asyncio
import importlib
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec

from orchestra_sup.protocol import frames as f
from orchestra_sup.shards.shell import ShellOutcome

SHELL = "shell"
PROGRAM_PATTERN = re.compile(r"shell|[A-Za-z_][\w.]*:[A-Za-z_]\w*")
"""What a task's `program` must match: `shell`, or `module:Class`."""
MAILBOX_SIZE = 1000
"""Messages a lane's mailbox holds before `message_lane` is refused (`busy`)."""
CHECKPOINT_MAX_BYTES = 1024 * 1024
"""The largest checkpoint (msgpack-encoded bytes): it travels in one frame with its lane."""


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
    decided it (None when no command did), and a one-line `error` when it failed."""

    status: str
    exit_code: int | None = None
    error: str | None = None


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


class LaneContext:
    """What a lane program sees of its lane; see the module docstring. `quiet` is the lane's
    `QuietPoints`; its checkpoint when the context is made is `resumed`."""

    def __init__(
        self,
        start: f.LaneStart,
        sandbox: Path,
        exec_fn: Callable[[str, float | None], Awaitable[ShellOutcome]],
        emit_fn: Callable[[str], None],
        mailbox: Mailbox,
        quiet: QuietPoints,
    ):
        self.lane = start.lane
        self.plan = start.plan
        self.task = start.task
        self.attempt = start.attempt
        self.sandbox = sandbox
        self.resumed: Any = quiet.checkpoint
        """The checkpoint this lane resumes from (None: a fresh start, or none was taken)."""
        self._exec = exec_fn
        self._emit = emit_fn
        self._mailbox = mailbox
        self._quiet = quiet

    async def exec(self, command: str, timeout_s: float | None = None) -> ShellOutcome:
        """Run `command` with `/bin/sh -c` in the sandbox. Raises `ValueError` for a timeout
        that is not positive, `OSError` when it cannot be spawned."""
        return await self._exec(command, timeout_s)

    def emit(self, text: str) -> None:
        """Record `text` as one line of the lane's output."""
        self._emit(text)

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
        if self._quiet.requested:
            self._quiet.enter()
            try:
                await asyncio.get_running_loop().create_future()  # the shard cancels the lane
            finally:
                self._quiet.leave()


class LaneProgram(Protocol):
    async def run(self, lane: LaneContext) -> Outcome:
        """Do the lane's work and say how it ended."""


class Shell:
    """The default program: the task's `run` as one shell command, judged by how it ends."""

    async def run(self, lane: LaneContext) -> Outcome:
        outcome = await lane.exec(lane.task.run, lane.task.timeout_s)
        return judge(outcome, lane.task.timeout_s)


def judge(outcome: ShellOutcome, timeout_s: float | None) -> Outcome:
    """A command's verdict from how it ended."""
    if outcome.timed_out:
        return Outcome(
            status="failed",
            error=f"timed out after {timeout_s:g} s; its process group was killed",
        )
    if outcome.exit_code == 0:
        return Outcome(status="succeeded", exit_code=0)
    if outcome.signal is not None:
        return Outcome(status="failed", error=f"killed by signal {outcome.signal}")
    return Outcome(
        status="failed",
        exit_code=outcome.exit_code,
        error=f"exited with status {outcome.exit_code}",
    )


class ProgramError(Exception):
    """A program that may not or cannot be loaded, or that returned something other than a
    valid `Outcome`; the message names it and why."""


EXIT_CODE_RANGE = range(-(2**31), 2**31)


def checked(name: str, verdict: object) -> Outcome:
    """`verdict` if it is a valid `Outcome` (status "succeeded" or "failed", `exit_code` None or
    a 32-bit int, `error` None or a string); raises `ProgramError` otherwise. A program's return
    value goes into durable records and across processes: nothing unchecked may."""
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

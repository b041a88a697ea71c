"""One lane's record in its shard: what it runs and where it stands.

The shard (`shards.role`) creates it when it admits a lane (a start, or a lane another generation
handed over), runs it and ends it; a drain (`shards.handover`) reads where it stands to park it
and hand it over. All of it lives on the shard's event loop.

Its state (`LaneState`, `LaneInfo.state`) changes only through `Lane.enter`, along `TRANSITIONS`:
starting (waiting for its sandbox) -> running <-> awaiting_approval (its program waits in
`ask_human`), any of them -> moving (a drain hands it to the next generation), and any -> one of
the final states its result says (succeeded, failed, cancelled, interrupted).
"""

from __future__ import annotations

import asyncio
import enum
import time

from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.endpoint import Endpoint
from orchestra_sup.protocol.patterns import SHELL
from orchestra_sup.shards.hitl import Questions
from orchestra_sup.shards.program import Mailbox, QuietPoints
from orchestra_sup.shards.spend import Meter
from orchestra_sup.transitions import Transitions

TAIL_BYTES = 4096
"""The newest bytes of a lane's output kept for its result (`LaneResult.output_tail`)."""

Request = tuple[Endpoint, bytes | None, f.Envelope]
"""A request as the shard's receive loop got it (its endpoint, the sender's routing id, the
envelope), kept to be served later."""


class LaneState(enum.StrEnum):
    """Where a lane stands (see the module docstring)."""

    STARTING = "starting"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    MOVING = "moving"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


FINAL = frozenset(
    {LaneState.SUCCEEDED, LaneState.FAILED, LaneState.CANCELLED, LaneState.INTERRUPTED}
)
TRANSITIONS: Transitions[LaneState] = Transitions(
    "lane",
    {
        LaneState.STARTING: {LaneState.RUNNING, LaneState.MOVING} | FINAL,
        LaneState.RUNNING: {LaneState.AWAITING_APPROVAL, LaneState.MOVING} | FINAL,
        LaneState.AWAITING_APPROVAL: {LaneState.RUNNING, LaneState.MOVING} | FINAL,
        LaneState.MOVING: FINAL,  # a hand-over the next generation refused ends it here
        **{state: frozenset() for state in FINAL},
    },
)
"""The states a lane may go to from each state."""


class Lane:
    """One lane's record in its shard: what it runs and where it stands."""

    def __init__(self, start: f.LaneStart, snapshot: f.LaneSnapshot | None = None):
        self.start = start
        self.id = start.lane
        self.state = LaneState.STARTING
        """Changed only by `enter`."""
        self.question: tuple[str, float] | None = None
        """(question, since) while its program waits in `ask_human` (since: Unix seconds)."""
        self.sandbox: str | None = None if snapshot is None else snapshot.sandbox
        self.rev: str | None = None if snapshot is None else snapshot.rev
        """The full sha its sandbox was made at (`SandboxReady.rev`), once it has one."""
        self.task: asyncio.Task[None] | None = None
        self.started = False  # its task has taken its first step (`Shard._run`)
        self.cancel_requested = False  # `cancel` was called: it is to end at once
        self.pgid: int | None = None
        self.interrupted = False
        self.message_keys: dict[str, None] | None = None
        """The idempotency keys of its last `shards.messages.MESSAGE_KEYS` messages, oldest first
        (made by the first message: parked lanes are many)."""
        self.inbox_lock: asyncio.Lock | None = None  # made by the first inbox-file append
        self.tail = bytearray()
        self.mailbox: Mailbox | None = None
        """A program's `recv` reads it; a shell command reads its inbox file instead."""
        self.quiet: QuietPoints | None = None  # a program's quiet points and last checkpoint
        self.questions: Questions | None = None  # a program's questions to a human
        if start.task.program != SHELL:
            self.mailbox = Mailbox(snapshot.mailbox if snapshot is not None else None)
            self.quiet = QuietPoints(snapshot.checkpoint if snapshot is not None else None)
            self.questions = Questions(start.answers, snapshot.asked if snapshot else 0)
        self.meter = Meter(snapshot.spent if snapshot is not None else None)
        """What it has spent, counting from what earlier generations had counted."""
        self.notes = snapshot.notes if snapshot is not None else 0
        """Notes its program has sent the coordinator (`tell_coordinator`), all generations."""
        self.exhausted: str | None = None
        """Why it was stopped for spending more than its grant, or None."""
        self.resumed = snapshot
        """The snapshot it was resumed from (another generation ran it before), or None."""
        if snapshot is not None and snapshot.message_keys:
            self.message_keys = dict.fromkeys(snapshot.message_keys)
        self.finishing = False  # its program has returned: it ends here, whatever drains
        self.moving = False  # a drain stopped it to hand it over: it reports no result
        self.held: list[Request] | None = None
        """Requests for it while it is handed over (None when it is not), in arrival order."""
        self.warnings: list[str] = []  # for its result (a partial-work warning)
        self.began = time.monotonic() - (snapshot.elapsed_s if snapshot is not None else 0.0)
        """When it started (monotonic seconds), counting the time other generations ran it."""
        self.start_received_ns = time.monotonic_ns() if snapshot is None else None
        """When this shard received its `LaneStart` (`LaneResult.start_received_ns`): a lane is
        made in the very turn its start is received (`Shard._admit`)."""

    def enter(self, state: LaneState) -> None:
        """Change its state (the only writer). Raises `ForbiddenTransition` (a `ValueError`) for
        a change `TRANSITIONS` does not allow: a bug in the shard."""
        self.state = TRANSITIONS.move(self.state, state, what=f"lane {self.id}")

    def parked_now(self) -> bool:
        """At a quiet point: still waiting for its sandbox, or a program suspended in `recv`,
        `checkpoint` or `ask_human`."""
        if self.state is LaneState.STARTING:
            return True
        return self.quiet is not None and self.quiet.quiet and not self.finishing

    def cancel(self) -> None:
        """End the lane's task at its next await (`cancel_requested`). A task that has not
        taken its first step yet is not cancelled but sees `cancel_requested` when it starts:
        asyncio never runs a task cancelled before its first step, so the lane would never end
        or report (a cancel held for a lane in transit is served in the very step that resumes
        it)."""
        self.cancel_requested = True
        if self.task is not None and self.started:
            self.task.cancel()

    def spawned(self, pgid: int) -> None:
        """The lane's command runs as process group `pgid` (for a graceful SIGTERM on stop)."""
        self.pgid = pgid

    def exhaust(self, reason: str) -> None:
        """Stop the lane now because it spent more than its grant (`reason`, one line): it
        ends failed with `budget_exhaustion`. Nothing happens once its program has returned,
        it has ended, or a drain is moving it. Called from the lane's own task (its program's
        `emit`), it only records why: cancelling a running task would fire at whatever it
        awaits next, even its result's delivery, so the caller raises `CancelledError`."""
        if self.finishing or self.moving or self.exhausted is not None or self.state in FINAL:
            return
        self.exhausted = reason
        if asyncio.current_task() is not self.task:  # from within, the caller raises instead
            self.cancel()

    def output(self, _stream: str, chunk: bytes) -> None:
        """Keep the last `TAIL_BYTES` of the command's output as it comes, so a lane that is
        cancelled mid-run still reports what it printed; count it as spent."""
        self.meter.output_bytes += len(chunk)
        self.tail += chunk
        del self.tail[: max(0, len(self.tail) - TAIL_BYTES)]

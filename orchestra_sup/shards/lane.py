"""One lane's record in its shard: what it runs and where it stands.

The shard (`shards.role`) creates it when it admits a lane (a start, or a lane another generation
handed over), runs it and ends it; a drain (`shards.handover`) reads where it stands to park it
and hand it over. All of it lives on the shard's event loop.
"""

from __future__ import annotations

import asyncio
import time

from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.endpoint import Endpoint
from orchestra_sup.shards.program import SHELL, Mailbox, QuietPoints

TAIL_BYTES = 4096
"""The newest bytes of a lane's output kept for its result (`LaneResult.output_tail`)."""

Request = tuple[Endpoint, bytes | None, f.Envelope]
"""A request as the shard's receive loop got it (its endpoint, the sender's routing id, the
envelope), kept to be served later."""


class Lane:
    """One lane's record in its shard: what it runs and where it stands."""

    def __init__(self, start: f.LaneStart, snapshot: f.LaneSnapshot | None = None):
        self.start = start
        self.id = start.lane
        self.state = "starting"
        self.sandbox: str | None = None if snapshot is None else snapshot.sandbox
        self.task: asyncio.Task[None] | None = None
        self.started = False  # its task has taken its first step (`Shard._run`)
        self.cancel_requested = False  # `cancel` was called: it is to end at once
        self.pgid: int | None = None
        self.interrupted = False
        self.message_keys: dict[str, None] | None = None
        """The idempotency keys of its last `shards.role.MESSAGE_KEYS` messages, oldest first
        (made by the first message: parked lanes are many)."""
        self.inbox_lock: asyncio.Lock | None = None  # made by the first inbox-file append
        self.tail = bytearray()
        self.mailbox: Mailbox | None = None
        """A program's `recv` reads it; a shell command reads its inbox file instead."""
        self.quiet: QuietPoints | None = None  # a program's quiet points and last checkpoint
        if start.task.program != SHELL:
            self.mailbox = Mailbox(snapshot.mailbox if snapshot is not None else None)
            self.quiet = QuietPoints(snapshot.checkpoint if snapshot is not None else None)
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

    def parked_now(self) -> bool:
        """At a quiet point: still waiting for its sandbox, or a program suspended in `recv`
        or `checkpoint`."""
        if self.state == "starting":
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

    def output(self, _stream: str, chunk: bytes) -> None:
        """Keep the last `TAIL_BYTES` of the command's output as it comes, so a lane that is
        cancelled mid-run still reports what it printed."""
        self.tail += chunk
        del self.tail[: max(0, len(self.tail) - TAIL_BYTES)]

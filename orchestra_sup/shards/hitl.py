"""One lane's questions to a human (`LaneContext.ask_human`) and the answers it has.

ARCHITECTURE.md §11 invariant 9 and seeds/003 "HITL adjudication": a waiter is installed before
the pause is recorded, so an answer can never arrive before there is something to resolve. The
coordinator records a human's answer durably before it sends it (`HitlAnswer`); the shard keeps
it here, in memory, and hands it on with the lane in a rollover (`LaneSnapshot.start.answers`).

A question's key is the program's, or by default "q1", "q2", ... in the order its run asks: a
re-run (from its last checkpoint, after a rollover, or from the start after its shard was lost)
asks again with the same key and gets the recorded answer at once. A lane waits on at most one
question at a time: the coordinator keeps one pending question per task.
"""

from __future__ import annotations

import asyncio

from orchestra_sup.protocol import frames as f


class Questions:
    """A lane's answers by key, the one question its program waits on (at most one at a time:
    the coordinator keeps one pending question per task), and how many questions its run has
    asked. Lives on the shard's event loop.

    `answers` are those known when the lane was admitted (`LaneStart.answers`); `asked` is how
    many `ask_human` calls the run it resumes had made at its checkpoint (0 on a fresh start).
    """

    __slots__ = ("_waiter", "answers", "asked", "asked_at_checkpoint", "pending")

    def __init__(self, answers: dict[str, f.Answer] | None = None, asked: int = 0) -> None:
        self.answers: dict[str, f.Answer] = dict(answers or {})
        self.pending: str | None = None
        """The key of the question the program waits on, or None."""
        self._waiter: asyncio.Future[f.Answer] | None = None
        self.asked = asked
        """`ask_human` calls so far in this run, counting those before its checkpoint."""
        self.asked_at_checkpoint = asked
        """`asked` when the program took its last checkpoint (what a snapshot carries)."""

    def next_key(self) -> str:
        """The default key of the run's next question: "q1", "q2", ..."""
        self.asked += 1
        return f"q{self.asked}"

    def install(self, key: str) -> asyncio.Future[f.Answer]:
        """A future that `answer(key, ...)` resolves; `key` is `pending` until `uninstall`.
        Only when no question is pending (`LaneContext.ask_human` refuses a second one)."""
        assert self.pending is None, f"a question is pending already: {self.pending!r}"
        self._waiter = asyncio.get_running_loop().create_future()
        self.pending = key
        return self._waiter

    def uninstall(self) -> None:
        """Forget the pending question's waiter (its wait ended, answered or cancelled)."""
        self._waiter, self.pending = None, None

    def abandon(self) -> None:
        """The lane has ended while its program still waited on a question (in a task it left
        behind): end that wait with `CancelledError`."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.cancel()

    def answer(self, key: str, answer: f.Answer) -> bool:
        """Keep `answer` to `key` and resolve the waiter when `key` is pending. False (nothing
        changes) when `key` was answered before: the first answer stands."""
        if key in self.answers:
            return False
        self.answers[key] = answer
        if self.pending == key and self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(answer)
        return True

"""One lane's questions to a human (`LaneContext.ask_human`) and the answers it has.

ARCHITECTURE.md §11 invariant 9 and seeds/003 "HITL adjudication": a waiter is installed before
the pause is recorded, so an answer can never arrive before there is something to resolve. The
coordinator records a human's answer durably before it sends it (`HitlAnswer`); the shard keeps
it here, in memory, and hands it on with the lane in a rollover (`LaneSnapshot.start.answers`).

A question's key is the program's, or by default "q1", "q2", ... in the order its run asks: a
re-run (from its last checkpoint, after a rollover, or from the start after its shard was lost)
asks again with the same key and gets the recorded answer at once.
"""

from __future__ import annotations

import asyncio

from orchestra_sup.protocol import frames as f


class Questions:
    """A lane's answers by key, the waiters of the questions its program waits on, and how many
    questions its run has asked. Lives on the shard's event loop.

    `answers` are those known when the lane was admitted (`LaneStart.answers`); `asked` is how
    many `ask_human` calls the run it resumes had made at its checkpoint (0 on a fresh start).
    """

    __slots__ = ("_waiters", "answers", "asked", "asked_at_checkpoint")

    def __init__(self, answers: dict[str, f.Answer] | None = None, asked: int = 0) -> None:
        self.answers: dict[str, f.Answer] = dict(answers or {})
        self._waiters: dict[str, asyncio.Future[f.Answer]] = {}
        self.asked = asked
        """`ask_human` calls so far in this run, counting those before its checkpoint."""
        self.asked_at_checkpoint = asked
        """`asked` when the program took its last checkpoint (what a snapshot carries)."""

    def next_key(self) -> str:
        """The default key of the run's next question: "q1", "q2", ..."""
        self.asked += 1
        return f"q{self.asked}"

    def install(self, key: str) -> asyncio.Future[f.Answer]:
        """A future that `answer(key, ...)` resolves. Raises `RuntimeError` when the program
        already waits on `key`."""
        if key in self._waiters:
            raise RuntimeError(f"the lane already waits for an answer to {key!r}")
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[key] = waiter
        return waiter

    def uninstall(self, key: str) -> None:
        """Forget `key`'s waiter (its wait ended, answered or cancelled)."""
        self._waiters.pop(key, None)

    def answer(self, key: str, answer: f.Answer) -> bool:
        """Keep `answer` to `key` and resolve its waiter, if one waits. False (nothing changes)
        when `key` was answered before: the first answer stands."""
        if key in self.answers:
            return False
        self.answers[key] = answer
        waiter = self._waiters.get(key)
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)
        return True

"""One change of the tree at a time: a config reload or a rollover.

A reload (`supervisor.reload`) restarts, adds and retires children; a rollover
(`supervisor.rollover`) stops, starts and surges them. Two of them at once would move the same
children under each other, so they exclude each other through one `ChangeGate`, which both
hold (and `ctl restart`, which is refused while either holds it). Each change runs as one task;
it holds the gate from the moment that task is made until it is done, so a change cancelled
before its first step (the tree stopping) lets go of it too.

Who asks says, in its own words, what is in progress (`Busy`, or an `Error(busy)` to a ctl
caller): the gate only tells what holds it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from orchestra_sup.errors import OrchestraError


class Busy(OrchestraError):
    """A change of the tree cannot begin now; `str()` says what is in progress."""


class Rolling(Protocol):
    """A rollover as the gate shows it: what `ctl rollover` follows it by."""

    @property
    def id(self) -> str: ...

    @property
    def target(self) -> str: ...


class ChangeGate:
    """Held by at most one change: a reload (`reloading`) or a rollover (`rollover`)."""

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = None
        self._rollover: Rolling | None = None

    def held(self) -> bool:
        """A change is in progress (its task is not done)."""
        return self._task is not None and not self._task.done()

    def reloading(self) -> bool:
        """A config reload holds the gate."""
        return self.held() and self._rollover is None

    def rollover(self) -> Rolling | None:
        """The rollover that holds the gate, if one does."""
        return self._rollover if self.held() else None

    def enter(self, task: asyncio.Task[Any], rollover: Rolling | None = None) -> None:
        """Let `task` hold the gate until it is done: `rollover`'s, or a reload's (None). The
        caller has checked the gate is free (`held`); entering a held gate is a bug
        (`AssertionError`)."""
        assert not self.held(), "the tree is already being changed"
        self._task, self._rollover = task, rollover

"""A state machine's allowed transitions: one table type, one check, one error.

Every lifecycle with a table (a task's `TaskStatus` in the coordinator, a lane's `LaneState` in
its shard, a child's `ChildState` in the supervisor) keeps it as a `Transitions` and changes state
only through its one writer, which asks `Transitions.move` first:

    TRANSITIONS = Transitions("lane", {LaneState.STARTING: {LaneState.RUNNING, ...}, ...})
    self.state = TRANSITIONS.move(self.state, new, what=f"lane {self.id}")

Standard library only: every layer may use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

from orchestra_sup.errors import OrchestraError

S = TypeVar("S")


class ForbiddenTransition(OrchestraError, ValueError):
    """A move its table does not allow: a bug in the state's one writer. The message reads
    "WHAT: no transition from SOURCE to TARGET"; `source` and `target` are the states."""

    def __init__(self, what: str, source: object, target: object) -> None:
        super().__init__(f"{what}: no transition from {source} to {target}")
        self.source = source
        self.target = target


class Transitions(Mapping[S, frozenset[S]], Generic[S]):
    """A read-only table: each state -> the states it may move to (a state missing from the
    table moves nowhere). `name` says whose states they are, for the error."""

    def __init__(self, name: str, table: Mapping[S, Iterable[S]]) -> None:
        self.name = name
        self._table = {state: frozenset(targets) for state, targets in table.items()}

    def __getitem__(self, state: S) -> frozenset[S]:
        return self._table[state]

    def __iter__(self) -> Iterator[S]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def allows(self, source: S, target: S) -> bool:
        """Whether the table allows `source` -> `target`."""
        return target in self._table.get(source, ())

    def move(self, source: S, target: S, *, what: str | None = None) -> S:
        """`target`, once the table allows `source` -> `target`. Raises `ForbiddenTransition`
        (a `ValueError`, its message naming `what`, default the table's name) when it does
        not."""
        if not self.allows(source, target):
            raise ForbiddenTransition(what or self.name, source, target)
        return target

"""What a supervisor writes to the tree's event log (`state.events`): its children's states,
and what its collaborators tell it (escalations, rollovers, reloads).

The log is open while the supervisor holds the state directory (`RootSupervisor.run`), closed
(flushed) before a re-exec and opened again by the new image or after a failed exec; an event
emitted while it is closed is dropped, never raised: recording must not fail what it records.
"""

from __future__ import annotations

from pathlib import Path

from orchestra_sup.state.events import EventLog
from orchestra_sup.supervisor.core import Worker
from orchestra_sup.supervisor.process import describe
from orchestra_sup.supervisor.spec import ChildState
from orchestra_sup.system import cpupolicy


class SupervisorEvents:
    """The event log as one supervisor writes it, as `source` ("supervisor", or on a host's
    agent "<host>/supervisor")."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.log: EventLog | None = None
        self._told: dict[str, tuple[int, ChildState]] = {}
        """Each child's (generation, state) its last event told."""
        self.adopting = False
        """While a re-executed image adopts its running children (`reexec.adopt`): their
        states are taken as told, since nothing happened to them."""

    def open(self, state_dir: Path) -> None:
        """Open the log of `state_dir`. Raises `StateError` when it cannot be opened."""
        if self.log is None:  # its thread in real time, two below the loop: on no turn's path
            below = cpupolicy.same_class(below=2)
            self.log = EventLog.open(state_dir, self.source, thread_start=below)

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None

    def emit(self, kind: str, **fields: str) -> None:
        """One event (`EventLog.emit`'s fields); nothing while the log is closed."""
        if self.log is not None:
            self.log.emit(kind, **fields)

    def child(self, worker: Worker) -> None:
        """`worker` changed: one event per state its process reaches (`child.<state>`: starting,
        running, stopping, exited, backoff, stopped), once each."""
        now = (worker.generation, worker.state)
        if self._told.get(worker.name) == now:
            return
        self._told[worker.name] = now
        if self.adopting:
            return
        detail = f"generation {worker.generation}"
        if worker.state is ChildState.EXITED and worker.last_exit is not None:
            detail += f": {describe(worker.last_exit)} ({worker.last_cause})"
        elif worker.state is ChildState.STARTING and worker.restarts:
            detail += f", restart {worker.restarts}"
        self.emit(f"child.{worker.state}", child=worker.name, detail=detail)

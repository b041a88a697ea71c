"""Where a node runs: a process of its own, or a component of the supervisor's own process.

A node's code is the same either way (`runtime.node`); what differs is what the process around
it is, and that is here:

- `OwnProcess` (a child process, the default): its own ZeroMQ context, terminated when the node
  stops, and its own process title; before anything else it arms `PR_SET_PDEATHSIG` (and stops
  at once when its supervisor is already gone), raises its soft open-file limit to its hard
  limit and stops on SIGTERM and SIGINT; its sockets are `ipc://` in the run directory.
- `InSupervisor` (`start --colocated`, `supervisor/colocated.py`): the supervisor's context,
  shared and left open; no title, no death signal, no signal handlers (the supervisor's are the
  process's); its sockets are `inproc://` on that context.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from typing import Protocol

import zmq

from orchestra_sup.paths import Paths
from orchestra_sup.system import cpupolicy, descriptors, linux
from orchestra_sup.system.proctitle import ProcTitle


class Hosting(Protocol):
    """What a node asks of the process it runs in. `ctx` is the context its sockets are made
    on; `title` is the process title it shows its figure in (None: it has none)."""

    ctx: zmq.Context
    title: ProcTitle | None

    def arm(self, stop: Callable[[], None], supervisor_pid: int) -> bool:
        """Prepare the process, on the loop, before the role opens: `stop` is what a stop
        signal calls. False when the node must exit at once (its supervisor, `supervisor_pid`,
        is gone)."""

    def endpoint(self, paths: Paths, name: str) -> str:
        """Where `name` (a child, or "supervisor": the control socket) is reached by default."""

    def end(self) -> None:
        """The node has stopped and closed its sockets."""


class OwnProcess:
    """A node that is a child process of its own."""

    def __init__(self) -> None:
        self.ctx = cpupolicy.context()  # its I/O threads in this process's class
        self.title: ProcTitle | None = ProcTitle()

    def arm(self, stop: Callable[[], None], supervisor_pid: int) -> bool:
        linux.set_parent_death_signal()
        if os.getppid() != supervisor_pid:
            return False  # orphaned before the death signal was armed
        descriptors.raise_limit()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)
        return True

    def endpoint(self, paths: Paths, name: str) -> str:
        return paths.endpoint(name)

    def end(self) -> None:
        self.ctx.term()


class InSupervisor:
    """A node that is a component of the supervisor's process and loop, on its context `ctx`."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.ctx = ctx
        self.title: ProcTitle | None = None

    def arm(self, stop: Callable[[], None], supervisor_pid: int) -> bool:
        return True

    def endpoint(self, paths: Paths, name: str) -> str:
        return f"inproc://{name}"

    def end(self) -> None:
        """The shared context stays open: it is the supervisor's."""

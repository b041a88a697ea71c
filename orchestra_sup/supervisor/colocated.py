"""A `core.Seam` whose children are components of the supervisor's own process and event loop.

`orchestra-sup start --colocated` runs the tree the way the seeds' platform ran before it was
separated (seeds/000): the coordinator, the custodian and the shards as `Node`s on one loop, in
one process, talking over ZeroMQ `inproc://` on one shared context. Supervision, handshakes,
rosters, relays and roles are the same code as in a separated tree; only this seam differs. It
exists as the "before" picture for `bench isolation`, not for production: one slow handler, one
burst of lane output or one crash reaches every role at once, which is the point.

Mapping of the seam's operations:

- `spawn`: create the role and its `Node` (`runtime.hosting.InSupervisor`: no death signal, no
  signal handlers, the shared context) and run it as a task; ready once its `Hello` is
  welcomed, as a process is.
- `signal`: SIGTERM and SIGINT ask the node to stop as the signal would; SIGKILL cancels its task
  (no cleanup runs, as with the real signal). Other signals cannot be delivered to a component
  (False).
- exit: the task's end. A return is `ExitInfo(status=code)`, a cancellation
  `ExitInfo(signal=SIGKILL)`, an exception `ExitInfo(status=1)` (logged).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable

import zmq

from orchestra_sup.errors import ChildStartError
from orchestra_sup.node.roles import make_role
from orchestra_sup.protocol.childargs import ChildArgs
from orchestra_sup.protocol.frames import ExitInfo
from orchestra_sup.runtime.hosting import InSupervisor
from orchestra_sup.runtime.node import Node
from orchestra_sup.supervisor.core import Worker
from orchestra_sup.supervisor.seam import LoopSeam

log = logging.getLogger("orchestra_sup.supervisor")

HANDSHAKE_TIMEOUT_S = 15.0


class ColocatedSeam(LoopSeam):
    """Spawns workers as `Node` tasks on the running loop, sharing `ctx`.

    `make_args`, `after_exit` and `changed` are as for `seam.ProcessSeam`. `release` is the
    supervisor's own interpreter, which every component runs.
    """

    unmovable: str | None = "a colocated tree runs every role in the supervisor's own process"
    """Why the tree cannot move onto another release: a rollover is refused with it."""

    def __init__(
        self,
        ctx: zmq.Context,
        make_args: Callable[[Worker], ChildArgs],
        after_exit: Callable[[Worker, int], None],
        changed: Callable[[Worker], None],
    ):
        super().__init__(make_args, after_exit, changed)
        self.ctx = ctx
        self.nodes: dict[str, tuple[Node, asyncio.Task[int]]] = {}

    def endpoint(self, name: str) -> str:
        """Where component `name` (or, for "supervisor", the control socket) is reached:
        `inproc://<name>` on the shared context."""
        return f"inproc://{name}"

    def child_endpoint(self, worker: Worker) -> str:
        """Where `worker`'s component at `worker.generation` binds: `inproc://<name>.<generation>`
        always, since libzmq unbinds a closed inproc socket later, on its reaper thread, and
        the next generation binds at once."""
        return self.endpoint(f"{worker.name}.{worker.generation}")

    def known_pids(self) -> set[int]:
        return set()

    def spawning_helper(self) -> bool:
        """No helper is ever spawned (a colocated tree is never rolled over)."""
        return False

    def watch_orphans(self, loop: asyncio.AbstractEventLoop) -> None:
        """Nothing to watch: the lanes' commands, this process's only children, are waited for
        by asyncio's child watcher, and no orphan is reaped here."""

    def kill_orphans(self) -> None:
        """Nothing to kill: this process is no subreaper (`watch_orphans`), so nothing is
        reparented to it."""

    def close_context(self, ctx: zmq.Context) -> None:
        """Destroy the shared context: a component SIGKILLed (its task cancelled) may still
        hold sockets on it, which `term` would wait for."""
        ctx.destroy(linger=0)

    async def open(self) -> None:
        """Nothing to prepare: no process is ever started (`seam.ProcessSeam.open` starts its
        fork template)."""

    async def close(self) -> None:
        """Nothing to stop."""

    def on_sigchld(self) -> None:
        """Nothing to do: components are not processes, and the lanes' commands are the
        children of this process that asyncio's child watcher waits for."""

    async def spawn(self, worker: Worker) -> None:
        loop = asyncio.get_running_loop()
        args = self._make_args(worker)
        try:
            node = Node(args, make_role(args.role), hosting=InSupervisor(self.ctx))
        except Exception as exc:
            raise ChildStartError(worker.name, f"cannot create the component: {exc}") from exc
        welcomed: asyncio.Future[None] = loop.create_future()
        self._welcomed[worker.name] = welcomed
        task = loop.create_task(node.run(), name=f"{worker.name}.{worker.generation}")
        self.nodes[worker.name] = (node, task)
        worker.pid = os.getpid()
        task.add_done_callback(lambda t: self._ended(worker, t))
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                await asyncio.shield(welcomed)
        except TimeoutError:
            task.cancel()
            raise ChildStartError(
                worker.name, f"no handshake within {HANDSHAKE_TIMEOUT_S:g} s"
            ) from None
        finally:
            self._welcomed.pop(worker.name, None)

    def welcome(self, name: str, generation: int, pid: int, worker: Worker | None) -> str | None:
        """Accept a `Hello` from the component spawned for `worker`; returns why not, or None."""
        welcomed = self._welcomed.get(name)
        if worker is None or name not in self.nodes or welcomed is None or welcomed.done():
            return f"{name} is not starting"
        if generation != worker.generation or pid != os.getpid():
            return f"{name} generation {generation} pid {pid} is not expected"
        welcomed.set_result(None)
        return None

    def signal(self, worker: Worker, sig: int) -> bool:
        entry = self.nodes.get(worker.name)
        if entry is None or entry[1].done():
            return False
        node, task = entry
        if sig in (signal.SIGTERM, signal.SIGINT):
            node.stopping.set()
            return True
        if sig == signal.SIGKILL:
            task.cancel()
            return True
        return False

    def _ended(self, worker: Worker, task: asyncio.Task[int]) -> None:
        entry = self.nodes.get(worker.name)
        if entry is None or entry[1] is not task:
            return
        del self.nodes[worker.name]
        if task.cancelled():
            info = ExitInfo(signal=signal.SIGKILL)
        elif task.exception() is not None:
            log.error("component %s failed", worker.name, exc_info=task.exception())
            info = ExitInfo(status=1)
        else:
            info = ExitInfo(status=task.result())
        log.info("component %s gen=%d ended: %s", worker.name, worker.generation, info)
        welcomed = self._welcomed.get(worker.name)
        if welcomed is not None and not welcomed.done():
            welcomed.set_exception(
                ChildStartError(worker.name, f"ended before its handshake: {info}")
            )
            welcomed.exception()
        self._after_exit(worker, worker.generation)
        worker.on_exit(info)

"""The real `core.Seam`: child processes, their handshakes and their exits.

`spawn` starts `python -m orchestra_sup.node '<ChildArgs>'` as its own process group from the
loop thread (so the child's parent-death signal stays armed for the supervisor's life), watches
its pidfd on the loop, and returns once the child's `Hello` has been welcomed (`welcome`), under a
deadline. When the pidfd turns readable the process is reaped, what it left behind is killed
(`after_exit`), and the worker is told (`Worker.on_exit`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Callable

from orchestra_sup.errors import ChildStartError
from orchestra_sup.node.args import ChildArgs, encode
from orchestra_sup.protocol.frames import ExitInfo
from orchestra_sup.supervisor.core import Worker
from orchestra_sup.supervisor.process import ChildProcess, reap_orphans

log = logging.getLogger("orchestra_sup.supervisor")

HANDSHAKE_TIMEOUT_S = 15.0


class ProcessSeam:
    """Spawns workers as OS processes.

    `make_args(worker)` builds the child's `ChildArgs`; `after_exit(worker)` runs after a
    worker's process was reaped, before the worker is told (kill its leftovers);
    `changed(worker)` is called on every state change.
    """

    def __init__(
        self,
        make_args: Callable[[Worker], ChildArgs],
        after_exit: Callable[[Worker], None],
        changed: Callable[[Worker], None],
    ):
        self._make_args = make_args
        self._after_exit = after_exit
        self._changed = changed
        self.procs: dict[str, ChildProcess] = {}
        self._workers: dict[str, Worker] = {}
        self._welcomed: dict[str, asyncio.Future[None]] = {}

    def clock(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def changed(self, worker: Worker) -> None:
        self._changed(worker)

    def known_pids(self) -> set[int]:
        return {proc.pid for proc in self.procs.values()}

    async def spawn(self, worker: Worker) -> None:
        loop = asyncio.get_running_loop()
        argv = [sys.executable, "-m", "orchestra_sup.node", encode(self._make_args(worker))]
        try:
            proc = ChildProcess.spawn(argv)
        except OSError as exc:
            raise ChildStartError(worker.name, f"cannot exec {argv[0]}: {exc}") from exc
        welcomed: asyncio.Future[None] = loop.create_future()
        self.procs[worker.name] = proc
        self._workers[worker.name] = worker
        self._welcomed[worker.name] = welcomed
        worker.pid = proc.pid
        proc.watch(loop.add_reader, lambda: self._reap(worker, proc))
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                await asyncio.shield(welcomed)
        except TimeoutError:
            proc.signal(signal.SIGKILL)
            raise ChildStartError(
                worker.name, f"no handshake within {HANDSHAKE_TIMEOUT_S:g} s"
            ) from None
        finally:
            self._welcomed.pop(worker.name, None)

    def welcome(self, name: str, generation: int, pid: int, worker: Worker | None) -> str | None:
        """Accept a `Hello` from the process spawned for `worker`; returns why not, or None."""
        proc = self.procs.get(name)
        welcomed = self._welcomed.get(name)
        if worker is None or proc is None or welcomed is None or welcomed.done():
            return f"{name} is not starting"
        if generation != worker.generation or pid != proc.pid:
            return f"{name} generation {generation} pid {pid} is not expected"
        welcomed.set_result(None)
        return None

    def signal(self, worker: Worker, sig: int) -> bool:
        proc = self.procs.get(worker.name)
        return proc.signal(sig) if proc is not None else False

    def on_sigchld(self) -> None:
        """Reap orphans reparented to us; hand exited known children to their pidfd path."""
        by_pid = {proc.pid: name for name, proc in self.procs.items()}
        reap_orphans(by_pid.keys(), lambda pid: self._reap_pid(by_pid[pid]))

    def _reap_pid(self, name: str) -> None:
        proc = self.procs.get(name)
        worker = self._workers.get(name)
        if proc is not None and worker is not None:
            self._reap(worker, proc)

    def _reap(self, worker: Worker, proc: ChildProcess) -> None:
        exit_info = proc.reap(asyncio.get_running_loop().remove_reader)
        if exit_info is None or self.procs.get(worker.name) is not proc:
            return
        del self.procs[worker.name]
        log.info(
            "child %s gen=%d pid=%d exited: %s",
            worker.name,
            worker.generation,
            proc.pid,
            describe(exit_info),
        )
        welcomed = self._welcomed.get(worker.name)
        if welcomed is not None and not welcomed.done():
            welcomed.set_exception(ChildStartError(worker.name, describe(exit_info)))
            welcomed.exception()  # retrieved: spawn() re-raises it
        self._after_exit(worker)
        worker.on_exit(exit_info)


def describe(exit_info: ExitInfo) -> str:
    if exit_info.signal is not None:
        return f"killed by signal {exit_info.signal}"
    return f"exited with status {exit_info.status}"

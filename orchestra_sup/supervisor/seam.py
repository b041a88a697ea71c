"""The real `core.Seam`: child processes, their handshakes and their exits.

`spawn` forks the child from the fork template (`supervisor.template`, when `[supervisor] spawn`
is `fork` and the template is ready), or else starts `python -m orchestra_sup.node '<ChildArgs>'`
as its own process group from the loop thread (so the child's parent-death signal stays armed for
the supervisor's life). Either way it watches the child's pidfd on the loop and returns once the
child's `Hello` has been welcomed (`welcome`), under a deadline. When the pidfd turns readable the
process is reaped, what it left behind is killed (`after_exit`), and the worker is told
(`Worker.on_exit`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Callable

import zmq

from orchestra_sup.errors import ChildStartError
from orchestra_sup.paths import Paths
from orchestra_sup.protocol.childargs import ChildArgs, encode
from orchestra_sup.protocol.frames import ExitInfo
from orchestra_sup.release import SPAWNING
from orchestra_sup.supervisor.core import Worker
from orchestra_sup.supervisor.process import ChildProcess, describe, kill_orphans, reap_orphans
from orchestra_sup.supervisor.template import ForkTemplate
from orchestra_sup.system import linux

log = logging.getLogger("orchestra_sup.supervisor")

HANDSHAKE_TIMEOUT_S = 15.0


class LoopSeam:
    """What every seam of the root supervisor shares: the loop's monotonic clock and sleep, the
    root's callbacks (`make_args`, `after_exit`, `changed`: see `ProcessSeam`), and `release`,
    the interpreter the supervisor itself runs."""

    pinned: str | None = None
    """Why the supervisor itself cannot re-execute in place, while its children still roll over
    (None: it can). A host's agent sets it (`supervisor.hostlink`)."""

    def __init__(
        self,
        make_args: Callable[[Worker], ChildArgs],
        after_exit: Callable[[Worker, int], None],
        changed: Callable[[Worker], None],
    ):
        self._make_args = make_args
        self._after_exit = after_exit
        self._changed = changed
        self.release = sys.executable
        self._welcomed: dict[str, asyncio.Future[None]] = {}

    def clock(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def changed(self, worker: Worker) -> None:
        self._changed(worker)


class ProcessSeam(LoopSeam):
    """Spawns workers as OS processes.

    `make_args(worker)` builds the child's `ChildArgs`; `after_exit(worker, generation)` runs
    after the process of `worker` at `generation` was reaped, before the worker is told (kill its
    leftovers);
    `changed(worker)` is called on every state change; `template` is the fork template children
    are forked from (None: every child is a fresh interpreter). `open` starts it, `close` stops it.
    `release` is the interpreter the supervisor itself runs: the template is of that release, so
    only a worker of that release (or of none named) is forked from it; any other is exec'd as
    `worker.release -m orchestra_sup.node`. `paths` says where the children's `ipc://` sockets
    are (`endpoint`; None: not to be asked).
    """

    unmovable: str | None = None
    """Why the tree's processes cannot move onto another release (None: they can)."""

    def __init__(
        self,
        make_args: Callable[[Worker], ChildArgs],
        after_exit: Callable[[Worker, int], None],
        changed: Callable[[Worker], None],
        template: ForkTemplate | None = None,
        *,
        paths: Paths | None = None,
    ):
        super().__init__(make_args, after_exit, changed)
        self.template = template
        self.paths = paths
        self.procs: dict[str, ChildProcess] = {}
        self.retiring: dict[tuple[str, int], ChildProcess] = {}
        """Processes set aside by a surge, by (name, generation), until they exit."""
        self._retired: dict[tuple[str, int], asyncio.Future[ExitInfo]] = {}
        self._workers: dict[str, Worker] = {}
        self.helpers: set[int] = set()
        """Pids of short-lived helpers the supervisor runs and waits for itself (a release's
        probe): known, so the orphan reaper and killer leave them alone."""
        self._forked: dict[str, int] = {}
        """The pid of a child forked from the template, from before it is released (when it may
        already say hello) until it is held in `procs`."""

    def endpoint(self, name: str) -> str:
        """Where child `name` (or, for "supervisor", the control socket) is reached by the
        children: `ipc://` in the run directory."""
        assert self.paths is not None
        return self.paths.endpoint(name)

    def child_endpoint(self, worker: Worker) -> str:
        """Where `worker`'s process at `worker.generation` binds: its name's `endpoint`, or,
        for a surge generation (it binds beside the running one, which still holds
        `<name>.ipc`), `<name>.<generation>`'s."""
        beside = worker.retiring is not None
        return self.endpoint(f"{worker.name}.{worker.generation}" if beside else worker.name)

    def watch_orphans(self, loop: asyncio.AbstractEventLoop) -> None:
        """Become the children's subreaper (kept across a re-exec's execve; said again anyway)
        and reap on every SIGCHLD (`on_sigchld`)."""
        linux.set_child_subreaper()
        loop.add_signal_handler(signal.SIGCHLD, self.on_sigchld)

    def kill_orphans(self) -> None:
        """SIGKILL what was reparented to this supervisor and is not known (`known_pids`):
        what dead children left behind (`process.kill_orphans`)."""
        kill_orphans(self.known_pids())

    def close_context(self, ctx: zmq.Context) -> None:
        """Terminate the supervisor's context, its sockets closed (no child shares it)."""
        ctx.term()

    async def open(self) -> None:
        """Start the fork template, if there is one (bounded; a template that does not come up
        only means children start as fresh interpreters until it does)."""
        if self.template is not None:
            await self.template.start()

    async def close(self) -> None:
        """Stop the fork template, if there is one, and reap it."""
        if self.template is not None:
            await self.template.close()

    def known_pids(self) -> set[int]:
        """Every live process this seam started and holds: children, template, adoptees."""
        pids = {proc.pid for proc in (*self.procs.values(), *self.retiring.values())}
        pids |= self.helpers
        if self.template is not None:
            pids |= self.template.known_pids()
        return pids

    async def spawn(self, worker: Worker) -> None:
        loop = asyncio.get_running_loop()
        welcomed: asyncio.Future[None] = loop.create_future()
        self._welcomed[worker.name] = welcomed
        # Shielded: stopping the tree may cancel a start while the template forks; the child it
        # forks must still end up held and watched, so stopping its worker waits on a real exit.
        started = loop.create_task(self._start(worker))
        started.add_done_callback(_retrieve)  # its error is re-raised here, if still awaited
        try:
            proc = await asyncio.shield(started)
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                await asyncio.shield(welcomed)
        except TimeoutError:
            proc.signal(signal.SIGKILL)
            raise ChildStartError(
                worker.name, f"no handshake within {HANDSHAKE_TIMEOUT_S:g} s"
            ) from None
        finally:
            self._welcomed.pop(worker.name, None)

    async def _start(self, worker: Worker) -> ChildProcess:
        """Fork or exec `worker`'s process, then hold and watch it, in the same step as the
        fork returns (so no orphan reaping runs in between); returns it. Raises
        `ChildStartError` when exec fails."""
        args = self._make_args(worker)
        release = worker.release or self.release
        proc = None
        if self.template is not None and release == self.release:
            try:
                proc = await self.template.fork(
                    args, lambda pid: self._forked.__setitem__(worker.name, pid)
                )
            finally:
                self._forked.pop(worker.name, None)
        if proc is None:
            argv = [release, "-m", "orchestra_sup.node", encode(args)]
            try:
                proc = ChildProcess.spawn(argv)
            except OSError as exc:
                raise ChildStartError(worker.name, f"cannot exec {argv[0]}: {exc}") from exc
        log.info(
            "child %s gen=%d pid=%d %s",
            worker.name,
            worker.generation,
            proc.pid,
            "exec'd" if proc.popen is not None else "forked from the template",
        )
        self.procs[worker.name] = proc
        self._workers[worker.name] = worker
        worker.pid = proc.pid
        proc.watch(asyncio.get_running_loop().add_reader, lambda: self._reap(worker, proc))
        return proc

    def set_aside(self, worker: Worker) -> None:
        key = (worker.name, worker.generation)
        self.retiring[key] = self.procs.pop(worker.name)
        self._retired[key] = asyncio.get_running_loop().create_future()

    def reinstate(self, worker: Worker, generation: int) -> None:
        key = (worker.name, generation)
        self.procs[worker.name] = self.retiring.pop(key)
        self._retired.pop(key).cancel()

    def signal_retiring(self, name: str, generation: int, sig: int) -> bool:
        """Signal the set-aside process of `name` at `generation`; False when it is gone."""
        proc = self.retiring.get((name, generation))
        return proc.signal(sig) if proc is not None else False

    async def wait_retired(self, name: str, generation: int) -> ExitInfo:
        """Wait for the set-aside process of `name` at `generation` to exit and be reaped; its
        exit. Raises `KeyError` when no such process was set aside (or it was waited for)."""
        key = (name, generation)
        try:
            return await asyncio.shield(self._retired[key])
        finally:
            if self._retired[key].done():
                del self._retired[key]

    def adopt(self, worker: Worker, pid: int, create_time: float) -> bool:
        """Hold and watch `worker`'s running process `pid`, started by the image this
        supervisor was before it re-executed itself (`supervisor.reexec`; `worker.resume` came
        first). `create_time` is the one recorded then (psutil's, seconds since the epoch).

        True when `pid` is still that process (alive, or a zombie: one that exited during the
        exec is reaped through its pidfd, by the normal path). False when it is gone or its
        create time differs (another process has the pid): nothing is held or signalled, and
        the exit is reported as if reaped, with no status (its parent then decides on a
        restart). Either way the exit is handled on a later loop step, so a caller adopting
        every child in one step has them all held before any exit's clean-up looks for
        orphans (which would take a child not yet adopted for one)."""
        try:
            proc = ChildProcess.adopt(pid)
        except ProcessLookupError:
            proc = None
        if proc is None or proc.create_time != create_time:
            if proc is not None:
                proc.abandon()
            log.warning("child %s gen=%d pid=%d is gone", worker.name, worker.generation, pid)
            asyncio.get_running_loop().call_soon(self._lost, worker)
            return False
        log.info("child %s gen=%d pid=%d adopted", worker.name, worker.generation, pid)
        self.procs[worker.name] = proc
        self._workers[worker.name] = worker
        worker.pid = pid
        proc.watch(asyncio.get_running_loop().add_reader, lambda: self._reap(worker, proc))
        return True

    def _lost(self, worker: Worker) -> None:
        self._after_exit(worker, worker.generation)
        worker.on_exit(ExitInfo(status=None, signal=None))

    def welcome(self, name: str, generation: int, pid: int, worker: Worker | None) -> str | None:
        """Accept a `Hello` from the process spawned for `worker`; returns why not, or None."""
        proc = self.procs.get(name)
        expected = proc.pid if proc is not None else self._forked.get(name)
        welcomed = self._welcomed.get(name)
        if worker is None or expected is None or welcomed is None or welcomed.done():
            return f"{name} is not starting"
        if generation != worker.generation or pid != expected:
            return f"{name} generation {generation} pid {pid} is not expected"
        welcomed.set_result(None)
        return None

    def signal(self, worker: Worker, sig: int) -> bool:
        proc = self.procs.get(worker.name)
        return proc.signal(sig) if proc is not None else False

    def on_sigchld(self) -> None:
        """Reap orphans reparented to us; hand exited known children (and the template) to
        their pidfd path. A child being adopted from the template is left alone: its pidfd path
        comes next."""
        if self.spawning_helper():
            return  # an unknown child may be that helper: the next SIGCHLD reaps orphans
        by_pid = {proc.pid: name for name, proc in self.procs.items()}
        reap_orphans(self.known_pids(), lambda pid: self._reap_pid(pid, by_pid.get(pid)))

    def spawning_helper(self) -> bool:
        """A helper (`helpers`) is being spawned and its pid is not known yet."""
        return SPAWNING in self.helpers

    def _reap_pid(self, pid: int, name: str | None) -> None:
        template = self.template
        if template is not None and template.proc is not None and pid == template.proc.pid:
            template.reap()
            return
        for (retiring, _gen), proc in list(self.retiring.items()):
            if proc.pid == pid:
                self._reap(self._workers[retiring], proc)
                return
        proc = self.procs.get(name) if name is not None else None
        worker = self._workers.get(name) if name is not None else None
        if proc is not None and worker is not None:
            self._reap(worker, proc)

    def _reap(self, worker: Worker, proc: ChildProcess) -> None:
        exit_info = proc.reap(asyncio.get_running_loop().remove_reader)
        if exit_info is None:
            return
        retiring = next((key for key, p in self.retiring.items() if p is proc), None)
        if retiring is not None:  # set aside by a surge: cleaned up, not the worker's exit
            del self.retiring[retiring]
            log.info(
                "child %s gen=%d pid=%d (retiring) exited: %s",
                worker.name,
                retiring[1],
                proc.pid,
                describe(exit_info),
            )
            self._after_exit(worker, retiring[1])
            self._retired[retiring].set_result(exit_info)
            return
        if self.procs.get(worker.name) is not proc:
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
        self._after_exit(worker, worker.generation)
        worker.on_exit(exit_info)


def _retrieve(task: asyncio.Task[ChildProcess]) -> None:
    if not task.cancelled():
        task.exception()

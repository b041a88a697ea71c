"""OTP supervision of OS processes, written against a narrow seam onto the OS.

The model is Erlang/OTP's `supervisor.erl`:

- A supervisor has an ordered list of children (workers, or supervisors of their own), starts
  them in order, stops them in reverse, and unwinds (stops what it started, in reverse) when one
  fails to start.
- When a child exits, one decision (`should_restart`) over its restart type and the kind of exit
  says whether anything happens; the strategy (`victims`) says which children restart with it:
  one_for_one (just it), one_for_all (every child), rest_for_one (it and the ones started after
  it). Siblings that restart with it are stopped in reverse order first, then all of them start
  in order.
- Restart intensity: more than `max_restarts` restarts within `max_seconds` (the injected
  monotonic clock) mean the fault is not transient; the supervisor stops its children and
  escalates: a sub-supervisor counts as a child that exited abnormally in its parent, the root
  calls `on_give_up`.
- A restart that fails to start is not retried in a loop: the child's exit is reported like any
  other, counted, and decided again (OTP's `try_again_restart`).

On top of OTP, a worker's repeated restarts back off (`intensity.Backoff`): the first is
immediate, later ones wait, reset once the child stayed up `max_seconds`. Restarts an operator
asks for (`restart_worker`), and lease kills (`ExitCause.LEASE`), are not failures.

All OS work goes through `Seam`: this module is tested over a fake seam and clock
(tests/unit/test_supervision_matrix.py) and on real processes. All methods run on one loop; the
one lock serialises a supervisor's restarts, as a supervisor process takes one message at a time.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import signal
from collections.abc import Callable, Iterator
from typing import Protocol

import msgspec

from orchestra_sup.errors import ChildStartError
from orchestra_sup.protocol.frames import ExitInfo
from orchestra_sup.supervisor.intensity import Backoff, RestartIntensity
from orchestra_sup.supervisor.spec import ALLOWED, ChildSpec, ChildState, Restart

log = logging.getLogger("orchestra_sup.supervisor")


class Strategy(enum.StrEnum):
    """Which children restart when one of them has to (OTP restart strategies)."""

    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"
    REST_FOR_ONE = "rest_for_one"


class ExitKind(enum.StrEnum):
    """How a child ended, as OTP sees an exit reason.

    - `normal`: it exited with status 0 (OTP `normal`).
    - `shutdown`: SIGTERM ended it, or it exited 143 after one, without this supervisor asking
      (OTP `shutdown`: someone told it to stop).
    - `abnormal`: anything else: a non-zero status, any other signal.
    """

    NORMAL = "normal"
    SHUTDOWN = "shutdown"
    ABNORMAL = "abnormal"


def classify(exit_info: ExitInfo) -> ExitKind:
    """The `ExitKind` of a process's exit status."""
    if exit_info.status == 0:
        return ExitKind.NORMAL
    if exit_info.signal == signal.SIGTERM or exit_info.status == 128 + signal.SIGTERM:
        return ExitKind.SHUTDOWN
    return ExitKind.ABNORMAL


class ExitCause(enum.StrEnum):
    """Why a child's process ended, as the metrics count it (`Worker.exits`).

    - `clean`: it exited with status 0 unasked.
    - `exit_code`: it exited with another status unasked.
    - `signal`: a signal this supervisor did not send for a reason of its own ended it.
    - `watchdog`: the watchdog SIGKILLed it for its silence (`Worker.killed_for`).
    - `stopped`: its supervisor was stopping it: `ctl restart`, the tree stopping, a sibling's
      group restart (one_for_all, rest_for_one) or an escalation.
    - `unknown`: no status was seen (a process gone while a re-executed supervisor took its
      children back).
    - `lease`: its host's agent killed it for a lost lease: no intensity, no backoff.
    """

    CLEAN = "clean"
    EXIT_CODE = "exit_code"
    SIGNAL = "signal"
    WATCHDOG = "watchdog"
    STOPPED = "stopped"
    UNKNOWN = "unknown"
    LEASE = "lease"


def exit_cause(exit_info: ExitInfo, *, stopping: bool, killed_for: ExitCause | None) -> ExitCause:
    """The `ExitCause` of an exit: what the supervisor did to it first (`killed_for`, then
    `stopping`: it was being stopped), else what the status says."""
    if killed_for is not None:
        return killed_for
    if stopping:
        return ExitCause.STOPPED
    if exit_info.signal is not None:
        return ExitCause.SIGNAL
    if exit_info.status is None:
        return ExitCause.UNKNOWN
    return ExitCause.CLEAN if exit_info.status == 0 else ExitCause.EXIT_CODE


def should_restart(restart: Restart, kind: ExitKind) -> bool:
    """OTP's restart decision: permanent always, transient only after an abnormal exit,
    temporary never (`supervisor.erl`, `restart/2` and `do_restart/3`)."""
    if restart is Restart.PERMANENT:
        return True
    if restart is Restart.TRANSIENT:
        return kind is ExitKind.ABNORMAL
    return False


def victims(strategy: Strategy, order: list[str], failed: str) -> list[str]:
    """The children (in start order) that restart when `failed` must."""
    if strategy is Strategy.ONE_FOR_ONE:
        return [failed]
    if strategy is Strategy.ONE_FOR_ALL:
        return list(order)
    return order[order.index(failed) :]


class Flags(msgspec.Struct, frozen=True, kw_only=True):
    """A supervisor's flags (OTP `sup_flags()`), seconds as float."""

    strategy: Strategy = Strategy.ONE_FOR_ONE
    max_restarts: int = 5
    max_seconds: float = 30.0
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0


class Seam(Protocol):
    """What supervision needs from the OS (real: `root.ProcessSeam`; tests: a fake)."""

    def clock(self) -> float:
        """Monotonic seconds."""

    async def spawn(self, worker: Worker) -> None:
        """Start `worker`'s process at `worker.generation` and return once it is ready (its
        handshake). Raise `ChildStartError` when it exits first or misses its deadline. Later,
        call `worker.on_exit(info)` on the loop exactly once when that process has exited."""

    def set_aside(self, worker: Worker) -> None:
        """Surge: `worker`'s current process (at `worker.generation`) goes on running but is no
        longer the worker's: its exit is reaped and cleaned up without `on_exit`."""

    def reinstate(self, worker: Worker, generation: int) -> None:
        """Undo `set_aside`: the process of `generation` set aside is `worker`'s again."""

    def signal(self, worker: Worker, sig: int) -> bool:
        """Signal `worker`'s current process; False when it has none or it is gone."""

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` (backoff)."""

    def changed(self, worker: Worker) -> None:
        """`worker`'s state changed (the control record, the roster, notify STATUS)."""


class Worker:
    """A supervised OS process and its control record."""

    def __init__(self, spec: ChildSpec, flags: Flags, seam: Seam):
        self.spec = spec
        self.seam = seam
        self.parent: Supervisor | None = None
        self.generation = 0
        self.state = ChildState.STOPPED
        self.pid: int | None = None
        self.started_at = 0.0
        self.exited_at = 0.0
        self.restarts = 0
        self.operator_restarts = 0
        self.last_exit: ExitInfo | None = None
        self.last_cause: ExitCause | None = None  # the next process is told it: previous_exit
        self.exits = dict.fromkeys(ExitCause, 0)
        """Exits of its processes by cause since this supervisor started (metrics)."""
        self.killed_for: ExitCause | None = None
        """Set just before the supervisor kills the current process for a reason of its own
        (the watchdog), so its exit counts under that cause and not as a plain signal."""
        self.release = ""
        """The interpreter its processes run (`orchestra_sup.release`); "" = the supervisor's.
        A restart keeps it; only a rollover changes it."""
        self.version = ""
        """The orchestra-sup version its current process said in its handshake."""
        self.retiring: int | None = None
        """The generation of its previous process while that one still runs beside the current
        one (a surge, `start_beside`), else None."""
        self._surging = False
        self.leaving = False
        """Being retired from the tree (`Supervisor.remove_child` comes next): it keeps running
        but takes no new work, and an exit is not restarted."""
        self.backoff = Backoff(flags.backoff_initial_s, flags.backoff_max_s, flags.max_seconds)
        self._exited: asyncio.Future[None] | None = None
        self._wake: asyncio.Event | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    async def back_off(self, delay_s: float) -> None:
        """Wait out a restart backoff of `delay_s` seconds, unless `expedite` ends it early."""
        self._wake = asyncio.Event()
        sleep = asyncio.ensure_future(self.seam.sleep(delay_s))
        wake = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleep, wake}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (sleep, wake):
                waiter.cancel()
            self._wake = None

    def expedite(self) -> bool:
        """End a backoff in progress now (someone needs this child: a lane start found it
        down). Returns whether there was a backoff to end; a crashing child still counts
        towards intensity when it exits again."""
        if self.state is ChildState.BACKOFF and self._wake is not None:
            self._wake.set()
            return True
        return False

    def transition(self, new: ChildState) -> None:
        """The only writer of `state`. Raises `ForbiddenTransition` for a change `ALLOWED`
        does not allow: a bug in the supervisor."""
        ALLOWED.move(self.state, new, what=f"child {self.name}")
        log.info("child %s gen=%d %s -> %s", self.name, self.generation, self.state, new)
        self.state = new
        self.seam.changed(self)

    def uptime(self) -> float:
        if self.state in (ChildState.RUNNING, ChildState.STOPPING):
            return self.seam.clock() - self.started_at
        return 0.0

    async def start(self) -> None:
        """Spawn the next generation and wait for its handshake; raises `ChildStartError`."""
        self.generation += 1
        self.started_at = self.seam.clock()
        self.transition(ChildState.STARTING)
        self._exited = asyncio.get_running_loop().create_future()
        await self.seam.spawn(self)
        if self.state is ChildState.STARTING:
            self.started_at = self.seam.clock()
            self.transition(ChildState.RUNNING)

    async def start_beside(self) -> int:
        """Surge (a shard's rollover, ARCHITECTURE.md §9): start the next generation while the
        running process goes on beside it, set aside by the seam; returns the old generation,
        now in `retiring`. Whoever called this ends the old process and then calls
        `retired()`. Raises `ChildStartError` when the new process never becomes ready: the old
        one is then the worker's again (its generation, pid and version restored, running), and
        the failed start is not reported to the parent as an exit (nothing is restarted)."""
        assert self.state is ChildState.RUNNING, self.state
        old = (self.generation, self.pid, self.started_at, self.version)
        self.seam.set_aside(self)
        self.retiring = self.generation
        self._surging = True
        try:
            await self.start()
        except ChildStartError:
            await self.failed_start_gone()
            self.seam.reinstate(self, old[0])
            self.generation, self.pid, self.started_at, self.version = old
            self.retiring = None
            self._exited = asyncio.get_running_loop().create_future()  # the old one's exit
            self.transition(ChildState.RUNNING)
            raise
        finally:
            self._surging = False
        return old[0]

    async def failed_start_gone(self) -> None:
        """After a `ChildStartError`: return once the process that failed to start (if there
        was one) has exited and been reaped. One that missed its handshake deadline was only
        sent SIGKILL, and the worker stays starting until its exit is handled."""
        if self._exited is not None and self.seam.signal(self, 0):
            await asyncio.shield(self._exited)

    def retired(self) -> None:
        """The process `start_beside` set aside has exited: no longer report it."""
        self.retiring = None
        self.seam.changed(self)

    def resume(self, generation: int, started_at: float) -> None:
        """Take over generation `generation`'s running process instead of starting one: a
        supervisor that re-executed itself re-adopts its children (`supervisor.reexec`). The
        generation is kept, never bumped: it is the same process, still connected under the
        same routing id. `started_at` is when it started, monotonic seconds (the clock is the
        machine's, so it means the same across an exec). The worker goes stopped -> starting
        -> running at once; the caller then has the seam hold the process
        (`ProcessSeam.adopt`), which reports its exit from then on as for any start.
        Raises `AssertionError` unless the worker is stopped."""
        self.generation = generation
        self.transition(ChildState.STARTING)
        self._exited = asyncio.get_running_loop().create_future()
        self.transition(ChildState.RUNNING)
        self.started_at = started_at

    async def stop(self) -> None:
        """Ask, wait, kill, reap: SIGTERM, up to `shutdown_s`, then SIGKILL (`brutal_kill`:
        SIGKILL at once). Returns once the process has been reaped; a child without a process
        (exited, backing off) just becomes stopped."""
        if self.state in (ChildState.EXITED, ChildState.BACKOFF):
            self.transition(ChildState.STOPPED)
            return
        if self.state is ChildState.STOPPED:
            return
        exited = self._exited
        assert exited is not None
        if self.state is not ChildState.STOPPING:
            self.transition(ChildState.STOPPING)
        grace = self.spec.shutdown_s
        if grace is None:
            self.seam.signal(self, signal.SIGKILL)
        else:
            self.seam.signal(self, signal.SIGTERM)
            try:
                async with asyncio.timeout(grace):
                    await asyncio.shield(exited)
            except TimeoutError:
                log.warning("child %s ignored SIGTERM for %g s; killing", self.name, grace)
                self.seam.signal(self, signal.SIGKILL)
        await exited
        if self.state is ChildState.EXITED:
            self.transition(ChildState.STOPPED)

    def on_exit(self, exit_info: ExitInfo) -> None:
        """Called by the seam when this worker's process has exited and been reaped."""
        if self._surging:  # a surge's new process that never became ready: `start_beside`
            if self._exited is not None and not self._exited.done():
                self._exited.set_result(None)
            return
        self.last_exit = exit_info
        self.exited_at = self.seam.clock()
        self.pid = None
        was = self.state
        cause = exit_cause(
            exit_info, stopping=was is ChildState.STOPPING, killed_for=self.killed_for
        )
        self.exits[cause] += 1
        self.killed_for, self.last_cause = None, cause
        self.transition(ChildState.EXITED)
        if self._exited is not None and not self._exited.done():
            self._exited.set_result(None)
        if was is ChildState.STOPPING or self.parent is None:
            return
        self.parent.child_exited(self, classify(exit_info))


class Supervisor:
    """A supervisor node: flags, ordered children, restart intensity.

    `on_give_up` is called when this supervisor has no parent and its intensity is exceeded
    (the root: stop the tree, exit with a distinct status).
    """

    def __init__(
        self,
        name: str,
        flags: Flags,
        children: list[Worker | Supervisor],
        seam: Seam,
        *,
        restart: Restart = Restart.PERMANENT,
        on_give_up: Callable[[], None] | None = None,
    ):
        self.name = name
        self.flags = flags
        self.children = children
        self.seam = seam
        self.restart = restart
        self.parent: Supervisor | None = None
        self.on_give_up = on_give_up
        self.intensity = RestartIntensity(flags.max_restarts, flags.max_seconds, seam.clock)
        self.running = False
        self.escalated = False
        self.generation = 0
        """Incremented on every start, like a worker's: a restart decision names the generation
        it was taken for."""
        self._stopping = False
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        for child in children:
            child.parent = self

    # --- the tree --------------------------------------------------------------------------------

    def workers(self) -> Iterator[Worker]:
        """Every worker below this supervisor, in start order."""
        for child in self.children:
            if isinstance(child, Worker):
                yield child
            else:
                yield from child.workers()

    def supervisors(self) -> Iterator[Supervisor]:
        """This supervisor and every one below it, parents first (the order their restart
        locks nest in)."""
        yield self
        for child in self.children:
            if isinstance(child, Supervisor):
                yield from child.supervisors()

    def find(self, name: str) -> Worker | None:
        return next((w for w in self.workers() if w.name == name), None)

    # --- start and stop --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every child in order. If one fails to start, stop the started ones in reverse
        and raise its `ChildStartError` (OTP: start_children unwinds)."""
        self.generation += 1
        self._stopping = False
        self.escalated = False
        self.intensity = RestartIntensity(
            self.flags.max_restarts, self.flags.max_seconds, self.seam.clock
        )
        started: list[Worker | Supervisor] = []
        try:
            for child in self.children:
                await child.start()
                started.append(child)
        except ChildStartError:
            for child in reversed(started):
                await child.stop()
            await self._settle(self.children)
            raise
        self.running = True

    async def stop(self) -> None:
        """Stop every child in reverse start order; restarts in flight are abandoned."""
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        async with self._lock:
            for child in reversed(self.children):
                await child.stop()
        self.running = False

    async def _settle(self, children: list[Worker | Supervisor]) -> None:
        """Mark children that failed to start (exited, never welcomed) as stopped."""
        for child in children:
            if isinstance(child, Worker) and child.state is ChildState.EXITED:
                child.transition(ChildState.STOPPED)

    # --- failures --------------------------------------------------------------------------------

    def child_exited(self, child: Worker | Supervisor, kind: ExitKind) -> None:
        """A child exited on its own (or a sub-supervisor escalated): decide, on the loop.

        Nothing is restarted unless this supervisor is running: an exit reported while it starts
        (its start fails and unwinds), stops or has given up only settles the child as stopped.
        """
        leaving = isinstance(child, Worker) and child.leaving
        if not self.running or self._stopping or self.escalated or leaving:
            if isinstance(child, Worker) and child.state is ChildState.EXITED:
                child.transition(ChildState.STOPPED)
            return
        restart = child.spec.restart if isinstance(child, Worker) else child.restart
        if not should_restart(restart, kind):
            log.info("%s: %s exited (%s), %s: not restarted", self.name, child.name, kind, restart)
            if isinstance(child, Worker) and child.state is ChildState.EXITED:
                child.transition(ChildState.STOPPED)
            return
        lease = isinstance(child, Worker) and child.last_cause is ExitCause.LEASE  # no fault
        if not lease and not self.intensity.record():
            self._escalate()
            return
        names = [c.name for c in self.children]
        chosen = victims(self.flags.strategy, names, child.name)
        group = [c for c in self.children if c.name in chosen]
        self._spawn(self._restart(group, child, child.generation))

    def _spawn(self, coro: object) -> None:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restart(
        self, group: list[Worker | Supervisor], failed: Worker | Supervisor, generation: int
    ) -> None:
        async with self._lock:
            if self._stopping or self.escalated or failed.generation != generation:
                # Decided before we held the lock, and overtaken since: a group restart or an
                # operator restart already started this child again (OTP drops the exit
                # messages of children it terminates for the same reason).
                return
            for sibling in reversed(group):
                if sibling is not failed:
                    await sibling.stop()
            # A temporary sibling is stopped with the group but never restarted (OTP
            # terminate_children drops it).
            group = [
                m
                for m in group
                if m is failed
                or not (isinstance(m, Worker) and m.spec.restart is Restart.TEMPORARY)
            ]
            if isinstance(failed, Worker):
                failed.restarts += 1
                ran_for = max(0.0, failed.exited_at - failed.started_at)
                lease = failed.last_cause is ExitCause.LEASE
                delay = 0.0 if lease else failed.backoff.next_delay(ran_for)
                if delay > 0 and failed.state is ChildState.EXITED:
                    failed.transition(ChildState.BACKOFF)
                    await failed.back_off(delay)
            for member in group:
                if self._stopping or self.escalated:
                    return
                try:
                    await member.start()
                except ChildStartError as exc:
                    log.error("%s", exc)
                    if isinstance(member, Supervisor):
                        # A worker's failed start comes back as its exit; a supervisor's has no
                        # process to exit, so it is reported here, queued behind this restart.
                        asyncio.get_running_loop().call_soon(
                            self.child_exited, member, ExitKind.ABNORMAL
                        )
                    # Either way it is counted and decided again: no retry loop here.
                    return

    def _escalate(self) -> None:
        log.error(
            "%s: restart intensity exceeded (%d in %g s); escalating",
            self.name,
            self.flags.max_restarts,
            self.flags.max_seconds,
        )
        self.escalated = True
        self._spawn(self._give_up())

    async def _give_up(self) -> None:
        async with self._lock:
            for child in reversed(self.children):
                await child.stop()
        self.running = False
        if self.parent is not None:
            self.parent.child_exited(self, ExitKind.ABNORMAL)
        elif self.on_give_up is not None:
            self.on_give_up()

    # --- operator requests -----------------------------------------------------------------------

    def reconfigure(self, flags: Flags) -> None:
        """New flags for this supervisor and backoff bounds for its workers, from now on (a
        config reload). The restarts already counted stay in the intensity window, and each
        worker's current backoff step stays; the strategy is the tree's and does not change."""
        self.flags = flags
        self.intensity.max_restarts = flags.max_restarts
        self.intensity.max_seconds = flags.max_seconds
        for child in self.children:
            if isinstance(child, Worker):
                child.backoff.initial_s = flags.backoff_initial_s
                child.backoff.max_s = flags.backoff_max_s
                child.backoff.reset_after_s = flags.max_seconds

    async def add_child(self, worker: Worker) -> None:
        """Append `worker` to this running supervisor's children and start it (OTP
        `start_child`), holding the restart lock. Raises `ChildStartError` when it does not
        start: it stays a child, and its exit is decided like any (restarted, counted)."""
        async with self._lock:
            worker.parent = self
            self.children.append(worker)
            await worker.start()

    async def remove_child(self, worker: Worker) -> None:
        """Stop `worker` (`Worker.stop`) and take it out of this supervisor's children (OTP
        `terminate_child` then `delete_child`), holding the restart lock; an exit meanwhile is
        not restarted. Raises `ValueError` when it is not a child of this supervisor."""
        if worker not in self.children:
            raise ValueError(f"{worker.name} is not a child of {self.name}")
        async with self._lock:
            worker.leaving = True
            await worker.stop()
            self.children.remove(worker)
            worker.parent = None

    async def restart_worker(self, worker: Worker) -> None:
        """`ctl restart`: stop and start `worker` with the next generation. Not a failure: it
        counts in `operator_restarts`, never towards intensity, and waits for no backoff."""
        owner = worker.parent
        assert owner is not None
        async with owner._lock:
            worker.operator_restarts += 1
            await worker.stop()
            await worker.start()

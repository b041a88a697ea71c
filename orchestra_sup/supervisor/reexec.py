"""Handing a running supervisor over to a new image of itself (docs/adr/0007-supervisor-reexec.md).

`ctl rollover supervisor --release R` moves the supervisor onto release R without stopping a
child: `reexec` takes the tree's quiet point, closes the fork template and `execve`s R in place
(same pid, so the children's parent, their `PR_SET_PDEATHSIG` and the subreaper stay as they
were), as `R -m orchestra_sup start --adopt FD`. FD is a memfd holding the `Handoff`: the tree's
settings and directories, the two directory locks (their descriptors, inherited), and every
child's control record. The new image (`resume`) takes the locks over without a gap, binds its
sockets again, holds every child through a new pidfd after checking it is the process recorded,
and carries on; each child's DEALER reconnects by itself.

Why a memfd, not a file in the run directory or an environment variable: it cannot outlive the
exec's two images (nothing for a later start to mistake for a hand-off, nothing to clean up), no
other user can read it, and it has no size limit (the caller's `carry` is opaque).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path

import msgspec
import zmq

from orchestra_sup.config import Settings
from orchestra_sup.errors import ConfigError, ReleaseError, StateError, SupervisionError
from orchestra_sup.logformat import LogFormat
from orchestra_sup.paths import Paths
from orchestra_sup.protocol.frames import ExitInfo
from orchestra_sup.supervisor import notify
from orchestra_sup.supervisor.core import Worker
from orchestra_sup.supervisor.process import ChildProcess, child_pids
from orchestra_sup.supervisor.sockets import RemoteCtl
from orchestra_sup.supervisor.source import ConfigSource
from orchestra_sup.supervisor.spec import ChildState
from orchestra_sup.supervisor.template import template_for
from orchestra_sup.supervisor.views import ReexecHost
from orchestra_sup.system import cpupolicy

log = logging.getLogger("orchestra_sup.supervisor")

FLUSH_S = 1.0
"""Seconds frames sent before the exec (a ctl reply, a rollover's progress) get to leave."""
EXIT_FAILED = 1
"""The supervisor's exit status when the sockets cannot be bound again after a failed exec
(`root.EXIT_FAILED_START`: the tree could not go on)."""
QUIET_TIMEOUT_S = 30.0
"""Seconds `reexec` waits for restarts in flight to finish (a backoff included) before it
refuses."""
HELD_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
"""Blocked from just before the exec until the new image has its handlers: a stop (or a config
reload) asked for in between stays pending across the exec and is acted on by the new image,
never lost and never the default action (dying with every child)."""


class HandoffChild(msgspec.Struct, frozen=True, kw_only=True):
    """One worker's control record as the old image leaves it. `pid` and `create_time`
    (psutil's, seconds since the epoch) identify its process while `state` is running;
    `started_at` is monotonic seconds (the machine's clock: the same across an exec);
    `release` is the interpreter the process runs, always spelled out; `endpoint` is where it
    listens ("" when that is its name's default)."""

    name: str
    generation: int
    state: ChildState
    pid: int | None = None
    create_time: float = 0.0
    started_at: float = 0.0
    restarts: int = 0
    operator_restarts: int = 0
    last_exit: ExitInfo | None = None
    release: str = ""
    version: str = ""
    endpoint: str = ""


class Handoff(msgspec.Struct, frozen=True, kw_only=True):
    """What one image of the supervisor hands the next (msgpack; new fields get defaults, so
    two releases read each other's). `release` is the new image's interpreter; `exec_at` is
    when the old image called `execve`, monotonic seconds; `carry` is the caller's, opaque;
    `remote_ctl` is the CURVE ctl endpoint `start --ctl-tcp` asked for, served again after;
    `log_format` is `start --log-format`, kept; `generation` is the new image's (its log lines
    carry it): the old one's plus one, 2 from a release that did not count them;

    `config` is where the settings came from (`start --config` and its overrides), so a SIGHUP
    to the new image reloads the same file (None: nothing to re-read); `http_bound` the
    address the HTTP API was bound to ("HOST:PORT"; ""), so `--http HOST:0` keeps its port."""

    boot: str
    release: str
    run_lock_fd: int
    state_lock_fd: int
    run_dir: str
    state_dir: str
    workspace: str | None
    settings: Settings
    children: list[HandoffChild]
    exec_at: float
    carry: bytes = b""
    remote_ctl: RemoteCtl | None = None
    log_format: LogFormat = LogFormat.TEXT
    generation: int = 2
    config: ConfigSource | None = None
    http_bound: str = ""

    def paths(self) -> Paths:
        return Paths(
            state_dir=Path(self.state_dir),
            run_dir=Path(self.run_dir),
            workspace=Path(self.workspace) if self.workspace is not None else None,
        )


# --- the old image --------------------------------------------------------------------------------


async def reexec(sup: ReexecHost, release: str, carry: bytes = b"") -> None:
    """Re-execute the supervisor as `release` (an interpreter with orchestra-sup, as
    `release.probe` checked it), same pid, children left running; `carry` reaches the new
    image's rollovers (`Handoff.carry`). Never returns when it worked.

    Waits (at most `QUIET_TIMEOUT_S` s) for the tree's quiet point: every supervisor's restart
    lock held, so no start, stop or restart is in flight, and every child running or stopped
    for good. Closes the fork template (the new image starts its own) and both sockets (frames
    sent before the call get up to `FLUSH_S` s to leave; each child's DEALER reconnects to the
    new image by itself), hands over and execs.

    Call it holding none of the tree's restart locks (it takes them all).

    Raises `ReleaseError` (one line; the tree goes on as before, template and sockets
    restarted) when the tree is colocated or a host's agent (`seam.pinned`), `release` is not
    an executable file, the tree is starting or stopping, a child is not settled or a shard's
    surge is in flight, there is no quiet point in time, `reexec` is not called on the main
    thread (an exec from any other would end the thread the children's parent-death signal is
    tied to), a child is not the main thread's, or the exec itself fails (`release` changed
    since it was checked: no longer a program, for example)."""
    if sup.seam.unmovable is not None:
        raise ReleaseError(f"{sup.seam.unmovable}: it cannot re-execute its supervisor")
    if sup.seam.pinned is not None:
        raise ReleaseError(f"{sup.seam.pinned}: it cannot re-execute itself in place")
    if not os.path.isfile(release) or not os.access(release, os.X_OK):
        raise ReleaseError(f"release {release}: not an executable file")
    if threading.current_thread() is not threading.main_thread():
        raise ReleaseError("the supervisor re-executes only from its main thread")
    _check_settled(sup)
    async with contextlib.AsyncExitStack() as quiet:
        try:
            async with asyncio.timeout(QUIET_TIMEOUT_S):
                for each in sup.tree.supervisors():
                    await quiet.enter_async_context(each._lock)
        except TimeoutError:
            raise ReleaseError(
                f"the tree had no quiet point within {QUIET_TIMEOUT_S:g} s (restarts in flight)"
            ) from None
        _check_settled(sup)
        await sup.seam.close()
        try:
            _check_settled(sup)  # again: a child may have exited, or a stop come, meanwhile
            _exec(sup, release, carry)
        except ReleaseError:
            if sup.seam.template is not None:
                sup.seam.template = template_for(sup.settings.supervisor)
                await sup.seam.open()
            raise


def _check_settled(sup: ReexecHost) -> None:
    if sup.stopping or not sup.tree.running:
        raise ReleaseError("the tree is starting or stopping; try again when it runs")
    for worker in sup.children.workers:
        if worker.state not in (ChildState.RUNNING, ChildState.STOPPED):
            raise ReleaseError(f"child {worker.name} is {worker.state}; try again when it runs")
        if worker.retiring is not None:
            raise ReleaseError(f"child {worker.name} is being rolled over; try again after")


def _exec(sup: ReexecHost, release: str, carry: bytes) -> None:
    """Hand over and exec; on its return (a failure) undo it all and raise `ReleaseError`.
    Runs without awaiting, so nothing on the loop changes the tree in between."""
    _check_parents(sup)
    assert sup.dir_locks is not None
    locks = tuple(lock.fileno() for lock in sup.dir_locks)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    log.info("supervisor re-executing onto %s, %d children left running", release, _up(sup))
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    notify.reloading(f"re-executing onto {release}")
    if notify.watchdog_interval() is not None:
        # Same pid, so systemd keeps expecting pings: the last before the exec gives the new
        # image a whole WatchdogSec= to import itself and start its own (`RootSupervisor.run`).
        notify.send("WATCHDOG=1")
    # Closed, not left to the exec (libzmq's descriptors are close-on-exec): closing lets what
    # was sent last (a ctl reply, a rollover's progress) leave first, and once the context is
    # terminated libzmq has unlinked both paths, so binding them again after a failed exec
    # cannot race its I/O thread.
    sup.sockets.close(FLUSH_S)
    sup.events.close()  # flushed: the new image opens it again
    fd = os.memfd_create("orchestra-sup-handoff")
    try:
        os.write(fd, msgspec.msgpack.encode(_handoff(sup, release, carry)))
        os.lseek(fd, 0, os.SEEK_SET)
        for each in (fd, *locks):
            os.set_inheritable(each, True)
        # A class and RLIMIT_RTTIME survive execve: the new image imports itself in
        # SCHED_OTHER, as a fresh start does, and takes its class again (`SupervisorCpu`).
        with cpupolicy.ordinary():
            os.execv(release, [release, "-m", "orchestra_sup", "start", "--adopt", str(fd)])
    except OSError as exc:
        for each in locks:
            os.set_inheritable(each, False)
        _reopen(sup)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        notify.ready(sup.children.summary())
        raise ReleaseError(f"release {release}: cannot execute it: {exc.strerror}") from exc
    finally:
        os.close(fd)


def _handoff(sup: ReexecHost, release: str, carry: bytes) -> Handoff:
    assert sup.dir_locks is not None
    run_lock, state_lock = sup.dir_locks
    return Handoff(
        boot=sup.boot,
        release=release,
        run_lock_fd=run_lock.fileno(),
        state_lock_fd=state_lock.fileno(),
        run_dir=str(sup.paths.run_dir),
        state_dir=str(sup.paths.state_dir),
        workspace=str(sup.paths.workspace) if sup.paths.workspace is not None else None,
        settings=sup.settings,
        children=[_record(sup, worker) for worker in sup.children.workers],
        exec_at=time.monotonic(),
        carry=carry,
        remote_ctl=sup.sockets.remote_ctl,
        log_format=sup.log_format,
        generation=sup.generation + 1,
        config=sup.config,
        http_bound=sup.http.bound,
    )


def _reopen(sup: ReexecHost) -> None:
    """Bind the sockets again after a failed exec. A tree that cannot is stopped (its children
    could no longer be heard), which the one line `reexec` raises then says."""
    try:
        sup.events.open(sup.paths.state_dir)
        sup.open_sockets()
    except (zmq.ZMQError, ConfigError, StateError) as exc:
        log.error("supervisor: cannot bind its sockets again (%s); stopping the tree", exc)
        sup.request_stop(EXIT_FAILED)


def _check_parents(sup: ReexecHost) -> None:
    """Refuse when a child's parent is a thread other than the main one: the exec ends every
    other thread, and a child's parent-death signal fires when its parent thread ends.
    Children are spawned from the loop (main) thread, and the kernel reparents a forked
    child to the subreaper's first live thread, the main one, so this never refuses unless
    that changes. (Without CONFIG_PROC_CHILDREN there is nothing to check with.)"""
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as fh:
            main = {int(pid) for pid in fh.read().split()}
    except FileNotFoundError:
        return
    for worker in sup.children.workers:
        if worker.pid is not None and worker.pid not in main:
            raise ReleaseError(
                f"child {worker.name} (pid {worker.pid}) is not the main thread's child; "
                "the exec would kill it"
            )


def _record(sup: ReexecHost, worker: Worker) -> HandoffChild:
    proc = sup.seam.procs.get(worker.name) if worker.state is ChildState.RUNNING else None
    return HandoffChild(
        name=worker.name,
        generation=worker.generation,
        state=worker.state,
        pid=proc.pid if proc is not None else None,
        create_time=proc.create_time if proc is not None else 0.0,
        started_at=worker.started_at,
        restarts=worker.restarts,
        operator_restarts=worker.operator_restarts,
        last_exit=worker.last_exit,
        release=worker.release or sup.seam.release,
        version=worker.version,
        endpoint=sup.children.endpoints.get((worker.name, worker.generation), ""),
    )


def _up(sup: ReexecHost) -> int:
    return sum(w.state is ChildState.RUNNING for w in sup.children.workers)


# --- the new image --------------------------------------------------------------------------------


def read_handoff(fd: int) -> Handoff:
    """Read the `Handoff` at descriptor `fd` (from its start) and close `fd`.
    Raises `SupervisionError` (one line) when it cannot be read or is not a `Handoff`."""
    try:
        with open(fd, "rb", closefd=True) as fh:
            data = fh.read()
    except OSError as exc:
        raise SupervisionError(f"hand-off descriptor {fd}: {exc.strerror}") from exc
    try:
        return msgspec.msgpack.decode(data, type=Handoff)
    except msgspec.DecodeError as exc:
        raise SupervisionError(f"hand-off descriptor {fd}: {exc}") from None


def check(handoff: Handoff, workers: list[Worker]) -> None:
    """Refuse a hand-off this tree cannot adopt, before anything is touched. Raises
    `SupervisionError` when its children are not this tree's (names in start order), or one
    of them is neither running with a pid nor stopped."""
    names = [child.name for child in handoff.children]
    if names != [w.name for w in workers]:
        raise SupervisionError(
            f"the hand-off's children ({', '.join(names)}) are not this release's tree "
            f"({', '.join(w.name for w in workers)})"
        )
    for child in handoff.children:
        running = child.state is ChildState.RUNNING and child.pid is not None
        if not running and child.state is not ChildState.STOPPED:
            raise SupervisionError(f"child {child.name} was handed over {child.state}")


def adopt(sup: ReexecHost, handoff: Handoff) -> None:
    """Restore every worker's control record from `handoff` (`check`ed) and hold each running
    child's process again (`ProcessSeam.adopt`), generation unchanged; every supervisor of
    the tree counts as running. A child whose process is gone, or is not the one recorded,
    is an exit, handled on a later loop step like any.

    Call on the loop before anything awaits (no SIGCHLD handling may reap a child before it
    is held). Adopted children's names are put in `sup.children.unheard`: the roster is sent to
    each again when its first heartbeat says its DEALER has reconnected."""
    children = sup.children
    for each in sup.tree.supervisors():
        each.running = True
    children.adopting = True  # no roster until every child is back: the others would look down
    try:
        _adopt_children(sup, handoff)
    finally:
        children.adopting = False
    log.info(
        "supervisor re-executed onto %s: %d of %d children adopted %.1f ms after the exec",
        handoff.release,
        len(children.unheard),
        len(children.workers),
        (time.monotonic() - handoff.exec_at) * 1000,
    )


def _adopt_children(sup: ReexecHost, handoff: Handoff) -> None:
    children = sup.children
    for worker, child in zip(children.workers, handoff.children, strict=True):
        worker.restarts = child.restarts
        worker.operator_restarts = child.operator_restarts
        worker.last_exit = child.last_exit
        worker.release = "" if child.release == handoff.release else child.release
        worker.version = child.version
        if child.endpoint:
            children.endpoints[(worker.name, child.generation)] = child.endpoint
        if child.state is ChildState.STOPPED:
            worker.generation = child.generation
            continue
        assert child.pid is not None
        worker.resume(child.generation, child.started_at)
        if sup.seam.adopt(worker, child.pid, child.create_time):
            children.unheard.add(worker.name)


def stop_children(grace_s: float) -> int:
    """Stop every child of this process: SIGTERM, up to `grace_s` seconds for all of them,
    SIGKILL for the rest, each reaped. Returns how many there were. For a new image that
    cannot adopt: every child it has was the tree's (the old image's, or an orphan
    reparented to it), and a child's pid cannot be reused while it is unreaped, so each is
    held by a pidfd and signalled only through it."""
    procs: list[ChildProcess] = []
    for pid in child_pids():
        with contextlib.suppress(ProcessLookupError):
            procs.append(ChildProcess.adopt(pid))
    for proc in procs:
        proc.signal(signal.SIGTERM)
    poller = select.poll()
    waiting = {}
    for proc in procs:
        assert proc.pidfd is not None
        poller.register(proc.pidfd, select.POLLIN)
        waiting[proc.pidfd] = proc
    deadline = time.monotonic() + grace_s
    while waiting and (left := deadline - time.monotonic()) > 0:
        for pidfd, _event in poller.poll(left * 1000):
            poller.unregister(pidfd)
            del waiting[pidfd]
    for proc in waiting.values():
        proc.signal(signal.SIGKILL)
    for proc in procs:
        assert proc.pidfd is not None
        with contextlib.suppress(ChildProcessError), cpupolicy.ordinary():
            os.waitid(os.P_PIDFD, proc.pidfd, os.WEXITED)
        proc.abandon()
    return len(procs)

"""The supervisor's seam onto the OS: start, identify, signal and reap child processes.

A process is identified by (pid, create time) and held through a pidfd, so a signal can only ever
reach the process this supervisor started (`pidfd_send_signal` cannot hit a recycled pid).
Exits are noticed by the pidfd turning readable on the event loop; there is no polling.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Callable

import psutil

from orchestra_sup.protocol.frames import ExitInfo
from orchestra_sup.system import cpupolicy

log = logging.getLogger(__name__)


class ChildProcess:
    """One started child: its pid, create time (seconds since the epoch, as psutil reports) and
    an open pidfd. Always reaped: `reap()` collects the exit status exactly once.

    Two ways in: `spawn` execs a command (a `Popen` underneath), `adopt` takes a process the fork
    template made (`supervisor.template`), which must already be, or be about to become, a child
    of this process.
    """

    def __init__(self, pid: int, popen: subprocess.Popen[bytes] | None = None):
        self.popen = popen
        self.pid = pid
        self.pidfd: int | None = os.pidfd_open(pid)
        try:
            self.create_time = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:
            self.create_time = 0.0
        self.exit: ExitInfo | None = None

    @classmethod
    def spawn(
        cls, argv: list[str], env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = ()
    ) -> ChildProcess:
        """Start `argv` as the leader of its own process group, stdin from /dev/null,
        stdout/stderr inherited (the supervisor's log), no fd but `pass_fds` beyond those.
        Raises `OSError` when exec fails."""
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            process_group=0,
            close_fds=True,
            pass_fds=pass_fds,
            env=env,
        )
        return cls(popen.pid, popen)

    @classmethod
    def adopt(cls, pid: int) -> ChildProcess:
        """Hold process `pid` through a new pidfd. Raises `ProcessLookupError` when it is gone.

        The caller guarantees `pid` cannot have been recycled: the template's intermediate holds
        the process unreaped until `adopt` has returned (see `supervisor.template`), or the
        caller compares `create_time` with the one it recorded (`ProcessSeam.adopt`): read
        after the pidfd was opened, it is the held process's."""
        return cls(pid)

    def abandon(self) -> None:
        """Stop holding the process without reaping it: close the pidfd (a watch must not be
        armed). Its exit, once it is our child, is reaped by `reap_orphans` like any orphan's."""
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def watch(self, loop_add_reader: Callable[..., None], callback: Callable[[], None]) -> None:
        """Call `callback` on the loop when the process exits."""
        assert self.pidfd is not None
        loop_add_reader(self.pidfd, callback)

    def signal(self, sig: int) -> bool:
        """Send `sig` through the pidfd; False when the process has already exited."""
        if self.pidfd is None:
            return False
        try:
            signal.pidfd_send_signal(self.pidfd, sig)
        except ProcessLookupError:
            return False
        return True

    def reap(self, loop_remove_reader: Callable[[int], object]) -> ExitInfo | None:
        """Collect the exit status if the process has exited (None while it runs)."""
        if self.exit is not None:
            return self.exit
        assert self.pidfd is not None
        try:
            with cpupolicy.ordinary():  # a reap may wait in the kernel: docs/adr/0020
                info = os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            info = None
            self.exit = ExitInfo(status=None, signal=None)
        if info is None and self.exit is None:
            return None
        if info is not None:
            exited = info.si_code == os.CLD_EXITED
            if exited:
                self.exit = ExitInfo(status=info.si_status, signal=None)
            else:
                self.exit = ExitInfo(status=None, signal=info.si_status)
            if self.popen is not None:  # so the Popen never waits for (or warns about) it
                self.popen.returncode = info.si_status if exited else -info.si_status
        loop_remove_reader(self.pidfd)
        os.close(self.pidfd)
        self.pidfd = None
        return self.exit


def kill_orphans(known: set[int]) -> int:
    """SIGKILL every process reparented to this (subreaper) supervisor that is not a known child,
    with its descendants; returns how many were signalled.

    These are what is left of a dead child's subtree (a lane command whose shard was killed).
    Each is identified by (pid, create time) when listed and checked again just before the
    signal, so a pid recycled in between is never hit.
    """
    victims: list[psutil.Process] = []
    for pid in child_pids() - known:
        try:
            proc = psutil.Process(pid)
            victims.extend([proc, *proc.children(recursive=True)])
        except psutil.NoSuchProcess:
            continue
    count = 0
    for proc in victims:
        try:
            if proc.is_running():  # compares the create time psutil recorded
                proc.send_signal(signal.SIGKILL)
                count += 1
        except psutil.NoSuchProcess:
            continue
    if count:
        log.info("killed %d orphaned process(es) of the tree", count)
    return count


def child_pids() -> set[int]:
    """The pids of this process's children (exited and unreaped ones included).

    Read from the kernel's per-thread lists (`/proc/self/task/TID/children`): a few small reads,
    where psutil reads the status of every process on the machine (milliseconds, and this runs
    on every child's exit, on the restart path). Falls back to psutil where the kernel lacks
    those files (CONFIG_PROC_CHILDREN)."""
    pids: set[int] = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/children") as fh:
                    pids.update(int(pid) for pid in fh.read().split())
            except FileNotFoundError:
                if os.path.exists(f"/proc/self/task/{tid}"):
                    raise  # the thread is there, the file is not: no such kernel support
    except FileNotFoundError:
        return {proc.pid for proc in psutil.Process().children(recursive=False)}
    return pids


def reap_orphans(known: set[int], on_child: Callable[[int], None]) -> None:
    """Reap every exited child that is not a known one; hand known ones to `on_child(pid)`.

    Peeks with `WNOWAIT` so a known child's status is left for its pidfd (no SIGCHLD race).
    """
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == 0:
            return
        if info.si_pid in known:
            on_child(info.si_pid)
            if info.si_pid in known:  # the handler did not reap it: stop, or we would spin
                return
            continue
        with contextlib.suppress(ChildProcessError), cpupolicy.ordinary():
            os.waitpid(info.si_pid, 0)


def describe(exit_info: ExitInfo) -> str:
    """How a process ended, for a log line: "killed by signal 9", "exited with status 0"."""
    if exit_info.signal is not None:
        return f"killed by signal {exit_info.signal}"
    return f"exited with status {exit_info.status}"

"""The supervisor's side of the CPU policy (`[cpu]`, `system.cpupolicy`): its own class, applied
as it starts, the real-time guard over the whole control plane (`system.rtguard`), and a child's
death by RLIMIT_RTTIME named to its next process (`previous_exit`)."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable

from orchestra_sup.config import Settings
from orchestra_sup.supervisor.core import ExitCause, Worker
from orchestra_sup.supervisor.shape import cpu_plans
from orchestra_sup.system import cpupolicy
from orchestra_sup.system.cpupolicy import CpuSettings
from orchestra_sup.system.rtguard import RtGuard, demote

log = logging.getLogger(__name__)


class SupervisorCpu:
    """Applies the supervisor's own CPU plan (`shape.cpu_plans`) at construction, before the
    process starts a thread; a step the kernel refuses is logged and the tree runs without it.
    `priority` is the SCHED_FIFO priority it runs at (0: not in real time).

    In real time, RLIMIT_RTTIME's SIGXCPU to the supervisor (its loop ran `rttime_s` without
    blocking) is handled, not fatal: the supervisor leaves real time (every thread but the
    guard's), logs it and counts it in `demoted`, and goes on serving its tree in SCHED_OTHER,
    as the guard does with a child. Its default action would take every child and lane down."""

    def __init__(self, settings: Settings):
        plan = cpu_plans(settings)["supervisor"]
        self._rttime_s = settings.cpu.rttime_s
        try:
            cpupolicy.apply(plan)
        except OSError as exc:
            log.warning("CPU policy not applied to the supervisor: %s", exc)
        self.priority = cpupolicy.priority_here()
        self.demoted = 0
        """Processes the real-time guard put back in SCHED_OTHER (`RtGuard.demoted`)."""
        self._guard: RtGuard | None = None
        if self.priority:
            signal.signal(signal.SIGXCPU, self._on_rttime)
        if settings.cpu != CpuSettings():
            log.info("CPU policy: supervisor %s", cpupolicy.in_force(os.getpid()))

    def start_guard(self, known_pids: Callable[[], set[int]]) -> None:
        """Start the real-time guard over this process and `known_pids()` (called on the
        guard's thread: it must only read), when the supervisor is in real time; `close` stops
        it. Call it before the first child starts and `close` after the last is reaped: a reap
        is one of the waits the guard exists for."""
        if not self.priority:
            return
        self._guard = RtGuard(
            lambda: [os.getpid(), *known_pids()], self.priority + 1, on_demote=self._count
        )
        try:
            self._guard.start()
        except OSError as exc:  # its priority is the supervisor's plus one: not seen refused
            log.error("no real-time guard: %s", exc)
            self._guard = None

    def close(self) -> None:
        """Stop the guard (blocks for at most one of its ticks)."""
        if self._guard is not None:
            self._guard.close()
            self._guard = None

    def _count(self, _pid: int, _threads: int) -> None:
        self.demoted += 1

    def _on_rttime(self, _signum: int, _frame: object) -> None:
        keep = self._guard.thread_id if self._guard is not None else None
        threads = demote(os.getpid(), keep=keep)
        self.demoted += 1
        log.error(
            "the supervisor ran %g s in real time without blocking (RLIMIT_RTTIME): "
            "%d of its threads put back in SCHED_OTHER",
            self._rttime_s,
            threads,
        )


def previous_exit(worker: Worker) -> str:
    """`ChildArgs.previous_exit`: the `ExitCause` of `worker`'s last process, "rttime" for a
    death by SIGXCPU (RLIMIT_RTTIME: it held a CPU in real time, `[cpu] rttime_s`)."""
    last = worker.last_exit
    if worker.last_cause is ExitCause.SIGNAL and last is not None and last.signal == signal.SIGXCPU:
        return "rttime"
    return str(worker.last_cause or "")

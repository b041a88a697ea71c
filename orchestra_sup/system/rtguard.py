"""The real-time guard: a control-plane thread that holds a CPU is put back in SCHED_OTHER.

`RLIMIT_RTTIME` (`system.cpupolicy`) stops a real-time thread that spins in user space: SIGXCPU,
then SIGKILL. It cannot stop one that spins inside the kernel, nor one that blocks for an instant
now and then (each block resets its count). Seen on this machine kind (Linux 6.18, docs/adr/
0020-cpu-policy.md): the supervisor in SCHED_FIFO, reaping a child, looped in the kernel
(`waitid` -> `release_task` -> `shrink_dcache_parent`) for over ten minutes at 95% of its CPU,
waiting for work that the kernel does at a lower priority; SIGKILL was not delivered, because it
never returned to user space. Putting it in SCHED_OTHER (`chrt -o -p 0`) freed it at once. That
is rtkit's remedy too (its watchdog demotes every real-time thread it granted).

So the supervisor runs `RtGuard`: one thread, in SCHED_FIFO one priority above every thread of
the tree, that every `tick_s` reads how long each real-time thread of the tree's processes
(`pids()`) has run (`/proc/<pid>/task/<tid>/schedstat`: nanoseconds on a CPU). A thread that ran
more than `share` of the last `window_s` seconds is a runaway: every real-time thread of its
process goes to SCHED_OTHER, the process goes on (a child that stays wedged is then the
watchdog's), and the demotion is logged and counted (`demoted`). A child restarted later takes
its class again as it starts (`ChildArgs.cpu`). The guard's own thread is neither sampled nor
demoted: when the supervisor is the runaway, the guard stays above the tree for the next one.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable

from orchestra_sup.system.cpupolicy import CpuPlan, enter_thread

log = logging.getLogger(__name__)

TICK_S = 0.5
WINDOW_S = 2.0
SHARE = 0.9
"""A real-time thread that ran more than this share of the last `WINDOW_S` is a runaway: the
kernel lets real time take at most 95% of a CPU (`sched_rt_runtime_us`), so a spin is seen, and
a control plane doing its work in bursts, however busy, is far below it."""


def _threads(pid: int) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _is_realtime(tid: int) -> bool:
    try:
        policy = os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK
    except OSError:
        return False
    return policy in (os.SCHED_FIFO, os.SCHED_RR)


def _ran_ns(pid: int, tid: int) -> int | None:
    """Nanoseconds thread `tid` of `pid` has run on a CPU, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def demote(pid: int, keep: int | None = None) -> int:
    """Put every real-time thread of process `pid` but `keep` (a thread id) in SCHED_OTHER;
    returns how many were. Never raises (a thread gone meanwhile is skipped)."""
    count = 0
    for tid in _threads(pid):
        if tid != keep and _is_realtime(tid):
            with contextlib.suppress(OSError):
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                count += 1
    return count


class RtGuard:
    """Watches the real-time threads of `pids()` (the supervisor's own pid among them; called
    on the guard's thread, so it must only read; a `RuntimeError` it raises skips the tick)
    from a thread in SCHED_FIFO at `priority`.
    `on_demote(pid, threads)` is called on that thread after each demotion.

    `tick_s`, `window_s`, `share`: see the module docstring (defaults `TICK_S`, `WINDOW_S`,
    `SHARE`). `start()` raises `OSError` when the guard's own class is refused; `close()`
    returns once its thread has ended."""

    def __init__(
        self,
        pids: Callable[[], list[int]],
        priority: int,
        *,
        on_demote: Callable[[int, int], None] | None = None,
        tick_s: float = TICK_S,
        window_s: float = WINDOW_S,
        share: float = SHARE,
    ):
        self._pids = pids
        self._priority = priority
        self._on_demote = on_demote
        self._tick_s = tick_s
        self._share = share
        self._samples: dict[tuple[int, int], collections.deque[tuple[float, int]]] = {}
        self._depth = max(2, round(window_s / tick_s) + 1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rt-guard", daemon=True)
        self._ready = threading.Event()
        self._refused: OSError | None = None
        self.demoted = 0
        """Processes demoted since the guard started."""

    @property
    def thread_id(self) -> int | None:
        """The guard thread's id (None before `start`)."""
        return self._thread.native_id

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._refused is not None:
            raise self._refused

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        try:
            enter_thread(CpuPlan(priority=self._priority))
        except OSError as exc:
            self._refused = exc
            self._ready.set()
            return
        self._ready.set()
        while not self._stop.wait(self._tick_s):
            try:
                self.check(time.monotonic())
            except Exception:  # the guard must outlive whatever one tick meets
                log.exception("the real-time guard's check failed")

    def check(self, now: float) -> list[int]:
        """One tick: sample every real-time thread, demote the processes of runaways; returns
        the pids demoted."""
        try:
            pids = list(self._pids())
        except RuntimeError:  # read while the loop changed it ("changed size"): next tick
            return []
        seen: set[tuple[int, int]] = set()
        runaways: list[int] = []
        own = threading.get_native_id()  # the guard's: it watches, it is not watched
        for pid in pids:
            for tid in _threads(pid):
                if tid == own or not _is_realtime(tid):
                    continue
                ran = _ran_ns(pid, tid)
                if ran is None:
                    continue
                key = (pid, tid)
                seen.add(key)
                samples = self._samples.setdefault(key, collections.deque(maxlen=self._depth))
                samples.append((now, ran))
                if self._runaway(samples) and pid not in runaways:
                    runaways.append(pid)
        for key in set(self._samples) - seen:
            del self._samples[key]
        for pid in runaways:
            threads = demote(pid, keep=own)
            self.demoted += 1
            for key in [k for k in self._samples if k[0] == pid]:
                del self._samples[key]
            log.error(
                "process %d held a CPU in real time (over %d%% of %.1f s): "
                "%d of its threads put back in SCHED_OTHER",
                pid,
                round(self._share * 100),
                self._tick_s * (self._depth - 1),
                threads,
            )
            if self._on_demote is not None:
                self._on_demote(pid, threads)
        return runaways

    def _runaway(self, samples: collections.deque[tuple[float, int]]) -> bool:
        if len(samples) < self._depth:
            return False
        (t0, ran0), (t1, ran1) = samples[0], samples[-1]
        return (ran1 - ran0) / 1e9 > self._share * (t1 - t0)

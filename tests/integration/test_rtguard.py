"""The real-time guard (`system.rtguard`) on real processes: a real-time thread that holds its
CPU while dodging RLIMIT_RTTIME is put back in SCHED_OTHER; a busy but blocking one is not."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from orchestra_sup.system.cpupolicy import realtime_refusal
from orchestra_sup.system.rtguard import RtGuard
from tests.integration.harness import wait_until

pytestmark = pytest.mark.skipif(
    realtime_refusal(5) is not None, reason="SCHED_FIFO is refused here"
)

CPU = max(os.sched_getaffinity(0))
LOOP = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[3])})
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(3))
busy_s, rest_s = float(sys.argv[1]), float(sys.argv[2])
print("ready", flush=True)
while True:
    end = time.monotonic() + busy_s
    while time.monotonic() < end:
        pass
    time.sleep(rest_s)  # a block: RLIMIT_RTTIME's count starts again
"""


@pytest.fixture
def spawn() -> Iterator[Callable[[float, float], int]]:
    procs: list[subprocess.Popen[str]] = []

    def start(busy_s: float, rest_s: float) -> int:
        proc = subprocess.Popen(
            [sys.executable, "-c", LOOP, str(busy_s), str(rest_s), str(CPU)],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        return proc.pid

    yield start
    for proc in procs:
        proc.kill()
        proc.communicate()


def test_a_thread_that_holds_its_cpu_is_demoted_and_a_busy_one_is_not(
    spawn: Callable[[float, float], int],
) -> None:
    runaway = spawn(0.05, 0.0001)  # 99.8% of its CPU, never 50 ms without a block
    worker = spawn(0.005, 0.02)  # 20%: busy, in bursts
    demoted: list[int] = []
    guard = RtGuard(
        lambda: [runaway, worker],
        6,
        on_demote=lambda pid, _threads: demoted.append(pid),
        tick_s=0.1,
        window_s=0.6,
    )
    guard.start()
    try:
        wait_until(lambda: os.sched_getscheduler(runaway) == os.SCHED_OTHER, 10, "the demotion")
        assert demoted == [runaway] and guard.demoted == 1
        assert os.sched_getscheduler(worker) == os.SCHED_FIFO
    finally:
        guard.close()


def test_the_guard_demoting_its_own_process_keeps_its_own_class() -> None:
    """The supervisor is in the pids the guard watches (a reap can hold it in the kernel): when
    it is the runaway, its threads go to SCHED_OTHER but the guard's own stays in SCHED_FIFO,
    above every thread of the tree, to catch the next one. (`share` 0 here: any real-time
    thread that ran counts, so this test's own thread, put in SCHED_FIFO, is one.)"""
    guard = RtGuard(lambda: [os.getpid()], 6, tick_s=0.05, window_s=0.1, share=0.0)
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(3))
    try:
        guard.start()
        tid = guard._thread.native_id
        assert tid is not None
        wait_until(lambda: os.sched_getscheduler(0) == os.SCHED_OTHER, 10, "the demotion")
        assert guard.demoted >= 1
        assert os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK == os.SCHED_FIFO
        assert os.sched_getparam(tid).sched_priority == 6
    finally:
        guard.close()
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))

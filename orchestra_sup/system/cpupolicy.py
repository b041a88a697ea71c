"""The CPU policy by role (`[cpu]`): the control plane above the hosts, the hosts above the lanes.

What a turn of the coordinator waits for, when every lane burns CPU, is the kernel: four nice-0
processes on its path against busy lanes on two vCPUs (issue 20 measured 11x at p99). The policy
ranks the tree's processes by what the machine allows, in this order:

1. Real time (`realtime`): the supervisor in SCHED_FIFO at `rt_priority`, the coordinator one
   below it (a supervisor must be able to stop a child that spins), and the custodian's front
   and I/O threads one below too (its loop runs git and reaps it: `CpuPlan.loop`), each with
   `SCHED_RESET_ON_FORK` so nothing it spawns (git, bubblewrap, a release probe, the fork
   template) inherits the class, and with `RLIMIT_RTTIME` (`rttime_s`) as the runaway guard
   beside the watchdog: a real-time thread that runs that long without blocking gets SIGXCPU,
   and SIGKILL one second later (setrlimit(2)). What RLIMIT_RTTIME cannot stop (a thread
   looping in the kernel, or one that blocks for an instant now and then) the supervisor's
   real-time guard demotes (`system.rtguard`); and a wait that may loop in the kernel on work
   done at a lower priority, a reap, runs in SCHED_OTHER (`ordinary`).
2. Affinity (`reserved_cpus`): the control plane pinned to those CPUs, so the hops of a turn
   wake one another on one warm CPU; the hosts (and the lanes they spawn) keep every CPU of the
   machine (`machine_cpus`: the cpuset, not the mask the supervisor was started with).
3. The lanes' class (`lanes`, `system.lanecpu`): "idle" puts them in a cgroup of `cpu.idle = 1`
   (else a minimal `cpu.shares`), else SCHED_IDLE; always after `[lanes] nice`.

The shards (hosts) stay in SCHED_OTHER at nice 0: above the lanes, below the control plane.

Threads: a scheduling class is per thread, and a thread created by one in a class with
`SCHED_RESET_ON_FORK` starts in SCHED_OTHER. A real-time process therefore applies its class to
the threads on a turn's path itself: libzmq's I/O threads (`zmq_options`, set on the context
before its first socket), a front thread, and one priority below the loop the coordinator's
write-behind thread, whose synced commits (an inbox message, a placement) a reaction waits for
(`same_class`; it blocks in fsync, and the guard demotes it if it ever spins), and two below
the loop the event log's write-behind (the supervisor's and the coordinator's). Other threads
(asyncio's executor, the shards' write-behind) do slow work and stay in SCHED_OTHER (ADR 0020,
"The write-behind thread").

`realtime = "off"` and `lanes = "nice"` (the defaults) keep the tree as it was before `[cpu]`:
real time needs root, CAP_SYS_NICE or a `LimitRTPRIO=` a user may not grant.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import msgspec

if TYPE_CHECKING:
    import zmq

REALTIME = ("off", "auto", "on")
LANE_CLASSES = ("nice", "idle")
RT_PRIORITY_MAX = 97
"""The highest `rt_priority`: the real-time guard runs one above it (`system.rtguard`), and the
kernel's own threads (migration, watchdog) at 99."""
RTTIME_HARD_MARGIN_S = 1.0
"""Seconds between RLIMIT_RTTIME's soft limit (SIGXCPU) and its hard limit (SIGKILL)."""
CONTROL = ("supervisor", "coordinator", "custodian")
"""The roles of the control plane."""


class CpuSettings(msgspec.Struct, frozen=True, kw_only=True):
    """`[cpu]` (see the module docstring).

    - `realtime`: "off" (default), "auto" (real time where this process may take it, else off),
      "on" (refused at start where it may not: `check_realtime`).
    - `rt_priority`: the supervisor's SCHED_FIFO priority (2..97, default 5); the coordinator
      and the custodian's front run one below, the real-time guard one above.
    - `rttime_s`: RLIMIT_RTTIME's soft limit, CPU seconds a real-time thread may run without
      blocking (0.05..60, default 1.0); SIGKILL `RTTIME_HARD_MARGIN_S` later.
    - `reserved_cpus`: CPUs the control plane is pinned to, as `taskset -c` writes them ("0",
      "0,2-3"); "" (default): not pinned. Each must be one this process may run on.
    - `lanes`: "nice" (default: `[lanes] nice` only) or "idle" (`system.lanecpu`).
    - `busy_poll_s`: seconds the custodian's front polls its socket without sleeping after each
      frame before it blocks (0..0.01, default 0.0002; 0: never), where it is in SCHED_OTHER
      and may run on more than one CPU (`role_plans`; `runtime.front`, ADR 0001).
    """

    realtime: Literal["off", "auto", "on"] = "off"
    rt_priority: int = 5
    rttime_s: float = 1.0
    reserved_cpus: str = ""
    lanes: Literal["nice", "idle"] = "nice"
    busy_poll_s: float = 0.0002


class CpuPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What one process of the tree applies to itself as it starts (`apply`).

    `priority`: its SCHED_FIFO priority (0: SCHED_OTHER, left as it is); `loop`: whether its
    main thread (its event loop) takes that class, or only the threads of its turn path (its
    ZeroMQ I/O threads, its front: the custodian's loop runs git and reaps it, off any turn's
    path); `rttime_us`: its RLIMIT_RTTIME soft limit, microseconds (0: left as it is); `cpus`:
    its affinity (empty: left as it is, inherited); `busy_poll_s`: how long its front busy-polls
    after each frame, seconds (0: it blocks at once; `runtime.front`)."""

    priority: int = 0
    loop: bool = True
    rttime_us: int = 0
    cpus: tuple[int, ...] = ()
    busy_poll_s: float = 0.0


def parse_cpus(text: str) -> frozenset[int]:
    """The CPUs of a list as `taskset -c` and cpuset files write them: "0", "0,2-3", "" (none).
    Raises `ValueError` naming the part that is not a CPU number or range."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        low, sep, high = part.partition("-")
        if not _is_number(low) or (sep and not _is_number(high)):
            raise ValueError(f"{part!r} is not a CPU number or range")
        first, last = int(low), int(high) if sep else int(low)
        if last < first or last > 4095:
            raise ValueError(f"{part!r} is not a CPU range")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def _is_number(text: str) -> bool:
    """Whether `text` is a CPU number: ASCII digits only (`str.isdigit` also takes "²" and "٣")."""
    return text.isascii() and text.isdigit()


def format_cpus(cpus: frozenset[int] | set[int] | tuple[int, ...]) -> str:
    """`cpus` as a list of ranges ("0,2-3"), the inverse of `parse_cpus`."""
    ranges: list[str] = []
    for cpu in sorted(cpus):
        if ranges and ranges[-1].rpartition("-")[2] == str(cpu - 1):
            start = ranges[-1].partition("-")[0]
            ranges[-1] = f"{start}-{cpu}"
        else:
            ranges.append(str(cpu))
    return ",".join(ranges)


def machine_cpus() -> frozenset[int]:
    """The CPUs this process's cpuset allows (cgroup v1 `cpuset.cpus`, v2
    `cpuset.cpus.effective`), else the online ones, else its own affinity: the set a host widens
    back to when the supervisor was started pinned (systemd's `CPUAffinity=`)."""
    for path in _cpuset_files():
        try:
            cpus = parse_cpus(path.read_text().strip())
        except (OSError, ValueError):
            continue
        if cpus:
            return cpus
    return frozenset(os.sched_getaffinity(0))


def _cpuset_files() -> list[Path]:
    files: list[Path] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        if "cpuset" in controllers.split(","):
            files.append(Path("/sys/fs/cgroup/cpuset") / path.lstrip("/") / "cpuset.cpus")
        elif controllers == "":
            root = Path("/sys/fs/cgroup") / path.lstrip("/")
            files.append(root / "cpuset.cpus.effective")
    files.append(Path("/sys/devices/system/cpu/online"))
    return files


def realtime_refusal(priority: int) -> str | None:
    """Why this process may not run in SCHED_FIFO at `priority`, in a few words; None when it
    may. Found by trying it on a short-lived thread, so this process's own class is untouched
    (EPERM: neither root, CAP_SYS_NICE nor an RLIMIT_RTPRIO that high; also when a cgroup v1
    cpu controller gives this cgroup no `cpu.rt_runtime_us`)."""
    import threading

    result: list[str | None] = []

    def attempt() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        except OSError as exc:
            soft, _hard = resource.getrlimit(resource.RLIMIT_RTPRIO)
            result.append(f"{exc.strerror} (RLIMIT_RTPRIO {soft}, euid {os.geteuid()})")
        else:
            result.append(None)

    thread = threading.Thread(target=attempt, name="rt-probe")
    thread.start()
    thread.join()
    return result[0]


def role_plans(
    settings: CpuSettings, realtime: bool, machine: frozenset[int]
) -> dict[str, CpuPlan]:
    """Each role's plan ("supervisor", "coordinator", "custodian", "shard") under `settings`,
    with `realtime` saying whether real time is in force (`resolve_realtime`) and `machine`
    the CPUs a host widens back to (`machine_cpus`). Pure.

    Only the custodian busy-polls (its front answers reads where they arrive), and only in
    SCHED_OTHER on more than one CPU: a real-time thread that spins keeps its CPU from every
    thread below it (the coordinator shares the reserved CPU) and runs down RLIMIT_RTTIME, and
    on one CPU nothing can send the frame it spins for."""
    reserved = tuple(sorted(parse_cpus(settings.reserved_cpus)))
    rttime = int(settings.rttime_s * 1e6) if realtime else 0
    spread = len(reserved or machine) > 1
    busy_poll_s = settings.busy_poll_s if spread and not realtime else 0.0
    plans = {
        "supervisor": CpuPlan(
            priority=settings.rt_priority if realtime else 0, rttime_us=rttime, cpus=reserved
        ),
        **{
            role: CpuPlan(
                priority=settings.rt_priority - 1 if realtime else 0,
                loop=not realtime or role != "custodian",  # the custodian: front, I/O only
                rttime_us=rttime,
                cpus=reserved,
                busy_poll_s=busy_poll_s if role == "custodian" else 0.0,
            )
            for role in CONTROL[1:]
        },
        # Widened back only when the control plane was pinned (else inherited, untouched).
        "shard": CpuPlan(cpus=tuple(sorted(machine)) if reserved else ()),
    }
    return plans


def resolve_realtime(settings: CpuSettings) -> tuple[bool, str | None]:
    """(whether real time is in force, why not when it was asked for and is not) under
    `settings.realtime`: "off" -> (False, None); "auto" and "on" -> what `realtime_refusal`
    finds. Never raises (`check_realtime` refuses "on" where it is not allowed)."""
    if settings.realtime == "off":
        return False, None
    refusal = realtime_refusal(settings.rt_priority)
    return refusal is None, refusal


def check_realtime(settings: CpuSettings) -> None:
    """Raise `ValueError` when `realtime = "on"` and this process may not take SCHED_FIFO."""
    if settings.realtime == "on":
        refusal = realtime_refusal(settings.rt_priority)
        if refusal is not None:
            raise ValueError(f'[cpu] realtime = "on": SCHED_FIFO is refused here: {refusal}')


def check_reserved(settings: CpuSettings) -> None:
    """Raise `ValueError` when `reserved_cpus` is malformed or names a CPU this process may not
    run on (outside its affinity)."""
    try:
        reserved = parse_cpus(settings.reserved_cpus)
    except ValueError as exc:
        raise ValueError(f'[cpu] reserved_cpus = "{settings.reserved_cpus}": {exc}') from None
    usable = frozenset(os.sched_getaffinity(0))
    outside = reserved - usable
    if outside:
        raise ValueError(
            f'[cpu] reserved_cpus = "{settings.reserved_cpus}": CPU {format_cpus(outside)} '
            f"is not one this process may run on ({format_cpus(usable)})"
        )


_applied = CpuPlan()
"""The plan `apply` applied to this process (what its turn-path threads take: `same_class`,
`zmq_options`)."""


def apply(plan: CpuPlan) -> None:
    """Apply `plan` to this process, before it starts any thread (a thread inherits the
    affinity; the class see the module docstring): affinity, then RLIMIT_RTTIME, then, where
    `plan.loop`, SCHED_FIFO with SCHED_RESET_ON_FORK for the calling (main) thread. Raises
    `OSError` when the kernel refuses a step (the steps before it stay applied, and no thread
    is put in real time later)."""
    global _applied
    if plan.cpus:
        os.sched_setaffinity(0, plan.cpus)
    if plan.rttime_us:
        hard = plan.rttime_us + int(RTTIME_HARD_MARGIN_S * 1e6)
        resource.setrlimit(resource.RLIMIT_RTTIME, (plan.rttime_us, hard))
    if plan.priority and plan.loop:
        enter_thread(plan)
    _applied = plan


def enter_thread(plan: CpuPlan) -> None:
    """Put the calling thread in `plan`'s real-time class (nothing when it has none). Raises
    `OSError` when refused."""
    if plan.priority:
        policy = os.SCHED_FIFO | os.SCHED_RESET_ON_FORK
        os.sched_setscheduler(0, policy, os.sched_param(plan.priority))


def priority_here() -> int:
    """The calling thread's SCHED_FIFO priority (0: it is in another class)."""
    if os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK != os.SCHED_FIFO:
        return 0
    return os.sched_getparam(0).sched_priority


def same_class(below: int = 0) -> Callable[[], None]:
    """A function that puts the thread calling it in this process's real-time class (`apply`'s
    plan, whether or not the calling thread is in it), `below` priorities under it (at least
    priority 1): made where a thread on a turn's path is created (`runtime.front`), called
    first thing on that thread. A thread that serves the loop (the coordinator's write-behind)
    runs one below it, so the loop preempts it on a shared CPU and it still preempts the hosts
    and lanes. Nothing when the process has no real-time class; never raises."""
    priority = _applied.priority
    plan = CpuPlan(priority=max(1, priority - below) if priority else 0)

    def enter() -> None:
        with contextlib.suppress(OSError):
            enter_thread(plan)

    return enter


def zmq_options() -> dict[int, int]:
    """The ZeroMQ context options that put libzmq's I/O threads in this process's real-time
    class (`apply`'s plan; empty when it has none). Set before the context's first socket, and
    only after `apply` succeeded, as libzmq aborts the process when its thread's class is
    refused."""
    import zmq

    if not _applied.priority:
        return {}
    return {zmq.THREAD_SCHED_POLICY: os.SCHED_FIFO, zmq.THREAD_PRIORITY: _applied.priority}


def context() -> zmq.Context:
    """A ZeroMQ context whose I/O threads run in this process's class (`zmq_options`)."""
    import zmq

    ctx = zmq.Context()
    for option, value in zmq_options().items():
        ctx.set(option, value)
    return ctx


@contextlib.contextmanager
def ordinary() -> Iterator[None]:
    """Run the block with the calling thread in SCHED_OTHER, its real-time class (if any)
    restored after: for a call that may wait in the kernel for work the kernel does at a lower
    priority. Reaping a child is one (`waitid` frees its `/proc` entries and can wait there on
    another task's disposal of them: docs/adr/0020-cpu-policy.md); a real-time thread would
    spin there above the very task it waits for."""
    priority = priority_here()
    if priority:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_OTHER | os.SCHED_RESET_ON_FORK, os.sched_param(0))
    try:
        yield
    finally:
        if priority:
            with contextlib.suppress(OSError):
                enter_thread(CpuPlan(priority=priority))


def in_force(pid: int) -> str:
    """What the kernel applies to process `pid`, in one line: its main thread's class, the
    real-time class of its other threads when the main thread is not in it, and its affinity
    (`format_cpus`): "fifo 4, cpus 0", "other nice 0, threads fifo 4, cpus 0" (the custodian:
    its front and I/O threads), "other nice 0, cpus 0-1"; "" when `pid` is gone or
    unreadable."""
    try:
        policy = os.sched_getscheduler(pid) & ~os.SCHED_RESET_ON_FORK
        priority = os.sched_getparam(pid).sched_priority
        cpus = format_cpus(frozenset(os.sched_getaffinity(pid)))
        nice = os.getpriority(os.PRIO_PROCESS, pid)
    except OSError:
        return ""
    name = _POLICY_NAMES.get(policy, str(policy))
    if policy in (os.SCHED_FIFO, os.SCHED_RR):
        return f"{name} {priority}, cpus {cpus}"
    threads = _realtime_threads(pid)
    others = f", threads fifo {threads}" if threads else ""
    return f"{name} nice {nice}{others}, cpus {cpus}"


def _realtime_threads(pid: int) -> int:
    """The highest SCHED_FIFO priority among `pid`'s threads (0: none in it)."""
    highest = 0
    try:
        tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return 0
    for tid in tids:
        with contextlib.suppress(OSError):
            if os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK == os.SCHED_FIFO:
                highest = max(highest, os.sched_getparam(tid).sched_priority)
    return highest


_POLICY_NAMES = {
    os.SCHED_OTHER: "other",
    os.SCHED_FIFO: "fifo",
    os.SCHED_RR: "rr",
    os.SCHED_BATCH: "batch",
    os.SCHED_IDLE: "idle",
}

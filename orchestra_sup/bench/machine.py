"""The machine a benchmark ran on, recorded beside its figures (`bench isolation`, `bench relay`).

Latency figures on a shared, virtualised machine move with things outside the tree: how many
CPUs it may use, how deep an idle vCPU sleeps (the cpuidle driver and governor, and whether a
process holds `/dev/cpu_dma_latency` below the kernel's default), the load beside it, and the
time the hypervisor gave other guests (steal). A benchmark samples the machine when it starts
and when it ends (`sample`) and records `record(start, end, ...)` as its JSON's `machine`:

- `cpu_count`: `os.cpu_count()`, the CPUs the kernel has online;
- `affinity_cpus`: the CPUs this process may run on (the size of its affinity mask);
- `cpuidle_driver`, `cpuidle_governor`: what `/sys/devices/system/cpu/cpuidle/current_driver`
  and `current_governor` say, or "unknown";
- `cpu_dma_latency_us`: the kernel's CPU latency target at the start, in microseconds
  (2,000,000,000: nobody holds one), or "unknown";
- `cpu_dma_latency_held`: whether some process held that target below the default at the
  start (True while this benchmark holds it), or "unknown";
- `hold_cpu_latency`: whether this benchmark held it at 0 itself (`--hold-cpu-latency`,
  `cpu_latency_held`);
- `loadavg_start`, `loadavg_end`: `os.getloadavg()`, the 1, 5 and 15 minute load averages;
- `steal_percent`: steal time over the run (`/proc/stat`) as a percentage of all CPU time in
  it, or "unknown".

The parsing (`cpu_times`, `steal_percent`, `sysfs_word`, `latency_target_us`) is pure, for tests;
`sample`, `record` and `cpu_latency_held` read and hold the live machine.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestra_sup.errors import ConfigError

PROC_STAT = Path("/proc/stat")
CPUIDLE = Path("/sys/devices/system/cpu/cpuidle")
CPU_DMA_LATENCY = Path("/dev/cpu_dma_latency")
LATENCY_DEFAULT_US = 2_000_000_000
"""The kernel's CPU latency target when no process holds one (PM_QOS_CPU_LATENCY_DEFAULT_VALUE)."""
UNKNOWN = "unknown"


def cpu_times(stat_text: str) -> tuple[int, int]:
    """(total, steal) clock ticks of all CPUs from the text of `/proc/stat`: the aggregate `cpu`
    line's user, nice, system, idle, iowait, irq, softirq and steal summed, and steal alone
    (guest time is already inside user and nice, so it is not added again). Raises `ValueError`
    when the text has no `cpu` line with at least those eight numbers."""
    for line in stat_text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(x) for x in fields[1:9]]
            if len(ticks) < 8:
                raise ValueError(f"/proc/stat cpu line has {len(ticks)} of 8 fields")
            return sum(ticks), ticks[7]
    raise ValueError("no aggregate cpu line in /proc/stat")


def steal_percent(start: tuple[int, int], end: tuple[int, int]) -> float | None:
    """Steal over the interval between two `cpu_times` readings, as a percentage of all CPU time
    in it, rounded to 2 digits; None when no tick passed (or the counters went back)."""
    total = end[0] - start[0]
    steal = end[1] - start[1]
    if total <= 0 or steal < 0:
        return None
    return round(100.0 * steal / total, 2)


def sysfs_word(text: str | None) -> str:
    """A sysfs attribute's value without its newline; "unknown" for None (unreadable) or
    an empty file."""
    value = (text or "").strip()
    return value or UNKNOWN


def latency_target_us(raw: bytes) -> int:
    """The CPU latency target in microseconds from the 4 bytes a read of `/dev/cpu_dma_latency`
    returns (a native 32-bit signed integer). Raises `ValueError` for any other length."""
    if len(raw) != 4:
        raise ValueError(f"expected 4 bytes from cpu_dma_latency, got {len(raw)}")
    value: int = struct.unpack("i", raw)[0]
    return value


@dataclass(frozen=True)
class Sample:
    """The machine at one moment: `loadavg` (1, 5, 15 minutes), `cpu` (`cpu_times`, or None
    when /proc/stat was unreadable) and `latency_us` (the kernel's CPU latency target in
    microseconds, or None when `/dev/cpu_dma_latency` was unreadable)."""

    loadavg: tuple[float, float, float]
    cpu: tuple[int, int] | None
    latency_us: int | None


def sample() -> Sample:
    """Read the live machine's load average, CPU times and CPU latency target. Never raises."""
    try:
        cpu: tuple[int, int] | None = cpu_times(PROC_STAT.read_text())
    except (OSError, ValueError):
        cpu = None
    load = os.getloadavg()
    return Sample(
        loadavg=(round(load[0], 2), round(load[1], 2), round(load[2], 2)),
        cpu=cpu,
        latency_us=_latency_target(),
    )


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _latency_target() -> int | None:
    """The kernel's current CPU latency target (opening the device read-only adds no request of
    its own), or None when it cannot be read."""
    try:
        fd = os.open(CPU_DMA_LATENCY, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return latency_target_us(os.read(fd, 4))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def record(start: Sample, end: Sample, *, hold_cpu_latency: bool) -> dict[str, Any]:
    """The `machine` object (module docstring) from the samples taken at the start and the end
    of a run (the latency target is the start's), with the CPU counts and idle-state settings
    read now. Never raises."""
    target = start.latency_us
    steal = None if start.cpu is None or end.cpu is None else steal_percent(start.cpu, end.cpu)
    return {
        "cpu_count": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)),
        "cpuidle_driver": sysfs_word(_read(CPUIDLE / "current_driver")),
        "cpuidle_governor": sysfs_word(_read(CPUIDLE / "current_governor")),
        "cpu_dma_latency_us": UNKNOWN if target is None else target,
        "cpu_dma_latency_held": UNKNOWN if target is None else target < LATENCY_DEFAULT_US,
        "hold_cpu_latency": hold_cpu_latency,
        "loadavg_start": list(start.loadavg),
        "loadavg_end": list(end.loadavg),
        "steal_percent": UNKNOWN if steal is None else steal,
    }


@contextmanager
def cpu_latency_held(hold: bool, path: Path = CPU_DMA_LATENCY) -> Iterator[None]:
    """With `hold`, keep the kernel's CPU latency target at 0 (no deep idle states) while the
    block runs: open `path`, write a 32-bit 0 and keep the file open (the kernel honours the
    request only while it is open), close it on the way out. Without `hold`, do nothing.

    Raises `ConfigError` (before the block runs) when `path` cannot be opened for writing or
    written: "--hold-cpu-latency: cannot hold /dev/cpu_dma_latency: <reason>".
    """
    if not hold:
        yield
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"--hold-cpu-latency: cannot hold {path}: {exc.strerror}") from None
    try:
        try:
            os.write(fd, struct.pack("i", 0))
        except OSError as exc:
            raise ConfigError(f"--hold-cpu-latency: cannot hold {path}: {exc.strerror}") from None
        yield
    finally:
        os.close(fd)


def one_line(machine: dict[str, Any]) -> str:
    """The `machine` object in one line, for a benchmark's table: "2 CPUs (2 usable), cpuidle
    haltpoll/haltpoll, cpu_dma_latency not held, load 1.2/1.5 (start/end, 1 min), steal 0.4 %"."""
    if machine["hold_cpu_latency"]:
        held = "held at 0 by this run"
    elif machine["cpu_dma_latency_held"] == UNKNOWN:
        held = UNKNOWN
    else:
        held = "held by another process" if machine["cpu_dma_latency_held"] else "not held"
    load = "/".join(f"{x:g}" for x in machine["loadavg_start"][:1] + machine["loadavg_end"][:1])
    steal = machine["steal_percent"]
    return (
        f"{machine['cpu_count']} CPUs ({machine['affinity_cpus']} usable), cpuidle "
        f"{machine['cpuidle_driver']}/{machine['cpuidle_governor']}, cpu_dma_latency {held}, "
        f"load {load} (start/end, 1 min), steal {steal}{'' if steal == UNKNOWN else ' %'}"
    )

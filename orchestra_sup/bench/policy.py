"""The CPU policy as the benchmarks run it (`[cpu]`, `system.cpupolicy`): the trees' config, the
probe client at the coordinator's class, and the lanes' throughput beside it.

- `policy_config`: the `[cpu]` table a bench tree runs with. By default `responsive()`: real
  time where allowed and the control plane on the lowest CPU this process may use (when it may
  use two or more); lanes at `[lanes] nice`, as measured best here (README, "Performance": the
  idle group cost the lanes 13-17% of their CPU). `--cpu-config FILE` replaces it with that
  file's `[cpu]`.
- `probe_like(client)`: this process, the probe client, takes the class, priority, niceness and
  affinity of the tree's coordinator process, on every thread (its ZeroMQ I/O thread is on the
  turn's path too), so each hop of a turn runs at one rank; the `Rank` it returns gives the old
  ones back (`Rank.take`).
- `LaneThroughput`: the CPU seconds per second the lanes under a tree's shards spent between two
  reads (psutil, every descendant of every shard process).
"""

from __future__ import annotations

import os
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import psutil

from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.errors import ConfigError
from orchestra_sup.protocol import frames as f
from orchestra_sup.system.cpupolicy import in_force


def responsive() -> dict[str, Any]:
    """The bench's default `[cpu]` table (see the module docstring)."""
    cpus = sorted(os.sched_getaffinity(0))
    table: dict[str, Any] = {"realtime": "auto"}
    if len(cpus) > 1:
        table["reserved_cpus"] = str(cpus[0])
    return table


def policy_config(path: Path | None) -> dict[str, Any]:
    """The `[cpu]` table of the TOML file `path`, or `responsive()` when None. Raises
    `ConfigError` (one line) when the file cannot be read, is not TOML or has no `[cpu]`."""
    if path is None:
        return responsive()
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"--cpu-config {path}: {exc}") from None
    table = data.get("cpu")
    if not isinstance(table, dict):
        raise ConfigError(f"--cpu-config {path}: no [cpu] table")
    return table


def write_config(path: Path, cpu: dict[str, Any], extra: str = "") -> Path:
    """Write a tree config of `[cpu]` = `cpu` (plus the TOML text `extra`) to `path`."""
    lines = ["[cpu]", *(f"{key} = {_toml(value)}" for key, value in cpu.items()), extra]
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


class Rank:
    """A process's scheduling as `probe_like` copies it: class, priority, niceness, affinity."""

    def __init__(self, policy: int, priority: int, nice: int, cpus: set[int]):
        self.policy, self.priority, self.nice, self.cpus = policy, priority, nice, cpus

    @classmethod
    def of(cls, pid: int) -> Rank:
        return cls(
            os.sched_getscheduler(pid) & ~os.SCHED_RESET_ON_FORK,
            os.sched_getparam(pid).sched_priority,
            os.getpriority(os.PRIO_PROCESS, pid),
            set(os.sched_getaffinity(pid)),
        )

    def take(self) -> None:
        """Give every thread of this process this rank (what this process may not take, an
        unprivileged niceness or class, is left as it is)."""
        own = threading.get_native_id()
        realtime = self.policy in (os.SCHED_FIFO, os.SCHED_RR)
        for tid in (int(t) for t in os.listdir("/proc/self/task")):
            # The calling thread, which starts the trees: nothing it starts inherits the class.
            # Not the others: a libzmq thread that reads its class back as it starts aborts
            # the process on the flag (pthread_setschedparam: EINVAL).
            policy = self.policy | (os.SCHED_RESET_ON_FORK if realtime and tid == own else 0)
            try:
                os.sched_setaffinity(tid, self.cpus)
                os.sched_setscheduler(tid, policy, os.sched_param(self.priority))
                os.setpriority(os.PRIO_PROCESS, tid, self.nice)
            except (PermissionError, ProcessLookupError):
                continue


def probe_like(client: CtlClient) -> tuple[Rank, dict[str, str]]:
    """Give this process the coordinator's rank (its process's, as `ctl status` names it: the
    supervisor's own when colocated); return the rank it had, for `Rank.take` afterwards, and
    {"probe": this process's class now, "coordinator": the coordinator's} (`in_force`)."""
    status = client.request(f.CtlStatus(), timeout_s=30.0)
    assert isinstance(status, f.StatusReply)
    pid = next((c.pid for c in status.children if c.name == "coordinator"), None)
    coordinator = pid or status.supervisor_pid
    before = Rank.of(os.getpid())
    Rank.of(coordinator).take()
    return before, {"probe": in_force(os.getpid()), "coordinator": in_force(coordinator)}


class LaneThroughput:
    """CPU seconds per second of the lanes under a tree's shards, from `start()` to `stop()`."""

    def __init__(self, client: CtlClient):
        status = client.request(f.CtlStatus(), timeout_s=30.0)
        assert isinstance(status, f.StatusReply)
        self._shards = [
            psutil.Process(c.pid) for c in status.children if c.role == "shard" and c.pid
        ]
        self._t0 = 0.0
        self._cpu0: dict[int, float] = {}

    def _lanes(self) -> dict[int, float]:
        """pid -> CPU seconds of every live descendant of every shard."""
        spent: dict[int, float] = {}
        for shard in self._shards:
            for proc in shard.children(recursive=True):
                try:
                    times = proc.cpu_times()
                except psutil.Error:
                    continue
                spent[proc.pid] = times.user + times.system
        return spent

    def start(self) -> None:
        self._cpu0 = self._lanes()
        self._t0 = time.monotonic()

    def stop(self) -> float:
        """CPU seconds per second since `start`, over the processes alive at the second read
        (one born since counts all it spent; one ended since, nothing)."""
        cpu1 = self._lanes()
        wall = time.monotonic() - self._t0
        spent = sum(cpu - self._cpu0.get(pid, 0.0) for pid, cpu in cpu1.items())
        return round(spent / wall, 3) if wall > 0 else 0.0

"""A host's shard stops its own lanes by its host's lease deadline (ARCHITECTURE.md §12, invariant
15; ADR 0022).

On a host, the agent SIGKILLs its shards when it can no longer know it holds its etcd lease
(`supervisor.hostlink`). An agent that is frozen (SIGSTOP, a stalled VM, swap) kills nothing, and
its shards' lanes would run on after etcd ended the lease and the root placed them elsewhere. So
the agent also hands each shard the lease's deadline at every renewal (`LeaseHold.stop_by`,
CLOCK_BOOTTIME seconds, one clock for every process of the machine), and `LeaseDeadline` stops
the shard's lanes itself once that deadline passes with no newer one: each lane's process group
and cgroup are SIGKILLed and the shard exits with `EXIT_FENCED`, for its supervisor to start it
again, lane-less. It looks every `CHECK_S` seconds, on CLOCK_BOOTTIME, so a machine that was
suspended past the deadline is caught at its first look after waking.

A shard that never got a hold (every shard of a root's tree) has no deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable

from orchestra_sup.system.linux import boottime

log = logging.getLogger(__name__)

CHECK_S = 0.1
"""Seconds between two looks at the deadline, at most."""
EXIT_FENCED = 75
"""The shard's exit status when it stopped its lanes for its host's lease."""


class LeaseDeadline:
    """The lease deadline of one shard. `hold(stop_by)` takes a newer deadline; `run()` waits
    for it to pass and then calls `fence()`: `kill_lanes` (which SIGKILLs every lane, blocking),
    then `os._exit(EXIT_FENCED)`. `clock` is CLOCK_BOOTTIME by default."""

    def __init__(
        self,
        name: str,
        kill_lanes: Callable[[], None],
        clock: Callable[[], float] = boottime,
    ) -> None:
        self.name = name
        self.kill_lanes = kill_lanes
        self.clock = clock
        self.stop_by: float | None = None
        self._held = asyncio.Event()

    def hold(self, stop_by: float) -> None:
        """Lanes may run until `stop_by` (a deadline earlier than the one held is ignored: holds
        may arrive out of order)."""
        if self.stop_by is None or stop_by > self.stop_by:
            self.stop_by = stop_by
        self._held.set()

    async def run(self) -> None:
        """Until cancelled: once a hold came, fence the shard when its deadline passes."""
        await self._held.wait()
        while True:
            assert self.stop_by is not None
            left = self.stop_by - self.clock()
            if left <= 0:
                self.fence()
                return
            await asyncio.sleep(min(CHECK_S, left))

    def fence(self) -> None:
        log.error(
            "%s: its host's lease deadline passed with no renewal (its agent is silent): "
            "stopping every lane and exiting",
            self.name,
        )
        with contextlib.suppress(Exception):  # nothing may keep the process from exiting
            self.kill_lanes()
        os._exit(EXIT_FENCED)


def kill_groups(pgids: list[int]) -> None:
    """SIGKILL each process group in `pgids` that still exists."""
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)

"""What a lane spends, and the grant it may not go past (ARCHITECTURE.md §7, seeds/003 "Cost and
budget enforcement": "exceeding a declared dimension raises a budget failure").

Every lane has a `Meter` (its `LaneResult.spent`); a lane with a grant (`LaneStart.budget`) is
also watched by its shard's one `BudgetWatch`, which stops it the moment it has spent more than
its grant in any dimension. The dimensions (`frames.Budget`):

- `wall_s`: seconds since the lane was admitted, on the monotonic clock, counting the time earlier
  generations ran it and leaving out the time it waited for a human (`Meter.hold`).
- `cpu_s`: user + system CPU seconds of every process its commands started. With cgroup tracking
  (`system.cgroups`), the kernel's figure for the command's cgroup (`cpu.stat` `usage_usec`: every
  process that was ever in it, whatever it did with sessions); without, sampled by `BudgetWatch`
  off the loop from the command's process tree (`tree_cpu_s`), which misses what a process used
  after the last sample, processes that escaped the tree, and every command of a lane with no
  grant (0.0 there).
- `output_bytes`: bytes its commands wrote on stdout and stderr, plus the lines it `emit`ted
  (each with its newline) and the notes it sent the coordinator (`tell_coordinator`, UTF-8);
  checked at once on every chunk, line and note, the others every `TICK_S`.

A lane has spent its grant in a dimension when it has used *more* than the grant there: a grant
of 0 output bytes lets a lane write nothing, and a lane that writes exactly its grant succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import psutil

from orchestra_sup.protocol import frames as f

log = logging.getLogger(__name__)

TICK_S = 0.1
"""Seconds between two checks of the lanes that have a grant (CPU and wall time): a lane is
stopped at most this long (plus the loop's lag) after it spent its grant."""


class Meter:
    """What one lane has spent so far, starting from `spent` (what earlier generations counted;
    None: nothing). `clock` is monotonic seconds (injected for tests)."""

    __slots__ = ("_clock", "_cpu", "_held_since", "_probe", "_since", "_wall", "output_bytes")

    def __init__(
        self, spent: f.Spend | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        spent = spent or f.Spend()
        self._clock = clock
        self._wall = spent.wall_s  # wall seconds counted before `_since`
        self._since = clock()
        self._held_since: float | None = None
        self._cpu = spent.cpu_s  # CPU seconds of the commands that have ended
        self._probe: Callable[[], float] | None = None
        self.output_bytes = spent.output_bytes

    # --- wall time -------------------------------------------------------------------------------

    def wall_s(self) -> float:
        """Seconds the lane has run, its waits for a human left out."""
        now = self._held_since if self._held_since is not None else self._clock()
        return self._wall + now - self._since

    def hold(self) -> None:
        """Stop the wall clock (the lane waits for a human); a no-op when it is stopped."""
        if self._held_since is None:
            self._held_since = self._clock()

    def release(self) -> float:
        """Start the wall clock again; returns the seconds it was held (0.0 when it was not)."""
        if self._held_since is None:
            return 0.0
        held = self._clock() - self._held_since
        self._wall -= held
        self._held_since = None
        return held

    # --- CPU and output --------------------------------------------------------------------------

    def command(self, probe: Callable[[], float]) -> None:
        """A command starts; `probe()` says the CPU seconds it has used so far (it must not
        block: a small cgroup file, or a figure sampled off the loop)."""
        self._probe = probe

    def command_ended(self) -> None:
        """The command has ended: what its probe says now is counted for good."""
        if self._probe is not None:
            self._cpu += self._probe()
            self._probe = None

    def cpu_s(self) -> float:
        return self._cpu + (self._probe() if self._probe is not None else 0.0)

    def spent(self) -> f.Spend:
        return f.Spend(
            wall_s=round(self.wall_s(), 3),
            cpu_s=round(self.cpu_s(), 3),
            output_bytes=self.output_bytes,
        )


def overspent(grant: f.Budget, spent: f.Spend) -> str | None:
    """The one-line reason a lane with `grant` that has spent `spent` must stop, e.g.
    "budget exhausted: cpu_s 2.03 of 2 s used"; None while it is within its grant."""
    if grant.output_bytes is not None and spent.output_bytes > grant.output_bytes:
        return (
            f"budget exhausted: output_bytes {spent.output_bytes} "
            f"of {grant.output_bytes} bytes used"
        )
    if grant.cpu_s is not None and spent.cpu_s > grant.cpu_s:
        return f"budget exhausted: cpu_s {spent.cpu_s:.2f} of {grant.cpu_s:g} s used"
    if grant.wall_s is not None and spent.wall_s > grant.wall_s:
        return f"budget exhausted: wall_s {spent.wall_s:.2f} of {grant.wall_s:g} s used"
    return None


class TreeCpu:
    """The CPU seconds of one command's process tree, sampled (where cgroups are unavailable).
    `sample` blocks (it reads /proc): `BudgetWatch` calls it off the loop; `last` is the latest
    figure, never smaller than an earlier one."""

    __slots__ = ("last", "pid")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.last = 0.0

    def sample(self) -> None:
        """Sum user + system CPU of the leader and its live descendants, each with the CPU of
        the children it has reaped (so a process that ended is counted once, in its parent)."""
        total = 0.0
        try:
            leader = psutil.Process(self.pid)
            procs = [leader, *leader.children(recursive=True)]
        except psutil.Error:
            return
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        self.last = max(self.last, total)


class BudgetWatch:
    """A shard's check of the lanes that have a grant: every `TICK_S` seconds, while there is
    one, each watched lane's spend is compared with its grant, and `stop(reason)` is called for
    one that has spent more (it is then no longer watched). Lanes without a grant cost nothing.
    `spawn` runs a coroutine as a task the shard owns."""

    def __init__(self, spawn: Callable[..., asyncio.Task[None]]) -> None:
        self._spawn = spawn
        self._watched: dict[str, tuple[f.Budget, Meter, Callable[[str], None]]] = {}
        self._samplers: dict[str, TreeCpu] = {}
        self._task: asyncio.Task[None] | None = None

    def watch(self, lane: str, grant: f.Budget, meter: Meter, stop: Callable[[str], None]) -> None:
        self._watched[lane] = (grant, meter, stop)
        if self._task is None:
            self._task = self._spawn(self._run())

    def unwatch(self, lane: str) -> None:
        self._watched.pop(lane, None)
        self._samplers.pop(lane, None)

    def sample(self, lane: str, pid: int) -> TreeCpu | None:
        """A sampler for `lane`'s command with leader `pid`, refreshed every tick while the lane
        is watched and has a CPU grant; None (nothing sampled) otherwise."""
        watched = self._watched.get(lane)
        if watched is None or watched[0].cpu_s is None:
            return None
        sampler = self._samplers[lane] = TreeCpu(pid)
        return sampler

    def check_output(self, lane: str) -> None:
        """Compare `lane`'s output with its `output_bytes` grant now (a chunk just came); an
        int comparison, nothing for a lane without such a grant."""
        watched = self._watched.get(lane)
        if watched is None:
            return
        grant, meter, _ = watched
        if grant.output_bytes is not None and meter.output_bytes > grant.output_bytes:
            self._check(lane, *watched)

    def _check(self, lane: str, grant: f.Budget, meter: Meter, stop: Callable[[str], None]) -> None:
        reason = overspent(grant, meter.spent())
        if reason is not None:
            self.unwatch(lane)
            stop(reason)

    async def _run(self) -> None:
        try:
            while self._watched:
                await asyncio.sleep(TICK_S)
                if self._samplers:
                    await asyncio.to_thread(_sample_all, list(self._samplers.values()))
                for lane, watched in list(self._watched.items()):
                    self._check(lane, *watched)
        finally:
            self._task = None


def _sample_all(samplers: list[TreeCpu]) -> None:
    for sampler in samplers:
        sampler.sample()

"""When each task's retry backoff ends, on the monotonic clock.

A task's record keeps when its backoff ends as wall time (`TaskRecord.retry_at`, Unix seconds:
stored, shown in reports, and what a coordinator started later reads). An interval is measured
on the monotonic clock only: each `retry_at` is read onto it once, the first time the coordinator
sees it (what is left of it then), and from then on the backoff ends when the monotonic clock
says so, so a wall-clock step (an NTP correction, an operator's `date`) neither fires a retry
early nor holds it back.

A pump reads the monotonic clock once (`now`) and asks both questions at that instant: every
backoff it found holding a task is one whose end `wake_in` counts. Read twice, a backoff that
ended while the pump ran (a short one on a loaded machine) held its task but was no longer
ahead when the wake-up was set, and the task waited for some other event to pump again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from orchestra_sup.coordinator.runner import PlanRecord


class Backoffs:
    """The backoffs of the plans not done (see the module docstring). `wall` and `monotonic`
    are the clocks (seconds; the system's by default)."""

    def __init__(
        self,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.wall = wall
        self.monotonic = monotonic
        self._ends: dict[tuple[str, str], tuple[float, float]] = {}
        """(plan id, task id) -> (its `retry_at`, when it ends on the monotonic clock)."""

    def now(self) -> float:
        """The monotonic clock (seconds): one reading per pump, for `holds` and `wake_in`."""
        return self.monotonic()

    def holds(self, plan_id: str, task_id: str, retry_at: float, now: float) -> bool:
        """Whether the backoff task `task_id` of plan `plan_id` waits out (its `retry_at`) has
        yet to end at `now` (a reading of `now()`)."""
        return self._end(plan_id, task_id, retry_at, now) > now

    def wake_in(self, plans: Iterable[PlanRecord], now: float) -> float | None:
        """Seconds from `now` (a reading of `now()`) until the earliest backoff of `plans` (all
        those not done) ends (> 0), or None when none is still ahead at `now`; backoffs no
        longer waited on are forgotten. Every backoff `holds` was true for at the same `now`
        is counted."""
        ends: dict[tuple[str, str], tuple[float, float]] = {}
        for plan in plans:
            for task_id, retry_at in plan.backoffs():
                end = self._end(plan.id, task_id, retry_at, now)
                ends[(plan.id, task_id)] = (retry_at, end)
        self._ends = ends
        left = [end - now for _, end in ends.values() if end > now]
        return min(left, default=None)

    def _end(self, plan_id: str, task_id: str, retry_at: float, now: float) -> float:
        """When the backoff ending at `retry_at` (wall time) ends on the monotonic clock: read
        onto it the first time it is seen (at `now`)."""
        key = (plan_id, task_id)
        seen = self._ends.get(key)
        if seen is None or seen[0] != retry_at:
            seen = self._ends[key] = (retry_at, now + (retry_at - self.wall()))
        return seen[1]

"""Restart intensity and restart backoff, over an injected monotonic clock.

OTP `supervisor.erl` (`add_restart/1`): more than `max_restarts` restarts within `max_seconds`
means the failure is not transient, and the supervisor gives up and escalates.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class RestartIntensity:
    """Counts restarts in a sliding window.

    `max_restarts` restarts are allowed within `max_seconds` seconds; `record()` returns False
    when one more would exceed that (the caller escalates). `clock` returns seconds, monotonic.
    """

    def __init__(
        self, max_restarts: int, max_seconds: float, clock: Callable[[], float] = time.monotonic
    ):
        self.max_restarts = max_restarts
        self.max_seconds = max_seconds
        self.clock = clock
        self._times: deque[float] = deque()

    def record(self) -> bool:
        now = self.clock()
        self._times.append(now)
        while self._times and now - self._times[0] > self.max_seconds:
            self._times.popleft()
        return len(self._times) <= self.max_restarts


class Backoff:
    """Delay before a child's next restart: none for the first, then `initial_s` doubling to
    `max_s`; back to none once the child has stayed up for `reset_after_s` seconds."""

    def __init__(self, initial_s: float, max_s: float, reset_after_s: float):
        self.initial_s = initial_s
        self.max_s = max_s
        self.reset_after_s = reset_after_s
        self._next = 0.0

    def next_delay(self, uptime_s: float) -> float:
        """The delay (seconds) for a restart after a run of `uptime_s` seconds."""
        if uptime_s >= self.reset_after_s:
            self._next = 0.0
        delay = self._next
        self._next = self.initial_s if delay == 0.0 else min(self.max_s, delay * 2)
        return delay

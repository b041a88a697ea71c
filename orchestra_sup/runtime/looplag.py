"""Event-loop lag: how late the loop runs a callback that asked to be woken on time.

A sampler task sleeps `interval_s` and records how much later than asked it woke. The last
`window` samples give p50/p99/max; every sample since the start is also counted into `buckets`
(seconds, `histogram.LOOP_LAG_BOUNDS_S`), which heartbeats carry to the metrics. A stalled loop
shows up as one large sample when it recovers, and as missing heartbeats while it is stalled
(which is what the supervisor's watchdog acts on).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from orchestra_sup.histogram import LOOP_LAG_BOUNDS_S, Buckets


class LoopLag:
    """Sliding-window loop-lag figures in milliseconds, and a histogram of every sample in
    seconds (`buckets`).

    `interval_s` (default 0.1 s) is the sampling period; `window` (default 600 samples, about a
    minute) bounds memory.
    """

    def __init__(self, interval_s: float = 0.1, window: int = 600):
        self.interval_s = interval_s
        self.samples: deque[float] = deque(maxlen=window)
        self.buckets = Buckets(LOOP_LAG_BOUNDS_S)

    async def run(self) -> None:
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(self.interval_s)
            late = max(0.0, time.monotonic() - t0 - self.interval_s)
            self.samples.append(late * 1000.0)
            self.buckets.observe(late)

    def percentile(self, q: float) -> float:
        """The q-quantile (0..1) of the window in ms; 0.0 before the first sample."""
        if not self.samples:
            return 0.0
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def figures(self) -> tuple[float, float, float]:
        """(p50, p99, max) in milliseconds."""
        return self.percentile(0.5), self.percentile(0.99), max(self.samples, default=0.0)

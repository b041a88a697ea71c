"""Prometheus-style histograms: counting observations into fixed buckets, and reading them back.

`Buckets` is the counting side, cheap enough for the relay's hot path: an observation is one
`bisect` into a tuple of fixed upper bounds and an integer add (no allocation of its own).
`Buckets.frame()` gives the wire shape, `frames.Histogram` (cumulative counts, as Prometheus
exposes them). `quantile` and `figures_ms` read a `frames.Histogram` back as estimates; they are
the one place that does, so `ctl status` and anything else that summarises a histogram agree.

The bucket bounds of each quantity are here too, so every process of every release that shares
them reports histograms Prometheus can aggregate.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left
from collections.abc import Sequence

from orchestra_sup.protocol import frames as f

LOOP_LAG_BOUNDS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Event-loop lag, seconds: a healthy loop stays in the first buckets; the watchdog acts long
after the last one."""
RELAY_BOUNDS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
"""A relay round trip, seconds: from the ~100 us of a cached read up to the 55 s deadline."""
BATCH_BOUNDS_ROWS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000)
"""Writes per write-behind transaction (`state.store.MAX_BATCH` is the last bound)."""


class Buckets:
    """Observations counted into buckets with upper bounds `bounds` (seconds, rows: the
    quantity's unit), Prometheus's `le` rule: a value lands in the first bucket whose bound is
    >= it, or in the +Inf bucket past the last. `total` is the sum of every value observed.

    Raises `ValueError` unless `bounds` is non-empty, finite and strictly increasing.
    Not locked: one thread observes; another may read `frame()` (each count is read whole, so
    the frame is at worst a moment old in some buckets, never decreasing).
    """

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]):
        if not bounds or not all(math.isfinite(b) for b in bounds):
            raise ValueError(f"histogram bounds must be finite and non-empty, got {bounds!r}")
        if any(a >= b for a, b in itertools.pairwise(bounds)):
            raise ValueError(f"histogram bounds must increase strictly, got {bounds!r}")
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        """Per bucket (not cumulative); the last is the +Inf bucket."""
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Count one observation of `value`."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def frame(self) -> f.Histogram:
        """Everything observed so far, as the wire shape (cumulative counts)."""
        return f.Histogram(
            bounds=self.bounds, counts=tuple(itertools.accumulate(self.counts)), total=self.total
        )


def quantile(hist: f.Histogram, q: float) -> float | None:
    """An upper estimate of the `q`-quantile (0 < q <= 1) of `hist`: the upper bound of the
    bucket that holds it. An observation past the last bound is estimated as the last bound,
    as Prometheus's `histogram_quantile` does (the +Inf bucket has no upper bound to give).
    None for an empty histogram. Raises `ValueError` for `q` outside (0, 1] or for counts that
    do not match the bounds (one more, the +Inf bucket)."""
    if not 0 < q <= 1:
        raise ValueError(f"a quantile is in (0, 1], got {q!r}")
    if len(hist.counts) != len(hist.bounds) + 1:
        raise ValueError(
            f"a histogram has one count more than bounds, got {len(hist.counts)} counts "
            f"for {len(hist.bounds)} bounds"
        )
    total = hist.counts[-1]
    if total <= 0:
        return None
    rank = q * total
    for bound, cumulative in zip(hist.bounds, hist.counts, strict=False):
        if cumulative >= rank:
            return bound
    return hist.bounds[-1]


def figures_ms(hist: f.Histogram | None) -> tuple[float, float, float] | None:
    """(p50, p99, max) of a histogram in seconds, in milliseconds (3 decimals), each the upper
    bound of its bucket (`quantile`; max is q = 1). None when `hist` is None or empty."""
    if hist is None:
        return None
    marks = [quantile(hist, q) for q in (0.5, 0.99, 1.0)]
    if marks[0] is None or marks[1] is None or marks[2] is None:
        return None
    return (round(marks[0] * 1000, 3), round(marks[1] * 1000, 3), round(marks[2] * 1000, 3))

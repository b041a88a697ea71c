"""Histogram bucket math and the percentile estimate read back from buckets."""

from __future__ import annotations

import pytest

from orchestra_sup.histogram import (
    BATCH_BOUNDS_ROWS,
    LOOP_LAG_BOUNDS_S,
    RELAY_BOUNDS_S,
    Buckets,
    figures_ms,
    quantile,
)
from orchestra_sup.protocol import frames as f


def test_value_on_a_bound_counts_in_that_bucket() -> None:
    """Prometheus's `le`: a value equal to a bound is in that bound's bucket, not the next."""
    b = Buckets((1.0, 2.0, 4.0))
    for value in (0.0, 1.0, 1.5, 2.0, 4.0, 4.5, 100.0):
        b.observe(value)
    assert b.counts == [2, 2, 1, 2]
    assert b.total == pytest.approx(113.0)


def test_frame_is_cumulative_with_the_total_last() -> None:
    """The wire shape has cumulative counts, one more than bounds, the last being the count."""
    b = Buckets((0.001, 0.01, 0.1))
    for value in (0.0005, 0.005, 0.005, 0.05, 1.0):
        b.observe(value)
    frame = b.frame()
    assert frame.bounds == (0.001, 0.01, 0.1)
    assert frame.counts == (1, 3, 4, 5)
    assert frame.total == pytest.approx(1.0605)


def test_empty_buckets_give_zeros() -> None:
    """Before any observation every bucket is zero (an empty histogram, not a missing one)."""
    frame = Buckets(RELAY_BOUNDS_S).frame()
    assert frame.counts == (0,) * (len(RELAY_BOUNDS_S) + 1)
    assert frame.total == 0.0


@pytest.mark.parametrize("bounds", [(), (1.0, 1.0), (2.0, 1.0), (1.0, float("inf"))])
def test_bad_bounds_are_refused(bounds: tuple[float, ...]) -> None:
    """Bounds must be non-empty, finite and strictly increasing."""
    with pytest.raises(ValueError, match="bounds"):
        Buckets(bounds)


@pytest.mark.parametrize("bounds", [LOOP_LAG_BOUNDS_S, RELAY_BOUNDS_S, BATCH_BOUNDS_ROWS])
def test_the_project_bounds_are_valid(bounds: tuple[float, ...]) -> None:
    """Every quantity's bounds build a histogram."""
    assert Buckets(bounds).bounds == tuple(float(x) for x in bounds)


def hist(bounds: tuple[float, ...], per_bucket: list[int]) -> f.Histogram:
    b = Buckets(bounds)
    b.counts = list(per_bucket)
    return b.frame()


def test_quantile_is_the_upper_bound_of_its_bucket() -> None:
    """The q-quantile's estimate is the bound of the first bucket whose cumulative count reaches
    q times the total: 100 values, 50 <= 1, 45 in (1, 2], 5 in (2, 4]."""
    h = hist((1.0, 2.0, 4.0), [50, 45, 5, 0])
    assert quantile(h, 0.5) == 1.0
    assert quantile(h, 0.51) == 2.0
    assert quantile(h, 0.95) == 2.0
    assert quantile(h, 0.99) == 4.0
    assert quantile(h, 1.0) == 4.0


def test_quantile_past_the_last_bound_is_the_last_bound() -> None:
    """The +Inf bucket has no upper bound: the estimate is the last finite one, as
    Prometheus's histogram_quantile gives."""
    h = hist((1.0, 2.0), [1, 0, 9])
    assert quantile(h, 0.5) == 2.0
    assert quantile(h, 0.05) == 1.0


def test_quantile_of_an_empty_histogram_is_none() -> None:
    """No observation, no estimate."""
    assert quantile(hist((1.0,), [0, 0]), 0.5) is None
    assert figures_ms(hist((1.0,), [0, 0])) is None
    assert figures_ms(None) is None


def test_quantile_refuses_a_bad_q_or_shape() -> None:
    """q outside (0, 1] and counts that do not fit the bounds are refused, naming the problem."""
    h = hist((1.0,), [1, 0])
    for q in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="quantile"):
            quantile(h, q)
    with pytest.raises(ValueError, match="one count more"):
        quantile(f.Histogram(bounds=(1.0, 2.0), counts=(1, 2)), 0.5)


def test_figures_ms_are_p50_p99_max_in_milliseconds() -> None:
    """(p50, p99, max) of a relay histogram in ms: 98 round trips <= 0.25 ms, one <= 1 ms, one
    <= 60 s."""
    b = Buckets(RELAY_BOUNDS_S)
    for _ in range(98):
        b.observe(0.0002)
    b.observe(0.0008)
    b.observe(42.0)
    assert figures_ms(b.frame()) == (0.25, 1.0, 60000.0)

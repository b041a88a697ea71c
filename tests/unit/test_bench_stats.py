"""`bench.stats.summary`: nearest-rank percentiles, p99.9 and the max beside p99."""

from __future__ import annotations

import pytest

from orchestra_sup.bench.stats import nearest_rank, summary


def test_summary_reports_p999_and_max_beside_p99() -> None:
    samples = [float(x) for x in range(1, 2001)]  # 1 .. 2000
    figures = summary(samples, "us", digits=1)
    assert figures == {
        "p50_us": 1001.0,
        "p90_us": 1801.0,
        "p99_us": 1981.0,
        "p999_us": 1999.0,
        "max_us": 2000.0,
        "n": 2000,
    }


def test_one_outlier_is_the_max_not_the_p99() -> None:
    """A single slow sample out of 200: p99 stays with the rest, the max shows it."""
    figures = summary([1.0] * 199 + [50.0], "ms")
    assert figures["p99_ms"] == 1.0 and figures["max_ms"] == 50.0 and figures["p999_ms"] == 50.0


def test_the_max_is_rounded_like_the_percentiles() -> None:
    assert summary([0.123456, 0.5], "ms", digits=3)["max_ms"] == 0.5
    assert summary([1.23456], "us", digits=1)["max_us"] == 1.2


def test_no_samples_is_refused() -> None:
    with pytest.raises(ValueError, match="no samples"):
        summary([], "ms")
    with pytest.raises(ValueError, match="no samples"):
        nearest_rank([], 0.5)

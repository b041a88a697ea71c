"""`orchestra-sup bench console` in short: a real tree serving the HTTP API to 5 consoles, its
JSON figures, and every console's event stream whole (no timing is judged: that is the
bench's, not a test's)."""

from __future__ import annotations

import json

import pytest

from tests.integration.harness import assert_no_leftovers, osup

pytestmark = pytest.mark.integration

CONSOLES = 5


def test_bench_console_streams_every_event_once() -> None:
    """One run of both phases: the loop-lag figures of each phase and their ratios; the
    consoles each read a contiguous run of seqs from where they started (no gap, no repeat,
    none missed at the start), made the page's requests, and the tree restarted nothing."""
    done = osup(
        "bench", "console", "--consoles", str(CONSOLES), "--duration", "5", "--runs", "1", "--json"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["clean"] and result["restarts"] == 0 and result["failed"] == 0
    assert result["plans"] > 0
    (run,) = result["runs"]
    assert run["order"] == ["none", "consoles"]
    for phase in ("none", "consoles"):
        lag = run[phase]["lag"]
        assert lag["samples"] > 0 and 0 < lag["p50_ms"] <= lag["p99_ms"] <= lag["max_ms"]
        assert lag["mean_ms"] is not None and run[phase]["events_logged_per_s"] > 0
    assert "consoles" not in run["none"]
    seen = run["consoles"]["consoles"]
    assert seen["gaps"] == seen["repeats"] == 0 and seen["events_per_s"] > 0
    starts, ends = seen["first_seq"], seen["last_seq"]
    assert len(starts) == CONSOLES and len(set(starts)) == 1 and min(ends) >= starts[0]
    made = seen["requests_by"]
    for what in ("status", "tree", "plans", "lanes"):
        assert made[f"{what} 200"] == CONSOLES, made
    assert made.get("plan 200", 0) > 0 and not any(k.endswith("error") for k in made), made
    assert run["ratio_p99"] is not None and run["ratio_mean"] is not None
    assert result["ratio_p99"]["min"] <= result["ratio_p99"]["median"] <= result["ratio_p99"]["max"]
    assert result["delivery_lag_ms"]["n"] > 0
    assert result["machine"]["cpu_count"] >= 1
    assert_no_leftovers()


def test_bench_console_refuses_bad_options_before_it_starts() -> None:
    """Exit 2, one line naming the option, no tree started."""
    done = osup("bench", "console", "--consoles", "0")
    assert done.returncode == 2 and "--consoles" in done.stderr and "Traceback" not in done.stderr

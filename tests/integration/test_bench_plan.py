"""`orchestra-sup bench plan` at tiny sizes: runs on a real tree and emits well-formed JSON."""

from __future__ import annotations

import json

import pytest

from tests.integration.harness import assert_no_leftovers, osup

pytestmark = pytest.mark.integration


def test_bench_plan_emits_well_formed_json() -> None:
    """Plans of 3 and 8 tasks, two runs each: every shape at every size has its submit-to-done
    figures (median within min and max, one per run), the coordinator's loop-lag p99 from the
    run's heartbeats, and the method; nothing is left running."""
    done = osup("bench", "plan", "--tasks", "3,8", "--runs", "2", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result["results"]) == {"chain", "fan_out", "fan_in"}
    for sizes in result["results"].values():
        assert list(sizes) == ["3", "8"]
        for size, row in sizes.items():
            assert row["tasks"] == int(size)
            spread = row["submit_to_done_s"]
            assert 0 < spread["min"] <= spread["median"] <= spread["max"]
            assert len(row["runs"]) == 2
            for run in row["runs"]:
                assert run["submit_to_done_s"] > 0 and run["lag_samples"] > 0
                assert 0 < run["lag_p99_ms"] <= run["lag_max_ms"]
    assert result["target"]["met"] is None  # no 10,000-task plan in this run
    assert result["method"]["runs"] == 2
    assert_no_leftovers()


@pytest.mark.parametrize("tasks", ["10,x", "100,10", "1,10", "", "10,100000"])
def test_bench_plan_refuses_bad_sizes_in_one_line(tasks: str) -> None:
    done = osup("bench", "plan", "--tasks", tasks)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "--tasks" in done.stderr

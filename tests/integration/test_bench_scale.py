"""`bench scale` with tiny counts: runs on a real tree and emits well-formed JSON."""

from __future__ import annotations

import json

import pytest

from tests.integration.harness import osup

pytestmark = pytest.mark.integration


def test_bench_scale_emits_well_formed_json() -> None:
    done = osup("bench", "scale", "--counts", "2,10", "--iterations", "10", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert list(result["steps"]) == ["2", "10"]
    for step in result["steps"].values():
        assert step["relay"]["p50_us"] > 0 and step["relay"]["n"] == 10
        assert len(step["samples_us"]) == 10
        assert isinstance(step["shard_bytes_per_lane"], int)
    assert result["steps"]["2"]["relay"]["ratio_p50"] == 1.0
    assert isinstance(result["target"]["met"], bool)


@pytest.mark.parametrize("counts", ["10,x", "100,10", "0,10", "", "10,100000"])
def test_bench_scale_refuses_bad_counts_in_one_line(counts: str) -> None:
    done = osup("bench", "scale", "--counts", counts)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "--counts" in done.stderr

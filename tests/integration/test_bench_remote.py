"""`bench relay --remote` on real processes (issue 21): a host agent's shard through its data
port, beside the same shard over ipc and a raw tcp+CURVE echo, in one short run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_bench_relay_remote_reports_three_series_and_their_ratios() -> None:
    argv = ["bench", "relay", "--remote", "--iterations", "50", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "orchestra_sup", *argv],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    for series in ("floor", "direct", "remote"):
        assert result[series]["n"] == 50 and result[series]["p50_us"] > 0
    assert result["ratios"]["remote_to_floor_p50"] > 0
    assert len(result["rounds"]) == result["method"]["rounds"] == 5

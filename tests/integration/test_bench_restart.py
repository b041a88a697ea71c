"""`orchestra-sup bench restart --json` as a user runs it, with a tiny kill count."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.harness import assert_no_leftovers

pytestmark = pytest.mark.integration


def test_bench_restart_json_has_the_documented_shape() -> None:
    """Two kills per spawn mode: well-formed JSON with restart figures for the fork template and
    for exec, the fresh-interpreter baseline, their ratio and the method; every replacement of
    the fork tree was forked and every one of the exec tree exec'd; nothing is left running."""
    proc = subprocess.run(
        [sys.executable, "-m", "orchestra_sup", "bench", "restart", "--json", "--kills", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    for key in ("restart", "restart_exec"):
        stats = result[key]
        assert stats["n"] == 2
        for figure in ("p50_ms", "p90_ms", "min_ms", "max_ms"):
            assert isinstance(stats[figure], float) and stats[figure] > 0, (key, figure)
        assert stats["min_ms"] <= stats["p50_ms"] <= stats["p90_ms"] <= stats["max_ms"]
    assert result["restart"]["spawned"] == {"fork": 2, "exec": 0}
    assert result["restart_exec"]["spawned"] == {"fork": 0, "exec": 2}
    baseline = result["baseline"]
    assert baseline["n"] == 4 and baseline["interpreter_p50_ms"] > 0
    assert result["ratio_p50"] == pytest.approx(
        result["restart"]["p50_ms"] / baseline["interpreter_p50_ms"], abs=1e-3
    )
    assert isinstance(result["target"]["met"], bool)
    assert result["method"]["kills"] == 2
    assert_no_leftovers()

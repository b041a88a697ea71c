"""`bench all`: runs the chosen benchmarks, writes a JSON file each and summary.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestra_sup.bench.suite import plot_cdf
from tests.integration.harness import osup

pytestmark = pytest.mark.integration


def test_bench_all_writes_json_and_a_summary(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = osup("bench", "all", "--quick", "--only", "persist", "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["benches"]["persist"]["error"] is None
    persist = json.loads((out / "persist.json").read_text())
    assert persist["ratio"] > 0 and persist["elapsed_s"] >= 0
    summary = (out / "summary.md").read_text()
    assert "## persist" in summary and "| write-behind vs one synced commit per event |" in summary


def test_bench_all_refuses_an_unknown_name_in_one_line(tmp_path: Path) -> None:
    done = osup("bench", "all", "--only", "persist,nope", "--out", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "orchestra-sup: --only: unknown benchmark 'nope' "
        "(known: relay, isolation, reaction, restart, scale, persist, chaos)"
    ]
    assert list(tmp_path.iterdir()) == []


def test_latency_plot_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "p.png"
    plot_cdf(path, "t", "ms", {"a": [1.0, 2.0, 3.0], "b": [0.5, 5.0]})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("out", ["/proc/no/such/dir", "/dev/null"])
def test_bench_all_refuses_an_out_dir_it_cannot_make_in_one_line(out: str) -> None:
    done = osup("bench", "all", "--only", "persist", "--out", out)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "--out" in done.stderr

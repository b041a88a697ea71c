"""`start --colocated`: every role a component of one process and loop, the same code paths."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from orchestra_sup.bench.isolation import MODES
from orchestra_sup.bench.policy import responsive
from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.client.oneshot import private_tree, wait_plan
from orchestra_sup.protocol import frames as f
from tests.integration.harness import (
    assert_machine_record,
    assert_no_leftovers,
    cpu_latency_holdable,
    make_repo,
)

pytestmark = pytest.mark.integration


def test_a_colocated_tree_runs_plans_restarts_components_and_stops_clean(tmp_path: Path) -> None:
    try:
        _runs_plans_restarts_components_and_stops_clean(tmp_path)
    except Exception as exc:  # the tree's own account is in its log: show its end
        log = (tmp_path / "state" / "tree.log").read_text(errors="replace").splitlines()
        raise AssertionError(f"{exc!r}; tree log ends:\n" + "\n".join(log[-40:])) from exc


def _runs_plans_restarts_components_and_stops_clean(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "ws")
    with private_tree(
        workspace=repo,
        state_dir=tmp_path / "state",
        shards=2,
        lanes_per_shard=4,
        config=None,
        colocated=True,
    ) as client:
        status = client.request(f.CtlStatus(), timeout_s=10)
        assert isinstance(status, f.StatusReply)
        assert {c.pid for c in status.children} == {status.supervisor_pid}
        assert psutil.Process(status.supervisor_pid).children() == []  # no child processes
        spec = f.PlanSpec(
            name="colo",
            tasks=[
                f.TaskSpec(id="a", run="echo made > a.txt", commit=True),
                f.TaskSpec(id="b", run="cat a.txt", needs=["a"]),
                *(f.TaskSpec(id=f"p{i}", run="true") for i in range(6)),
            ],
        )
        accepted = client.request(f.CtlSubmit(plan=spec), timeout_s=10)
        assert isinstance(accepted, f.PlanAccepted)
        report = wait_plan(client, accepted.id, timeout_s=60)
        assert report.ok and "made" in report.tasks[1].output_tail
        assert {t.shard for t in report.tasks} == {"shard-0", "shard-1"}

        for name in ("shard-1", "custodian"):  # peers reach each new generation again
            assert client.request(f.CtlRestart(name=name), timeout_s=30) == f.Ack()
            _wait_generation(client, name, 2)
        read = client.request(f.CtlCall(tool="stat", params={"path": "README"}), timeout_s=30)
        assert isinstance(read, f.ToolResult) and read.value["type"] == "file"
        again = client.request(f.CtlSubmit(plan=spec), timeout_s=10)
        assert isinstance(again, f.PlanAccepted)
        assert wait_plan(client, again.id, timeout_s=60).ok
    assert_no_leftovers()


def _wait_generation(client: CtlClient, name: str, generation: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status = client.request(f.CtlStatus(), timeout_s=10)
        assert isinstance(status, f.StatusReply)
        child = next(c for c in status.children if c.name == name)
        if child.generation == generation and child.state == "running":
            return
        time.sleep(0.05)
    raise AssertionError(f"{name} did not reach generation {generation}")


def test_bench_isolation_emits_well_formed_json() -> None:
    """Every mode with a handful of probes: every documented figure is present and positive,
    the lanes' throughput and its ratio, and the machine it ran on is recorded, with
    --hold-cpu-latency held where this process may."""
    hold = cpu_latency_holdable()
    out = subprocess.run(
        [sys.executable, "-m", "orchestra_sup", "bench", "isolation", "--probes", "5", "--json"]
        + (["--hold-cpu-latency"] if hold else []),
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    for mode in MODES:
        figures = result[mode]
        assert figures["lane_cpu_s_per_s"] > 0, mode  # the load ran
        for key in (
            "idle_turn_p50_ms",
            "idle_turn_p99_ms",
            "idle_turn_p999_ms",
            "idle_turn_max_ms",
            "loaded_turn_p50_ms",
            "loaded_turn_p99_ms",
            "loaded_turn_p999_ms",
            "loaded_turn_max_ms",
            "ratio",
        ):
            assert isinstance(figures[key], float | int) and figures[key] >= 0, (mode, key)
        for phase in ("idle", "loaded"):
            worst = max(figures["samples_ms"][phase])  # samples keep 4 digits, figures 3
            assert figures[f"{phase}_turn_max_ms"] == pytest.approx(worst, abs=1e-3)
        # None when a phase was shorter than a heartbeat, as with 5 probes
        assert figures["host_loop_p99_ms"] is None or figures["host_loop_p99_ms"] >= 0
    assert result["method"]["probes_per_phase"] == 5
    machine = result["machine"]
    assert_machine_record(machine, held=hold)
    # the probe client runs at the coordinator's class, niceness and affinity, in every mode
    assert machine["probe"] == machine["coordinator"] and set(machine["probe"]) == set(MODES)
    assert machine["coordinator"]["default"] == result["default"]["cpu"]["coordinator"]
    assert result["throughput_ratio"] > 0
    assert machine["policy"] == responsive()


def test_bench_isolation_refuses_an_unholdable_cpu_latency_in_one_line(tmp_path: Path) -> None:
    """--hold-cpu-latency where /dev/cpu_dma_latency cannot be opened for writing (here: a
    read-only file bound over it in a private mount namespace): one line naming the device and
    why, exit 2, before any tree starts (nothing on stdout)."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) to make the device read-only in a namespace")
    stand_in = tmp_path / "cpu_dma_latency"
    stand_in.write_bytes(b"")
    script = (
        'mount --bind "$1" /dev/cpu_dma_latency && '
        "mount -o remount,bind,ro /dev/cpu_dma_latency && "
        'exec "$0" -m orchestra_sup bench isolation --probes 2 --hold-cpu-latency --json'
    )
    out = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, sys.executable, str(stand_in)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert out.stderr.strip().splitlines() == [
        "orchestra-sup: --hold-cpu-latency: cannot hold /dev/cpu_dma_latency: Read-only file system"
    ]

"""Prometheus metrics of real trees, scraped over HTTP from the URL `ctl status` gives."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, plan, task, wait_until
from tests.integration.test_reexec import release, rollover_supervisor

pytestmark = pytest.mark.integration

METRICS = ["--metrics-port", "0"]
PROCESSES = ("supervisor", "custodian", "coordinator", "shard-0", "shard-1")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(tree: Tree) -> Samples:
    """Every sample the tree's metrics URL serves: (name, sorted labels) -> value."""
    url = tree.status().metrics_url
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.status == 200
        text = answer.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def scrape_until(tree: Tree, pred: Callable[[Samples], bool], what: str) -> Samples:
    """The first scrape `pred` accepts, within 20 s."""

    def attempt() -> Samples | None:
        samples = scrape(tree)
        return samples if pred(samples) else None

    return wait_until(attempt, 20, what)  # type: ignore[return-value]


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def lanes_in(samples: Samples, state: str) -> float:
    """Lanes in `state` over every shard."""
    return sum(
        v
        for (name, labels), v in samples.items()
        if name == "orchestra_sup_lanes" and ("state", state) in labels
    )


def every_process_reports(samples: Samples) -> bool:
    """A loop-lag histogram with samples for every process, the coordinator's inbox depth and
    the write-behind queue depth of every process with a store."""
    lag = "orchestra_sup_loop_lag_seconds_count"
    return (
        all((value(samples, lag, process=p) or 0) > 0 for p in PROCESSES)
        and value(samples, "orchestra_sup_inbox_depth") is not None
        and all(
            value(samples, "orchestra_sup_persist_queue_rows", process=p) is not None
            for p in ("coordinator", "shard-0", "shard-1")
        )
    )


def test_metrics_follow_lanes_the_relay_and_a_killed_shard(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """Served at the URL `ctl status` gives: loop lag for every process, inbox and persistence
    depths; a gated lane counts as running; the plan's placements count in the relay histogram
    and its commits in the batch histograms; a shard killed with SIGKILL counts one restart,
    one exit by signal and one more generation."""
    tree = tree_factory(workspace=repo, extra_args=METRICS)
    assert tree.status().metrics_url.startswith("http://127.0.0.1:")
    first = scrape_until(
        tree, every_process_reports, "every process's loop lag, the inbox and the queue depths"
    )
    assert value(first, "orchestra_sup_relay_seconds_count") == 0  # nothing relayed yet
    assert lanes_in(first, "running") == 0

    gate = tmp_path / "gate"
    plan_id = tree.submit(
        plan("gated", task("wait", f"while [ ! -e {gate} ]; do sleep 0.02; done"))
    )
    running = scrape_until(tree, lambda s: lanes_in(s, "running") == 1, "the lane as running")
    assert (value(running, "orchestra_sup_relay_seconds_count") or 0) > 0  # its LaneStart
    gate.touch()
    assert tree.wait_plan(plan_id).ok
    done = scrape_until(tree, lambda s: lanes_in(s, "running") == 0, "no lane running")
    batches = "orchestra_sup_persist_batch_rows_count"
    assert (value(done, batches, process="coordinator") or 0) > 0  # the plan's record

    shard = tree.child("shard-0")
    assert shard.pid is not None
    restarts = value(done, "orchestra_sup_child_restarts_total", child="shard-0")
    by_signal = value(done, "orchestra_sup_child_exits_total", child="shard-0", cause="signal")
    assert restarts == 0 and by_signal == 0
    assert value(done, "orchestra_sup_child_generation", child="shard-0") == shard.generation
    os.kill(shard.pid, signal.SIGKILL)
    tree.wait_running("shard-0", shard.generation + 1)

    def counted(s: Samples) -> bool:
        return value(s, "orchestra_sup_child_up", child="shard-0") == 1 and (
            value(s, "orchestra_sup_child_generation", child="shard-0") == shard.generation + 1
        )

    after = scrape_until(tree, counted, "shard-0's new generation in the metrics")
    assert value(after, "orchestra_sup_child_restarts_total", child="shard-0") == 1
    assert value(after, "orchestra_sup_child_exits_total", child="shard-0", cause="signal") == 1
    for cause in ("clean", "exit_code", "watchdog", "stopped", "unknown"):
        assert value(after, "orchestra_sup_child_exits_total", child="shard-0", cause=cause) == 0
    assert value(after, "orchestra_sup_child_restarts_total", child="shard-1") == 0


def test_a_watchdog_kill_counts_as_a_watchdog_exit(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """Served from the config's `[supervisor] metrics_port = 0`: a shard whose loop is blocked
    is killed by the watchdog, and its exit counts under `watchdog`, not `signal`; `ctl status`
    shows the relay figures as None for the coordinator before it relayed anything."""
    cfg = tmp_path / "tree.toml"
    cfg.write_text("[supervisor]\nwatchdog_s = 1.0\nmetrics_port = 0\n")
    tree = tree_factory(workspace=repo, config=cfg, extra_env={"ORCHESTRA_SUP_DEBUG_HOOKS": "1"})
    assert tree.status().metrics_url.startswith("http://127.0.0.1:")
    assert tree.child("coordinator").relay_ms is None
    assert tree.ctl(f.CtlDebug(name="shard-1", action="block_loop", seconds=60)) == f.Ack()
    tree.wait_running("shard-1", 2, timeout_s=20)
    s = scrape(tree)
    assert value(s, "orchestra_sup_child_exits_total", child="shard-1", cause="watchdog") == 1
    assert value(s, "orchestra_sup_child_exits_total", child="shard-1", cause="signal") == 0
    assert value(s, "orchestra_sup_child_restarts_total", child="shard-1") == 1


def test_metrics_are_served_again_after_a_reexec(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """The re-executed supervisor serves the metrics again (port 0: a new port, which `ctl
    status` gives), with the restarts it carried over from the old image."""
    tree = tree_factory(workspace=repo, extra_args=METRICS)
    shard = tree.child("shard-1")
    assert shard.pid is not None
    os.kill(shard.pid, signal.SIGKILL)
    tree.wait_running("shard-1", shard.generation + 1)
    done = rollover_supervisor(tree, release(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    tree.await_notify(b"READY=1")
    assert tree.status().version == "9.0.0"
    after = scrape_until(
        tree,
        lambda s: (
            value(s, "orchestra_sup_loop_lag_seconds_count", process="supervisor") is not None
        ),
        "the new image's metrics",
    )
    assert value(after, "orchestra_sup_child_restarts_total", child="shard-1") == 1
    assert value(after, "orchestra_sup_child_up", child="shard-1") == 1


def start(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """`orchestra-sup start` on fresh directories under `tmp_path`, as a user runs it."""
    argv = [sys.executable, "-m", "orchestra_sup", "start"]
    argv += ["--run-dir", str(tmp_path / "run"), "--state-dir", str(tmp_path / "state")]
    return subprocess.run([*argv, *options], capture_output=True, text=True, timeout=60)


def test_a_taken_port_is_refused_before_any_child_starts(tmp_path: Path) -> None:
    """`start --metrics-port` on a port in use: one line naming it, exit status 2, and no
    child was ever started."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = start(tmp_path, "--metrics-port", str(port))
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("orchestra-sup:")]
    assert errors == [
        f"orchestra-sup: metrics 127.0.0.1:{port}: cannot listen: Address already in use"
    ]
    assert "Traceback" not in run.stderr
    assert "-> starting" not in run.stderr  # no child's lifecycle began


def test_a_host_without_a_port_is_refused(tmp_path: Path) -> None:
    """`--metrics-host` alone serves nothing: refused in one line, exit status 2."""
    run = start(tmp_path, "--metrics-host", "127.0.0.1")
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip() == (
        "orchestra-sup: --metrics-host needs --metrics-port (or [supervisor] metrics_port)"
    )


def threads(pid: int) -> int:
    """How many threads process `pid` has (/proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Threads:")).split()[1])


def test_idle_connections_cannot_pile_up_threads(
    tree_factory: Callable[..., Tree], repo: Path
) -> None:
    """Fifty connections that never send a request (a slowloris) hold at most
    `CONNECTIONS_MAX` serving threads in the supervisor; one past them is closed at once; once
    they go, scrapes are served again."""
    from orchestra_sup.supervisor.metrics import CONNECTIONS_MAX

    tree = tree_factory(workspace=repo, extra_args=METRICS)
    scrape(tree)
    before = threads(tree.proc.pid)
    url = tree.status().metrics_url.removeprefix("http://").removesuffix("/metrics")
    host, port = url.rsplit(":", 1)
    idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(50)]
    closed: set[socket.socket] = set()

    def turned_away() -> bool:
        """Those past the limit are closed by the server without a word (EOF)."""
        readable, _, _ = select.select([c for c in idle if c not in closed], [], [], 0.1)
        closed.update(c for c in readable if c.recv(1) == b"")
        return len(closed) >= 50 - CONNECTIONS_MAX

    try:
        wait_until(turned_away, 20, "the connections past the limit closed")
        assert threads(tree.proc.pid) <= before + CONNECTIONS_MAX
    finally:
        for conn in idle:
            conn.close()
    after = scrape_until(tree, lambda s: True, "a scrape once they are gone")
    assert value(after, "orchestra_sup_child_up", child="shard-0") == 1

"""`bench isolation`'s probe client takes the coordinator's niceness before it probes.

Each case runs in a child interpreter, since a process cannot always take back a niceness it
gave up; the "coordinator" is a `sleep` started at another niceness, named in a fake
`ctl status` reply."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os, sys
from orchestra_sup.bench.isolation import _probe_at_coordinator_nice
from orchestra_sup.protocol import frames as f

coordinator, supervisor = int(sys.argv[1]), int(sys.argv[2])

class Client:
    def request(self, frame, timeout_s):
        child = f.ChildInfo(
            name="coordinator", role="coordinator", pid=coordinator or None, generation=1,
            state="running", restarts=0, operator_restarts=0, uptime_s=1.0,
        )
        return f.StatusReply(
            supervisor_pid=supervisor, version="x", run_dir="r", state_dir="s", workspace="w",
            children=[child],
        )

print(json.dumps(_probe_at_coordinator_nice(Client())))
"""


def _probe(coordinator_nice: int, *, colocated: bool = False) -> dict[str, int]:
    sleeper = subprocess.Popen(["sleep", "30"], preexec_fn=lambda: os.nice(coordinator_nice))
    try:
        pids = ["0", str(sleeper.pid)] if colocated else [str(sleeper.pid), str(os.getpid())]
        done = subprocess.run(
            [sys.executable, "-c", PROBE, *pids], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        result: dict[str, int] = json.loads(done.stdout)
        return result
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_probe_takes_a_higher_coordinator_niceness() -> None:
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    if mine > 16:
        pytest.skip("this process already runs near the lowest priority")
    assert _probe(3) == {"probe": mine + 3, "coordinator": mine + 3}


def test_a_coordinator_without_a_pid_is_the_supervisor_process() -> None:
    """A status naming no pid for the coordinator: the supervisor's niceness counts (colocated,
    the status names the supervisor's own pid; this is the same process)."""
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    if mine > 16:
        pytest.skip("this process already runs near the lowest priority")
    assert _probe(2, colocated=True) == {"probe": mine + 2, "coordinator": mine + 2}

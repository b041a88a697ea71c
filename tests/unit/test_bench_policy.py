"""The benchmarks' CPU policy (`bench.policy`): the probe client takes the coordinator's rank on
every thread and gives it back; a `--cpu-config` file is read in one line or refused in one.

Each probe case runs in a child interpreter, since a process cannot always take back a rank it
gave up; the "coordinator" is a `sleep` started at another rank, named in a fake `ctl status`
reply."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestra_sup.bench.policy import policy_config, responsive, write_config
from orchestra_sup.errors import ConfigError
from orchestra_sup.system.cpupolicy import realtime_refusal

PROBE = """
import json, os, sys, threading
from orchestra_sup.bench.policy import probe_like
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

hold = threading.Event()
helper = threading.Thread(target=hold.wait)  # a second thread, as the ctl client's I/O one
helper.start()
before, rank = probe_like(Client())
tids = [int(t) for t in os.listdir("/proc/self/task")]
taken = sorted({(os.sched_getscheduler(t), os.getpriority(os.PRIO_PROCESS, t)) for t in tids})
before.take()
back = sorted({os.sched_getscheduler(t) for t in tids})
hold.set()
print(json.dumps({"rank": rank, "taken": taken, "back": back}))
"""


def _probe(preexec: str, *, colocated: bool = False) -> dict[str, object]:
    sleeper = subprocess.Popen(
        [sys.executable, "-c", f"import os, time\n{preexec}\ntime.sleep(30)"]
    )
    try:
        pids = ["0", str(sleeper.pid)] if colocated else [str(sleeper.pid), str(os.getpid())]
        done = subprocess.run(
            [sys.executable, "-c", PROBE, *pids], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        result: dict[str, object] = json.loads(done.stdout)
        return result
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_probe_takes_a_higher_coordinator_niceness_on_every_thread() -> None:
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    if mine > 16:
        pytest.skip("this process already runs near the lowest priority")
    got = _probe("os.nice(3)")
    assert got["taken"] == [[os.SCHED_OTHER, mine + 3]]
    rank = got["rank"]
    assert isinstance(rank, dict) and rank["probe"] == rank["coordinator"]


@pytest.mark.skipif(realtime_refusal(3) is not None, reason="SCHED_FIFO is refused here")
def test_the_probe_takes_a_real_time_coordinator_s_class_and_gives_it_back() -> None:
    got = _probe("os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(3))")
    rank = got["rank"]
    assert isinstance(rank, dict) and rank["probe"] == rank["coordinator"]
    assert str(rank["probe"]).startswith("fifo 3, cpus ")
    assert [policy for policy, _nice in got["taken"]] == [  # type: ignore[union-attr]
        os.SCHED_FIFO,  # the helper thread: libzmq's would abort on the flag as it starts
        os.SCHED_FIFO | os.SCHED_RESET_ON_FORK,  # the main one: nothing it starts inherits it
    ]
    assert got["back"] == [os.SCHED_OTHER]


def test_a_coordinator_without_a_pid_is_the_supervisor_process() -> None:
    """A status naming no pid for the coordinator: the supervisor's rank counts (colocated,
    the status names the supervisor's own pid)."""
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    if mine > 16:
        pytest.skip("this process already runs near the lowest priority")
    assert _probe("os.nice(2)", colocated=True)["taken"] == [[os.SCHED_OTHER, mine + 2]]


def test_a_cpu_config_file_gives_its_cpu_table(tmp_path: Path) -> None:
    assert policy_config(None) == responsive()
    path = write_config(tmp_path / "c.toml", {"realtime": "on", "rt_priority": 9})
    assert policy_config(path) == {"realtime": "on", "rt_priority": 9}


@pytest.mark.parametrize("text", ["[cpu", "[lanes]\nnice = 3\n"])
def test_a_cpu_config_without_a_cpu_table_is_refused_in_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        policy_config(path)
    assert str(caught.value).startswith(f"--cpu-config {path}: ")
    assert "\n" not in str(caught.value)

"""The CPU policy by role (`[cpu]`, `system.cpupolicy`) on real trees: what each process runs at,
and a real-time runaway stopped while the rest of the machine runs on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.coordinator.seat import MAX_WEDGES
from orchestra_sup.protocol import frames as f
from orchestra_sup.system.cgroups import TOP, tree_id
from orchestra_sup.system.cpupolicy import format_cpus, machine_cpus, realtime_refusal
from orchestra_sup.system.v1cgroups import v1_controller
from tests.integration.harness import Tree, plan, settled, task, wait_until

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = "tests.integration.coordinator_programs"
CPUS = sorted(os.sched_getaffinity(0))
RESERVED, OTHER = CPUS[0], CPUS[-1]

pytestmark = [
    pytest.mark.skipif(realtime_refusal(5) is not None, reason="SCHED_FIFO is refused here"),
    pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs: one reserved, one for the rest"),
]


def policy_tree(
    factory: Callable[..., Tree],
    tmp_path: Path,
    watchdog_s: float = 10.0,
    extra_env: dict[str, str] | None = None,
    **extra: str,
) -> Tree:
    cfg = tmp_path / "cpu.toml"
    lines = [
        "[cpu]",
        'realtime = "on"',
        f'reserved_cpus = "{RESERVED}"',
        'lanes = "idle"',
        *(f"{k} = {v}" for k, v in extra.items()),
        "[coordinator]",
        f'programs = ["{PROGRAMS}:Spins", "{PROGRAMS}:Hogs"]',
        "[supervisor]",
        f"watchdog_s = {watchdog_s}",
    ]
    cfg.write_text("\n".join(lines) + "\n")
    env = {"PYTHONPATH": str(REPO), **(extra_env or {})}
    return factory(config=cfg, shards=1, lanes=2, extra_env=env)


def test_each_role_runs_in_its_class_and_lanes_below_the_hosts(
    tree_factory: Callable[..., Tree], tmp_path: Path
) -> None:
    tree = policy_tree(tree_factory, tmp_path)
    status = tree.status()
    assert status.cpu == f"fifo 5, cpus {RESERVED}"
    machine = format_cpus(machine_cpus())
    assert {c.name: c.cpu for c in status.children} == {
        "custodian": f"other nice 0, threads fifo 4, cpus {RESERVED}",  # its front, its I/O
        "coordinator": f"fifo 4, cpus {RESERVED}",
        "shard-0": f"other nice 0, cpus {machine}",
    }
    # Every thread of the coordinator in real time, none left in SCHED_OTHER among the lanes:
    # its loop and libzmq's at 4, its write-behind (whose synced commits a reaction waits for)
    # one below, so the loop preempts it on the shared CPU.
    pid = tree.child("coordinator").pid
    assert pid is not None
    classes = sorted(
        (os.sched_getscheduler(int(tid)) & ~os.SCHED_RESET_ON_FORK, os.sched_getparam(int(tid)))
        for tid in os.listdir(f"/proc/{pid}/task")
    )
    assert {c for c, _ in classes} == {os.SCHED_FIFO}, classes
    # ... and the event log's write-behind two below: its commits are on no reaction's path
    priorities = [p.sched_priority for _, p in classes]
    assert priorities.count(2) == 1, priorities
    assert priorities.count(3) == 1 and priorities.count(4) >= 3, priorities
    probe = (
        '"$ORCHESTRA_PYTHON" -c "import os; print(os.sched_getscheduler(0), '
        'os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0)))"; '
        "grep -E '^[0-9]+:cpu(,|:)' /proc/self/cgroup"
    )
    report = tree.wait_plan(tree.submit(plan("probe", task("p", probe))))
    out = report.tasks[0].output_tail.splitlines()
    assert report.ok, report
    if status.lane_cpu.startswith("cpu.idle") or status.lane_cpu.startswith("cpu.shares"):
        assert out[0] == f"0 10 {sorted(machine_cpus())}"  # SCHED_OTHER, nice 10, every CPU
        assert "/orchestra-sup/" in out[1]  # in the idle group
    else:
        assert out[0].startswith(f"{os.SCHED_IDLE} 10 ")


def test_a_spinning_real_time_coordinator_is_stopped_and_restarted_while_the_machine_runs_on(
    tree_factory: Callable[..., Tree], tmp_path: Path
) -> None:
    """The coordinator, in SCHED_FIFO on the reserved CPU, spins without blocking: RLIMIT_RTTIME
    (0.2 s here) ends it with SIGXCPU and the supervisor starts it again, while a process of the
    machine's on the other CPU kept counting throughout."""
    tree = policy_tree(tree_factory, tmp_path, rttime_s="0.2")
    counter_file = tmp_path / "count"
    counter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time\n"
            f"os.sched_setaffinity(0, {{{OTHER}}})\n"
            "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)\n"
            "n = 0\n"
            "while True:\n"
            "    n += 1\n"
            "    os.pwrite(fd, b'%20d' % n, 0)\n"
            "    time.sleep(0.001)\n",
            str(counter_file),
        ]
    )
    try:
        wait_until(lambda: counter_file.exists() and counter_file.read_bytes().strip(), 10, "count")
        marker = tmp_path / "spinning"
        spin = f.PlanSpec(
            name="spin", tasks=[], coordinator=f"{PROGRAMS}:Spins", args={"marker": str(marker)}
        )
        tree.submit(spin)
        wait_until(marker.exists, 20, "the program to start spinning")
        spinning = int(marker.read_text())
        counted_at_spin = int(counter_file.read_bytes())

        def restarted() -> f.ChildInfo | None:
            child = tree.child("coordinator")
            if child.pid not in (None, spinning) and child.state == "running":
                return child
            return None

        child = wait_until(restarted, 30, "the coordinator to be restarted")
        assert isinstance(child, f.ChildInfo)
        assert child.restarts >= 1
        # RLIMIT_RTTIME's soft limit (the watchdog would have sent SIGKILL, seconds later)
        assert child.last_exit == f.ExitInfo(signal=signal.SIGXCPU), child.last_exit
        assert int(counter_file.read_bytes()) > counted_at_spin  # the machine ran on
        assert child.cpu == f"fifo 4, cpus {RESERVED}"  # back in its class
        assert tree.status().rt_demoted == 0  # RLIMIT_RTTIME was enough: the guard stayed out
    finally:
        counter.kill()
        counter.wait()


def test_a_hog_that_dodges_rlimit_rttime_is_put_back_in_sched_other_by_the_guard(
    tree_factory: Callable[..., Tree], tmp_path: Path
) -> None:
    """The coordinator holds its CPU but blocks for an instant every 50 ms, so RLIMIT_RTTIME
    never fires: the supervisor's real-time guard demotes it (long before the watchdog, set
    to 60 s here), and says so in `ctl status`."""
    tree = policy_tree(tree_factory, tmp_path, watchdog_s=60.0)
    marker = tmp_path / "hogging"
    hog = f.PlanSpec(
        name="hog", tasks=[], coordinator=f"{PROGRAMS}:Hogs", args={"marker": str(marker)}
    )
    tree.submit(hog)
    wait_until(marker.exists, 20, "the program to start")
    hogging = int(marker.read_text())
    wait_until(lambda: os.sched_getscheduler(hogging) == os.SCHED_OTHER, 20, "the demotion")
    status = tree.status()
    assert status.rt_demoted == 1
    assert status.cpu == f"fifo 5, cpus {RESERVED}"  # the supervisor kept its class
    coordinator = next(c for c in status.children if c.name == "coordinator")
    assert coordinator.pid == hogging and coordinator.cpu == f"other nice 0, cpus {RESERVED}"


def test_a_supervisor_in_real_time_re_executes_itself_and_takes_its_class_again(
    tree_factory: Callable[..., Tree], tmp_path: Path
) -> None:
    """`ctl rollover supervisor` under a short RLIMIT_RTTIME (200 ms): the new image imports
    itself as a fresh start does, in SCHED_OTHER (a class and an rlimit survive execve, and an
    interpreter's start-up runs 0.5-1 s without blocking: SIGXCPU took the tree down), then
    takes its class again; every child stays the same process. (At 50 ms the supervisor was
    demoted on this machine by some other stretch of the rollover, the same with the commits
    before the test last passed: a bound for the import, not for every step.)"""
    tree = policy_tree(tree_factory, tmp_path, rttime_s="0.2")
    before = tree.status()
    argv = [sys.executable, "-m", "orchestra_sup", "ctl", "rollover", "supervisor"]
    argv += ["--run-dir", str(tree.run_dir), "--timeout", "20"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stdout + done.stderr
    after = tree.status()
    assert after.supervisor_pid == before.supervisor_pid
    assert after.cpu == f"fifo 5, cpus {RESERVED}"
    assert {c.name: c.pid for c in after.children} == {c.name: c.pid for c in before.children}


def test_a_killed_shards_lane_cgroups_are_removed_from_the_v1_hierarchies(
    tree_factory: Callable[..., Tree], tmp_path: Path
) -> None:
    """SIGKILL to a shard whose lane runs: once the supervisor has killed what the lane left,
    the dead generation's directories in the v1 cpu (the idle group), memory and pids
    hierarchies are gone too, not left behind for good (a next generation makes its own)."""
    tree = policy_tree(tree_factory, tmp_path)
    if tree.status().lane_cpu.split(",")[0] not in ("cpu.idle", "cpu.shares"):
        pytest.skip("no v1 cpu controller for the lanes' group here")
    tree.submit(plan("long", task("long", "sleep 60")))

    def running() -> bool:
        reply = tree.ctl(f.CtlLanes())
        assert isinstance(reply, f.LaneList)
        return any(lane.state == "running" for lane in reply.lanes)

    wait_until(running, 20, "the lane to run")
    dirs = [
        own / TOP / tree_id(tree.run_dir) / "shard-0.1"
        for own in map(v1_controller, ("cpu", "memory", "pids"))
        if own is not None
    ]
    assert all(d.is_dir() for d in dirs), dirs
    shard = tree.child("shard-0")
    assert shard.pid is not None
    os.kill(shard.pid, signal.SIGKILL)
    wait_until(lambda: tree.child("shard-0").generation == 2, 20, "the next generation")
    wait_until(lambda: not any(d.exists() for d in dirs), 20, "the dead generation's cgroups")


def test_a_program_that_rlimit_rttime_stops_every_run_fails_its_plan_and_the_tree_serves_on(
    tree_factory: Callable[..., Tree], tmp_path: Path
) -> None:
    """SIGXCPU from RLIMIT_RTTIME is the coordinator's own death, as the watchdog's kill of a
    blocked loop is: the spinning program is blamed and its plan fails after `MAX_WEDGES` runs,
    instead of running again on every restart until the restart intensity stopped the tree."""
    tree = policy_tree(tree_factory, tmp_path, rttime_s="0.2")
    spin = f.PlanSpec(
        name="spin",
        tasks=[],
        coordinator=f"{PROGRAMS}:Spins",
        args={"marker": str(tmp_path / "spinning")},
    )
    report = settled(tree, tree.submit(spin), timeout_s=20)
    assert not report.ok
    assert report.error is not None and f"steps {MAX_WEDGES} times" in report.error, report
    coordinator = tree.child("coordinator")
    assert coordinator.state == "running" and coordinator.restarts == MAX_WEDGES
    assert coordinator.last_exit == f.ExitInfo(signal=signal.SIGXCPU)


def test_a_supervisor_that_spins_in_real_time_leaves_it_and_keeps_its_tree(
    tree_factory: Callable[..., Tree], tmp_path: Path
) -> None:
    """The supervisor's own loop held on the CPU past `rttime_s` (a debug hook): its SIGXCPU is
    handled, not fatal (the default action would end the whole tree): the supervisor goes on
    in SCHED_OTHER, says so, and its children keep their class."""
    tree = policy_tree(
        tree_factory, tmp_path, rttime_s="0.2", extra_env={"ORCHESTRA_SUP_DEBUG_HOOKS": "1"}
    )
    before = tree.pids()
    spin = f.CtlDebug(name="supervisor", action="spin_loop", seconds=1.0)
    assert tree.ctl(spin, timeout_s=30.0) == f.Ack()
    status = tree.status()
    assert status.supervisor_pid == tree.proc.pid and tree.proc.poll() is None
    # its guard stays above the tree, in real time
    assert status.cpu == f"other nice 0, threads fifo 6, cpus {RESERVED}"
    assert status.rt_demoted == 1
    assert tree.pids() == before  # no child was restarted
    assert tree.child("coordinator").cpu == f"fifo 4, cpus {RESERVED}"
    assert "without blocking (RLIMIT_RTTIME)" in tree.log()

"""`orchestra-sup bench restart`: how long a SIGKILLed shard is gone, next to a fresh interpreter.

In one run, for each spawn mode (`[supervisor] spawn = "fork"`, then `"exec"`), a private tree
(`oneshot.private_tree`, 2 shards) has `shard-0` SIGKILLed `kills` times. One restart is timed
from just before the bench's `pidfd_send_signal(SIGKILL)` to the moment the supervisor recorded
the replacement as running, which is when it welcomed the replacement's `Hello`. So the figure
covers everything the supervisor does on the way: noticing the exit (its pidfd turns readable on
the loop), reaping it, its cleanup after a shard (pending requests failed, the shard's lane
cgroups killed off the loop, orphans killed), the restart decision and its backoff (none: the
tree runs with `max_seconds` short enough that the backoff has reset before every kill, so each
restart is a first one, which is immediate), the spawn (a fork from the template, or an exec),
and the child's start up to its `Hello`/`Welcome` (its ZeroMQ context and sockets, its LMDB
state).

The bench reads that moment from the supervisor's own record: `ctl status` gives the child's
`uptime_s` (milliseconds resolution), and CLOCK_MONOTONIC is one clock for every process, so
welcomed = (request sent + reply received) / 2 - uptime. `ctl status` is asked every `POLL_S`
until the replacement is running; the poll interval does not enter the figure.

After every restart, one baseline sample: a fresh `python -c` that imports the same stack the
template preloads (`node.template.PRELOADED`: pyzmq, msgspec, lmdb, psutil, the node runtime and
every role), creates a ZeroMQ context, connects a DEALER to a ROUTER in this process and sends
`READY`; timed from just before `Popen` to that message's arrival. That is what one child costs
before it has even opened its role, whatever spawns it.

Every replacement is also checked for how it was started (a forked child runs the template's
image: `_forked`), so a fork tree that fell back to exec shows it in `spawned`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import zmq

from orchestra_sup.bench.stats import nearest_rank
from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.client.oneshot import private_tree
from orchestra_sup.errors import SupervisionError
from orchestra_sup.node.template import PRELOADED
from orchestra_sup.protocol import frames as f

SHARD = "shard-0"
RESET_S = 0.25
"""The trees' `[supervisor] max_seconds`: a child that ran this long restarts without backoff."""
POLL_S = 0.01
"""Seconds between two `ctl status` while waiting for a replacement."""
RESTART_TIMEOUT_S = 30.0
"""Seconds a replacement has to be running before the bench gives up."""
TARGET_P50_MS = 25.0
"""Issue 6's target for the restart p50 with the template."""

READY_SCRIPT = """
import sys
for module in sys.argv[2:]:
    __import__(module)
import zmq
ctx = zmq.Context()
sock = ctx.socket(zmq.DEALER)
sock.linger = 1000
sock.connect(sys.argv[1])
sock.send(b"READY")
sock.close()
ctx.term()
"""


def run_restart_bench(kills: int = 20) -> dict[str, Any]:
    """Run the benchmark; see the module docstring. `kills` SIGKILLs per spawn mode. Returns
    the JSON shape bench/README.md documents. Raises `SupervisionError` when a tree does not
    start, a shard is not running, or a replacement is not running within
    `RESTART_TIMEOUT_S`."""
    with tempfile.TemporaryDirectory(prefix="osup-bench-restart-") as tmp:
        work = Path(tmp)
        ctx = zmq.Context()
        router = ctx.socket(zmq.ROUTER)
        router.linger = 0
        endpoint = f"ipc://{work / 'ready.ipc'}"
        router.bind(endpoint)
        baseline: list[float] = []
        try:
            figures = {}
            for mode in ("fork", "exec"):
                figures[mode] = _kill_loop(mode, kills, work, lambda: _fresh(router, endpoint))
                baseline.extend(figures[mode].pop("baseline_ms"))
        finally:
            router.close()
            ctx.term()
    restart, restart_exec = figures["fork"], figures["exec"]
    base = {
        "interpreter_p50_ms": round(nearest_rank(baseline, 0.5), 1),
        "interpreter_p90_ms": round(nearest_rank(baseline, 0.9), 1),
        "n": len(baseline),
    }
    return {
        "restart": restart,
        "restart_exec": restart_exec,
        "baseline": base,
        "ratio_p50": round(restart["p50_ms"] / base["interpreter_p50_ms"], 3),
        "ratio_exec_p50": round(restart_exec["p50_ms"] / base["interpreter_p50_ms"], 3),
        "target": {"p50_ms": TARGET_P50_MS, "met": restart["p50_ms"] <= TARGET_P50_MS},
        "method": {
            "kills": kills,
            "shard": SHARD,
            "shards": 2,
            "from": "just before pidfd_send_signal(SIGKILL) in the bench",
            "to": "the supervisor's record of the replacement running (its Welcome), read as "
            "ctl status uptime_s against CLOCK_MONOTONIC",
            "resolution_ms": 1.0,
            "restart_path": "pidfd readable, reap, shard cleanup (fail pending requests, lane "
            "cgroups, orphans), restart decision, backoff 0 (max_seconds "
            f"{RESET_S} s, so every restart is a first one), spawn, child start, Hello/Welcome",
            "baseline": "python -c importing " + ", ".join(PRELOADED) + ", then a ZeroMQ "
            "DEALER sends READY to this process; Popen to arrival; one after every restart",
            "percentiles": "nearest rank",
        },
    }


def _kill_loop(
    mode: str, kills: int, work: Path, sample_baseline: Callable[[], float]
) -> dict[str, Any]:
    """`kills` timed restarts on a tree with `[supervisor] spawn = mode`, one baseline sample
    after each; their figures, the raw baseline samples under `baseline_ms`."""
    config = work / f"{mode}.toml"
    config.write_text(
        f'[supervisor]\nspawn = "{mode}"\nmax_restarts = 10000\nmax_seconds = {RESET_S}\n'
    )
    samples: list[float] = []
    baseline: list[float] = []
    spawned = {"fork": 0, "exec": 0}
    with private_tree(
        workspace=None, state_dir=work / f"state-{mode}", shards=2, lanes_per_shard=2, config=config
    ) as client:
        for _ in range(kills):
            samples.append(_one_restart(client, spawned))
            baseline.append(sample_baseline())
    return {
        "p50_ms": round(nearest_rank(samples, 0.5), 1),
        "p90_ms": round(nearest_rank(samples, 0.9), 1),
        "min_ms": round(min(samples), 1),
        "max_ms": round(max(samples), 1),
        "n": len(samples),
        "spawned": spawned,
        "baseline_ms": baseline,
    }


def _one_restart(client: CtlClient, spawned: dict[str, int]) -> float:
    """SIGKILL `SHARD` once it has run `RESET_S`; milliseconds until its replacement's
    Welcome. Counts how the replacement was started in `spawned`."""
    status, shard = _shard(client)
    if shard.state != "running" or shard.pid is None:
        raise SupervisionError(f"{SHARD} is {shard.state}, not running")
    if shard.uptime_s < RESET_S:
        time.sleep(RESET_S - shard.uptime_s + 0.01)  # its backoff resets after RESET_S of uptime
    pidfd = os.pidfd_open(shard.pid)
    try:
        if psutil.Process(shard.pid).ppid() != status.supervisor_pid:
            raise SupervisionError(f"pid {shard.pid} is no longer {SHARD}")
        killed_at = time.monotonic()
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        os.close(pidfd)
    deadline = killed_at + RESTART_TIMEOUT_S
    while True:
        sent = time.monotonic()
        _, new = _shard(client)
        received = time.monotonic()
        if new.generation > shard.generation and new.state == "running" and new.pid:
            break
        if received > deadline:
            raise SupervisionError(f"{SHARD} not running again within {RESTART_TIMEOUT_S:g} s")
        time.sleep(POLL_S)
    welcomed_at = (sent + received) / 2 - new.uptime_s
    spawned["fork" if _forked(new.pid, status.supervisor_pid) else "exec"] += 1
    return (welcomed_at - killed_at) * 1000


def _forked(pid: int, supervisor_pid: int) -> bool:
    """`pid` runs the image of the supervisor's fork template (its own command line, which a
    child replaces with its title, does not tell): its stack starts where the template's does,
    a place an exec picks at random and a fork keeps."""
    try:
        templates = [
            child.pid
            for child in psutil.Process(supervisor_pid).children()
            if "orchestra_sup.node.template" in " ".join(child.cmdline())
        ]
        return any(_stack_start(tpl) == _stack_start(pid) for tpl in templates)
    except (psutil.NoSuchProcess, FileNotFoundError):
        return False


def _stack_start(pid: int) -> int:
    """/proc/PID/stat field 28, `startstack`."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[25])


def _shard(client: CtlClient) -> tuple[f.StatusReply, f.ChildInfo]:
    status = client.request(f.CtlStatus(), timeout_s=10.0)
    assert isinstance(status, f.StatusReply)
    return status, next(c for c in status.children if c.name == SHARD)


def _fresh(router: zmq.Socket[bytes], endpoint: str) -> float:
    """Milliseconds from `Popen` of a fresh interpreter to its READY on `router`."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", READY_SCRIPT, endpoint, *PRELOADED], stdin=subprocess.DEVNULL
    )
    try:
        if not router.poll(int(RESTART_TIMEOUT_S * 1000)):
            raise SupervisionError(f"a fresh interpreter sent no READY in {RESTART_TIMEOUT_S:g} s")
        router.recv_multipart()
        return (time.monotonic() - started) * 1000
    finally:
        proc.wait(timeout=RESTART_TIMEOUT_S)

"""`orchestra-sup bench isolation`: does a busy shard slow the coordinator down?

The claim the project exists for (seeds/000): a coordinator that shares a process and an event
loop with its workers slows down with them. One run measures it twice on the same work:

- `separated`: the tree as it runs in production, one OS process per role.
- `colocated`: the same roles and code paths as components of one process and one event loop,
  connected over ZeroMQ `inproc://` (`orchestra-sup start --colocated`): the "before" picture.

For each, in a fresh private tree with `SHARDS` shards of `LANES_PER_SHARD` lanes:

1. Idle: a one-task plan is run to completion, then `probes` coordinator turns are timed, one
   every `PROBE_EVERY_S`. A turn is `ctl plan <id>` answered by the coordinator: the request goes
   to the supervisor's `ctl.ipc`, is forwarded to the coordinator, which looks the plan up on its
   loop and answers; timed in this process with `perf_counter_ns`, in ms. This process, the
   probe client, first takes the coordinator's niceness (`_probe_at_coordinator_nice`).
2. Loaded: a plan of `SHARDS * LANES_PER_SHARD` lanes, each a Python program that burns CPU and
   streams its output as fast as its shard drains it (`BURNER`), until all are running; then the
   same probes again. The lanes are cancelled afterwards.
3. Event-loop lag of every process: from `ctl status` (each child's p99 over its sliding window of
   the last minute) after each phase.

Figures: `idle_turn_p50_ms`, `idle_turn_p99_ms`, `loaded_turn_p50_ms`, `loaded_turn_p99_ms`
(each p99 with its `_p999_ms` and `_max_ms` beside it), `ratio` (loaded p99 / idle p99: how much
the load slowed the coordinator down), `host_loop_p99_ms` (the worst shard loop-lag p99 under
load), `coordinator_loop_p99_ms` (the coordinator's, under load). Target (issue 6): separated
ratio <= 1.2 while colocated degrades by an order of magnitude.
Loop-lag figures are None for a process that has not sent a sample yet (a phase shorter than a
heartbeat). `samples_ms` keeps every timed turn (idle and loaded) for plots (`bench all`).
`machine` records what the run ran on (`orchestra_sup.bench.machine`: CPUs, idle states, load,
steal), plus `probe_nice` and `coordinator_nice` for each mode.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestra_sup.bench import machine
from orchestra_sup.bench.stats import summary
from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.client.oneshot import private_tree, wait_plan
from orchestra_sup.protocol import frames as f

SHARDS = 2
LANES_PER_SHARD = 8
PROBE_EVERY_S = 0.01
MODES = ("separated", "colocated")
BURNER = (
    '"$ORCHESTRA_PYTHON" -c "'
    "import sys, time\n"
    "line = 'x' * 1023 + chr(10)\n"
    "while True:\n"
    "    t = time.perf_counter() + 0.002\n"
    "    while time.perf_counter() < t: pass\n"
    "    sys.stdout.write(line * 16); sys.stdout.flush()\n"
    '"'
)
"""Each loaded lane: 2 ms of CPU, then 16 KiB of output, forever (until cancelled)."""


def _turns(client: CtlClient, plan_id: str, probes: int) -> list[float]:
    samples: list[float] = []
    for _ in range(probes):
        t0 = time.perf_counter_ns()
        reply = client.request(f.CtlPlan(id=plan_id), timeout_s=30.0)
        samples.append((time.perf_counter_ns() - t0) / 1e6)
        assert isinstance(reply, f.PlanReport)
        time.sleep(PROBE_EVERY_S)  # pacing between probes, not a synchronisation
    return samples


def _lags(client: CtlClient) -> dict[str, float]:
    """Each process's loop-lag p99 in ms (the supervisor's as "supervisor")."""
    status = client.request(f.CtlStatus(), timeout_s=30.0)
    assert isinstance(status, f.StatusReply)
    lags = {c.name: c.loop_lag_ms[1] for c in status.children if c.loop_lag_ms is not None}
    lags["supervisor"] = status.loop_lag_ms[1]
    return lags


def _wait_running(client: CtlClient, plan_id: str, count: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        report = client.request(f.CtlPlan(id=plan_id), timeout_s=30.0)
        assert isinstance(report, f.PlanReport)
        if sum(t.status == "running" and t.lane is not None for t in report.tasks) >= count:
            return
        time.sleep(0.05)
    raise TimeoutError(f"the {count} loaded lanes were not all running within {timeout_s:g} s")


def _probe_at_coordinator_nice(client: CtlClient) -> dict[str, int]:
    """Give this process, the probe client, the coordinator's niceness (its process's as `ctl
    status` names it: the supervisor's own when colocated, and the supervisor's too when the
    status has no pid for it), so a turn's four wake-ups run at one priority; return
    {"probe": its niceness now, "coordinator": the coordinator's}. A niceness this process may
    not take (a lower one, unprivileged) is left as it is, and the two then differ."""
    status = client.request(f.CtlStatus(), timeout_s=30.0)
    assert isinstance(status, f.StatusReply)
    pid = next((c.pid for c in status.children if c.name == "coordinator"), None)
    coordinator = os.getpriority(os.PRIO_PROCESS, pid or status.supervisor_pid)
    if os.getpriority(os.PRIO_PROCESS, 0) != coordinator:
        with contextlib.suppress(PermissionError):
            os.setpriority(os.PRIO_PROCESS, 0, coordinator)
    return {"probe": os.getpriority(os.PRIO_PROCESS, 0), "coordinator": coordinator}


def measure(colocated: bool, probes: int, work: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """One mode's figures (see the module docstring), and the probe client's and the
    coordinator's niceness (`_probe_at_coordinator_nice`)."""
    mode = "colocated" if colocated else "separated"
    lanes = SHARDS * LANES_PER_SHARD
    with private_tree(
        workspace=None,
        state_dir=work / mode,
        shards=SHARDS,
        lanes_per_shard=LANES_PER_SHARD,
        config=None,
        colocated=colocated,
    ) as client:
        nice = _probe_at_coordinator_nice(client)
        accepted = client.request(
            f.CtlSubmit(plan=f.PlanSpec(name="probe", tasks=[f.TaskSpec(id="t", run="true")])),
            timeout_s=30.0,
        )
        assert isinstance(accepted, f.PlanAccepted)
        probe_plan = accepted.id
        wait_plan(client, probe_plan, timeout_s=60.0)
        idle = _turns(client, probe_plan, probes)
        idle_lags = _lags(client)

        load = f.PlanSpec(
            name="load",
            tasks=[f.TaskSpec(id=f"burn{i}", run=BURNER, timeout_s=600.0) for i in range(lanes)],
        )
        accepted = client.request(f.CtlSubmit(plan=load), timeout_s=30.0)
        assert isinstance(accepted, f.PlanAccepted)
        _wait_running(client, accepted.id, lanes)
        loaded = _turns(client, probe_plan, probes)
        loaded_lags = _lags(client)
        report = client.request(f.CtlPlan(id=accepted.id), timeout_s=30.0)
        assert isinstance(report, f.PlanReport)
        for task in report.tasks:
            if task.lane is not None:
                client.request(f.CtlCancel(lane=task.lane), timeout_s=30.0)

    idle_p = summary(idle, "ms")
    loaded_p = summary(loaded, "ms")
    shard_names = [n for n in loaded_lags if n.startswith("shard-")]
    return {
        "idle_turn_p50_ms": idle_p["p50_ms"],
        "idle_turn_p99_ms": idle_p["p99_ms"],
        "idle_turn_p999_ms": idle_p["p999_ms"],
        "idle_turn_max_ms": idle_p["max_ms"],
        "loaded_turn_p50_ms": loaded_p["p50_ms"],
        "loaded_turn_p99_ms": loaded_p["p99_ms"],
        "loaded_turn_p999_ms": loaded_p["p999_ms"],
        "loaded_turn_max_ms": loaded_p["max_ms"],
        "ratio": round(loaded_p["p99_ms"] / idle_p["p99_ms"], 2),
        "host_loop_p99_ms": max((loaded_lags[n] for n in shard_names), default=None),
        "idle_host_loop_p99_ms": max(
            (idle_lags[n] for n in shard_names if n in idle_lags), default=None
        ),
        "coordinator_loop_p99_ms": loaded_lags.get("coordinator", 0.0),
        "loop_p99_ms": {"idle": idle_lags, "loaded": loaded_lags},
        "samples_ms": {
            "idle": [round(x, 4) for x in idle],
            "loaded": [round(x, 4) for x in loaded],
        },
    }, nice


def run_isolation_bench(
    quick: bool = False, probes: int | None = None, hold_cpu_latency: bool = False
) -> dict[str, Any]:
    """Both modes in one run; see the module docstring for the figures and the JSON shape.
    `probes` per phase: default 1,000, or 200 when `quick`. With `hold_cpu_latency`,
    `/dev/cpu_dma_latency` is held at 0 for the whole run, both trees and the probes alike
    (`machine.cpu_latency_held`). Raises `ConfigError` before any tree starts when that hold
    cannot be taken."""
    probes = probes or (200 if quick else 1000)
    with (
        machine.cpu_latency_held(hold_cpu_latency),
        tempfile.TemporaryDirectory(prefix="osup-bench-") as tmp,
    ):
        start = machine.sample()
        measured = {mode: measure(mode == "colocated", probes, Path(tmp)) for mode in MODES}
        end = machine.sample()
    result: dict[str, Any] = {mode: figures for mode, (figures, _) in measured.items()}
    result["machine"] = {
        **machine.record(start, end, hold_cpu_latency=hold_cpu_latency),
        "probe_nice": {mode: nice["probe"] for mode, (_, nice) in measured.items()},
        "coordinator_nice": {mode: nice["coordinator"] for mode, (_, nice) in measured.items()},
    }
    result["method"] = {
        "probes_per_phase": probes,
        "probe_every_s": PROBE_EVERY_S,
        "shards": SHARDS,
        "lanes_per_shard": LANES_PER_SHARD,
        "loaded_lanes": SHARDS * LANES_PER_SHARD,
        "turn": "ctl plan <id> round trip from this process: ctl.ipc -> supervisor -> "
        "coordinator -> back, ms",
        "loop_lag": "each process's p99 over its last minute, from ctl status",
        "percentiles": "nearest rank",
    }
    return result


def format_table(result: dict[str, Any]) -> str:
    """The two modes side by side, for people."""
    rows = [
        ("coordinator turn p50 idle / loaded, ms", "idle_turn_p50_ms", "loaded_turn_p50_ms"),
        ("coordinator turn p99 idle / loaded, ms", "idle_turn_p99_ms", "loaded_turn_p99_ms"),
        ("coordinator turn p99.9 idle / loaded, ms", "idle_turn_p999_ms", "loaded_turn_p999_ms"),
        ("coordinator turn max idle / loaded, ms", "idle_turn_max_ms", "loaded_turn_max_ms"),
    ]
    lines = [f"{'':44}{'separated':>20}{'colocated':>20}"]
    for label, idle, loaded in rows:
        cells = [f"{result[m][idle]:.2f} / {result[m][loaded]:.2f}" for m in MODES]
        lines.append(f"{label:44}{cells[0]:>20}{cells[1]:>20}")
    for label, key in (
        ("slowdown under load (p99 ratio)", "ratio"),
        ("worst shard loop-lag p99 under load, ms", "host_loop_p99_ms"),
        ("coordinator loop-lag p99 under load, ms", "coordinator_loop_p99_ms"),
    ):
        cells = [str(result[m][key]) for m in MODES]  # a loop-lag figure may be None
        lines.append(f"{label:44}{cells[0]:>20}{cells[1]:>20}")
    method = result["method"]
    lines.append(
        f"{method['probes_per_phase']} probes per phase, {method['loaded_lanes']} loaded lanes"
    )
    lines.append(f"machine: {machine.one_line(result['machine'])}")
    return "\n".join(lines)

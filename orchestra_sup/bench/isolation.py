"""`orchestra-sup bench isolation`: does a busy shard slow the coordinator down?

The claim the project exists for (seeds/000): a coordinator that shares a process and an event
loop with its workers slows down with them. One run measures it twice on the same work:

- `separated`: the tree as it runs in production, one OS process per role, under the CPU policy
  (`[cpu]`: `bench.policy.policy_config`, by default real time where allowed and the control
  plane on one reserved CPU; `--cpu-config FILE` for another).
- `default`: the same, with `[cpu]` at its defaults (no real time, no reserved CPU, lanes at
  `[lanes] nice` only): the reference the policy's cost to the lanes is taken against.
- `colocated`: the same roles and code paths as components of one process and one event loop,
  connected over ZeroMQ `inproc://` (`orchestra-sup start --colocated`), `[cpu]` at its
  defaults: the "before" picture.

For each, in a fresh private tree with `SHARDS` shards of `LANES_PER_SHARD` lanes:

1. Idle: a one-task plan is run to completion, then `probes` coordinator turns are timed, one
   every `PROBE_EVERY_S`. A turn is `ctl plan <id>` answered by the coordinator: the request goes
   to the supervisor's `ctl.ipc`, is forwarded to the coordinator, which looks the plan up on its
   loop and answers; timed in this process with `perf_counter_ns`, in ms. This process, the
   probe client, first takes the coordinator's class, priority, niceness and affinity on every
   thread (`bench.policy.probe_like`), and gives them back after the mode.
2. Loaded: a plan of `SHARDS * LANES_PER_SHARD` lanes, each a Python program that burns CPU and
   streams its output as fast as its shard drains it (`BURNER`), until all are running; then the
   same probes again, while the lanes' CPU seconds per second are read
   (`bench.policy.LaneThroughput`: every process under the shards, over the loaded probes). The
   lanes are cancelled afterwards.
3. Event-loop lag of every process: from `ctl status` (each child's p99 over its sliding window of
   the last minute) after each phase.

Figures: `idle_turn_p50_ms`, `idle_turn_p99_ms`, `loaded_turn_p50_ms`, `loaded_turn_p99_ms`
(each p99 with its `_p999_ms` and `_max_ms` beside it), `ratio` (loaded p99 / idle p99: how much
the load slowed the coordinator down), `host_loop_p99_ms` (the worst shard loop-lag p99 under
load), `coordinator_loop_p99_ms` (the coordinator's, under load), `lane_cpu_s_per_s` (the
lanes' throughput under load), `cpu` (each process's class as `ctl status` shows it),
`rt_demoted` (processes the real-time guard put back in SCHED_OTHER: 0 in a clean run). Top level:
`throughput_ratio`, separated's lane CPU seconds per second over default's: what the policy
costs the lanes. Target (issues 6, 20): separated ratio <= 1.2 while colocated degrades by an
order of magnitude, and `throughput_ratio` >= 0.9.
Loop-lag figures are None for a process that has not sent a sample yet (a phase shorter than a
heartbeat). `samples_ms` keeps every timed turn (idle and loaded) for plots (`bench all`).
`machine` records what the run ran on (`orchestra_sup.bench.machine`: CPUs, idle states, load,
steal), plus `probe` and `coordinator`: the probe client's and the coordinator's class for
each mode (`system.cpupolicy.in_force`), and `policy`: the `[cpu]` table separated ran with.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from orchestra_sup.bench import machine
from orchestra_sup.bench.policy import LaneThroughput, policy_config, probe_like, write_config
from orchestra_sup.bench.stats import summary
from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.client.oneshot import private_tree, wait_plan
from orchestra_sup.protocol import frames as f

SHARDS = 2
LANES_PER_SHARD = 8
PROBE_EVERY_S = 0.01
MODES = ("separated", "default", "colocated")
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
    """Until `count` lanes of `plan_id` run their commands (`ctl lanes`: a lane still waiting
    for its sandbox burns nothing yet)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listed = client.request(f.CtlLanes(), timeout_s=30.0)
        assert isinstance(listed, f.LaneList)
        if sum(i.plan == plan_id and i.state == "running" for i in listed.lanes) >= count:
            return
        time.sleep(0.05)  # polling the shards' lanes, under the deadline above
    raise TimeoutError(f"the {count} loaded lanes were not all running within {timeout_s:g} s")


def measure(
    mode: str, probes: int, work: Path, cpu: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """One mode's figures (see the module docstring), and the probe client's and the
    coordinator's class (`bench.policy.probe_like`); `cpu` is the `[cpu]` table of `separated`
    (the others run at the defaults)."""
    lanes = SHARDS * LANES_PER_SHARD
    config = write_config(work / f"{mode}.toml", cpu if mode == "separated" else {})
    with private_tree(
        workspace=None,
        state_dir=work / mode,
        shards=SHARDS,
        lanes_per_shard=LANES_PER_SHARD,
        config=config,
        colocated=mode == "colocated",
    ) as client:
        before, rank = probe_like(client)
        try:
            figures = _phases(client, probes, lanes)
        finally:
            before.take()
    return figures, rank


def _phases(client: CtlClient, probes: int, lanes: int) -> dict[str, Any]:
    """The idle and the loaded phase of one mode, on its tree (`client`)."""
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
    throughput = LaneThroughput(client)
    throughput.start()
    loaded = _turns(client, probe_plan, probes)
    lane_cpu = throughput.stop()
    loaded_lags = _lags(client)
    status = client.request(f.CtlStatus(), timeout_s=30.0)
    assert isinstance(status, f.StatusReply)
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
        "lane_cpu_s_per_s": lane_cpu,
        "cpu": {"supervisor": status.cpu, "lanes": status.lane_cpu}
        | {c.name: c.cpu for c in status.children},
        "rt_demoted": status.rt_demoted,
        "samples_ms": {
            "idle": [round(x, 4) for x in idle],
            "loaded": [round(x, 4) for x in loaded],
        },
    }


def run_isolation_bench(
    quick: bool = False,
    probes: int | None = None,
    hold_cpu_latency: bool = False,
    cpu_config: Path | None = None,
) -> dict[str, Any]:
    """Every mode in one run; see the module docstring for the figures and the JSON shape.
    `probes` per phase: default 1,000, or 200 when `quick`. With `hold_cpu_latency`,
    `/dev/cpu_dma_latency` is held at 0 for the whole run, every tree and the probes alike
    (`machine.cpu_latency_held`). `cpu_config`: a TOML file whose `[cpu]` separated runs with
    (None: `bench.policy.responsive`). Raises `ConfigError` before any tree starts when that
    hold cannot be taken, or that file cannot be read."""
    probes = probes or (200 if quick else 1000)
    cpu = policy_config(cpu_config)
    with (
        machine.cpu_latency_held(hold_cpu_latency),
        tempfile.TemporaryDirectory(prefix="osup-bench-") as tmp,
    ):
        start = machine.sample()
        measured = {mode: measure(mode, probes, Path(tmp), cpu) for mode in MODES}
        end = machine.sample()
    result: dict[str, Any] = {mode: figures for mode, (figures, _) in measured.items()}
    default_cpu = result["default"]["lane_cpu_s_per_s"]
    result["throughput_ratio"] = (
        round(result["separated"]["lane_cpu_s_per_s"] / default_cpu, 3) if default_cpu else None
    )
    result["machine"] = {
        **machine.record(start, end, hold_cpu_latency=hold_cpu_latency),
        "probe": {mode: rank["probe"] for mode, (_, rank) in measured.items()},
        "coordinator": {mode: rank["coordinator"] for mode, (_, rank) in measured.items()},
        "policy": cpu,
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
        "throughput": "CPU seconds per second of every process under the shards, over the "
        "loaded probes (psutil)",
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
    lines = [f"{'':44}" + "".join(f"{m:>20}" for m in MODES)]
    for label, idle, loaded in rows:
        cells = [f"{result[m][idle]:.2f} / {result[m][loaded]:.2f}" for m in MODES]
        lines.append(f"{label:44}" + "".join(f"{c:>20}" for c in cells))
    for label, key in (
        ("slowdown under load (p99 ratio)", "ratio"),
        ("worst shard loop-lag p99 under load, ms", "host_loop_p99_ms"),
        ("coordinator loop-lag p99 under load, ms", "coordinator_loop_p99_ms"),
        ("lanes' CPU seconds per second under load", "lane_cpu_s_per_s"),
    ):
        cells = [str(result[m][key]) for m in MODES]  # a loop-lag figure may be None
        lines.append(f"{label:44}" + "".join(f"{c:>20}" for c in cells))
    method = result["method"]
    lines.append(
        f"lanes' throughput under the policy: {result['throughput_ratio']}x of the default's"
    )
    ranks = result["machine"]["coordinator"]
    lines.append("coordinator: " + "; ".join(f"{m} {ranks[m]}" for m in MODES))
    lines.append(
        f"{method['probes_per_phase']} probes per phase, {method['loaded_lanes']} loaded lanes"
    )
    lines.append(f"machine: {machine.one_line(result['machine'])}")
    return "\n".join(lines)

"""`orchestra-sup bench reaction`: how fast a coordinator program reacts to a lane's result.

A coordinator program (`coordinator.context`) decides from its durable inbox: a lane's result
arrives, the program reads it from `ctx.events()` and starts the next lane. Its *reaction time*
is from the moment that result reaches the coordinator to the moment the next `LaneStart`
reaches a shard. It covers all the seat does between them: the result's inbox commit (synced),
applying it to the lane's one-task plan, the session's event record, waking the program, the
program's `start_lane` (the new plan's durable write, its placement's synced write) and the
`LaneStart` on the wire.

The program is `Stepper` (allowed in the bench tree's `[coordinator] programs`): `steps` times,
`start_lane(run="true")`, then wait for that lane's result event from `ctx.events()` (not
`ctx.wait`: the inbox path is what is measured), then the next start. It returns the one-task
plan of every lane, in order. A step's two timestamps are taken in two processes, as each
message arrives: the coordinator stamps an `InboxPut` in its `handle` (`InboxPut.received_ns`),
a shard stamps a `LaneStart` when it admits the lane, in the same turn (`LaneResult.
start_received_ns`); the lane's task record keeps both and its plan's report shows them
(`TaskReport.stamps_ns`). Both are CLOCK_MONOTONIC (`time.monotonic_ns`), one clock for every
process of a Linux host, so they compare: reaction i = shard receipt of step i+1's start -
coordinator receipt of step i's result (`reactions`). No Context API and no code of the seat
is involved: the program never sees the stamps.

Three shapes, as `bench isolation` compares them: `separated` (one process per role, under the
CPU policy: `bench.policy`), `default` (the same, `[cpu]` at its defaults) and `colocated`
(`start --colocated`: every role in one process and one event loop, `[cpu]` at its defaults).
Each is a fresh private tree of `SHARDS` shards of `LANES_PER_SHARD` lanes, and runs two
phases:

1. Idle: `runs` sessions of `steps` steps, one after the other.
2. Loaded: `bench isolation`'s load (`isolation.BURNER`: `LOADED_LANES` lanes that each burn CPU
   and stream output, forever), running before the first session; the same sessions again; the
   load is cancelled afterwards. Each shard keeps one slot free of the load, so a step's lane
   never waits for room: what is timed is the reaction, not a queue.

Figures per shape and phase (`phase_figures`): `p50_ms`, `p99_ms`, `max_ms` and `n` over every
reaction of the phase's runs pooled (`steps - 1` per run; nearest rank: with fewer than 100
reactions the p99 is the maximum), and `spread`: the median, min and max over the runs of each
run's own p50 and p99, as `bench plan` reports its runs. `ratio` is loaded p99 / idle p99 and
`ratio_p50` loaded p50 / idle p50, as `bench isolation` divides. `samples_ms` keeps every
reaction, for plots (`bench all`). `cpu` is each process's class as `ctl status` shows it at
the end, and `rt_demoted` the processes the real-time guard demoted (0 in a clean run).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestra_sup.bench.isolation import BURNER, MODES
from orchestra_sup.bench.policy import policy_config, write_config
from orchestra_sup.bench.stats import nearest_rank
from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.client.oneshot import private_tree, wait_plan
from orchestra_sup.errors import ErrorCode, RemoteError, SupervisionError
from orchestra_sup.protocol import frames as f

STEPPER = "orchestra_sup.bench.reaction:Stepper"
STEPS = 20
RUNS = 3
SHARDS = 2
LANES_PER_SHARD = 9
LOADED_LANES = 16
"""`bench isolation`'s load (2 shards of 8 busy lanes); each shard keeps one lane free."""
PHASES = ("idle", "loaded")
SESSION_TIMEOUT_S = 300.0


class Stepper:
    """The bench's coordinator program: `args["steps"]` (default `STEPS`) lanes of `true`, one
    after the other, each started once the previous one's result event arrives. Returns
    {"plans": the one-task plan of every lane, in start order}. No checkpoint: a restarted
    session starts again from the first step, and its effect ids answer the starts it had made."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.steps = int(args.get("steps", STEPS))

    async def run(self, ctx: Any) -> dict[str, Any]:
        plans: list[str] = []
        events = ctx.events()
        plans.append((await ctx.tools.start_lane(run="true"))["plan"])
        async for event in events:
            if event.kind != "result" or (event.outcome or {}).get("plan") != plans[-1]:
                continue
            if len(plans) == self.steps:
                break
            plans.append((await ctx.tools.start_lane(run="true"))["plan"])
        return {"plans": plans}


# --- the reduction (pure) ------------------------------------------------------------------------


def reactions(steps: list[tuple[int | None, int | None]]) -> list[float]:
    """The reaction times, ms, of one session's steps in order, each (shard receipt of its
    `LaneStart`, coordinator receipt of its result), CLOCK_MONOTONIC ns: step i+1's start minus
    step i's result, so `len(steps) - 1` of them.

    Raises `ValueError` when a stamp a reaction needs is missing (None), or when a start was
    received before the result it reacts to, or a lane's result before its own start: the two
    clocks are one, so that is a bug, never noise."""
    stamped: list[tuple[int, int]] = []
    for i, (start, result) in enumerate(steps):
        if start is None or result is None:
            raise ValueError(f"step {i}: a timestamp is missing ({start}, {result})")
        if result < start:
            raise ValueError(f"step {i}: its result was received before its start")
        stamped.append((start, result))
    out: list[float] = []
    for i in range(len(stamped) - 1):
        gap = stamped[i + 1][0] - stamped[i][1]
        if gap < 0:
            raise ValueError(f"step {i + 1}: its start was received before step {i}'s result")
        out.append(gap / 1e6)
    return out


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def phase_figures(runs: list[list[float]]) -> dict[str, Any]:
    """One phase's figures from each run's reactions (ms): {"p50_ms", "p99_ms", "max_ms", "n"}
    over all runs pooled, "spread": {"p50_ms", "p99_ms"} each {"median", "min", "max"} over the
    runs' own percentiles, and "runs": each run's {"p50_ms", "p99_ms", "max_ms", "n"}.

    Raises `ValueError` when there is no run or a run has no reaction."""
    if not runs or not all(runs):
        raise ValueError("every run needs at least one reaction (two steps)")
    each = [_percentiles(r) for r in runs]
    return {
        **_percentiles([x for r in runs for x in r]),
        "spread": {k: _spread([e[k] for e in each]) for k in ("p50_ms", "p99_ms")},
        "runs": each,
    }


def _percentiles(samples: list[float]) -> dict[str, Any]:
    return {
        "p50_ms": round(nearest_rank(samples, 0.50), 3),
        "p99_ms": round(nearest_rank(samples, 0.99), 3),
        "max_ms": round(max(samples), 3),
        "n": len(samples),
    }


def shape_figures(idle: list[list[float]], loaded: list[list[float]]) -> dict[str, Any]:
    """One shape's figures: "idle" and "loaded" (`phase_figures`), "ratio" (loaded p99 / idle
    p99), "ratio_p50", and "samples_ms" {"idle", "loaded"}: every reaction, runs in order."""
    quiet, busy = phase_figures(idle), phase_figures(loaded)
    return {
        "idle": quiet,
        "loaded": busy,
        "ratio": round(busy["p99_ms"] / quiet["p99_ms"], 2) if quiet["p99_ms"] else None,
        "ratio_p50": round(busy["p50_ms"] / quiet["p50_ms"], 2) if quiet["p50_ms"] else None,
        "samples_ms": {
            "idle": [round(x, 4) for r in idle for x in r],
            "loaded": [round(x, 4) for r in loaded for x in r],
        },
    }


# --- the runs on a real tree ---------------------------------------------------------------------


def session_steps(client: CtlClient, steps: int) -> list[tuple[int | None, int | None]]:
    """Run one `Stepper` session of `steps` steps to its end; each step's (shard receipt of its
    `LaneStart`, coordinator receipt of its result), from its lane's plan report. Raises
    `SupervisionError` when the session or a lane did not succeed."""
    spec = f.PlanSpec(name="reaction", tasks=[], coordinator=STEPPER, args={"steps": steps})
    accepted = client.request(f.CtlSubmit(plan=spec), timeout_s=30.0)
    assert isinstance(accepted, f.PlanAccepted)
    report = wait_plan(client, accepted.id, timeout_s=SESSION_TIMEOUT_S)
    if not report.ok or not isinstance(report.result, dict):
        raise SupervisionError(f"the reaction session {accepted.id} did not succeed")
    out: list[tuple[int | None, int | None]] = []
    for plan in report.result["plans"]:
        lane = client.request(f.CtlPlan(id=plan), timeout_s=30.0)
        assert isinstance(lane, f.PlanReport)
        (task,) = lane.tasks
        if task.status != "succeeded":
            raise SupervisionError(f"lane plan {plan}: {task.status}: {task.error}")
        out.append(task.stamps_ns or (None, None))
    return out


def _load(client: CtlClient, runs: int) -> list[str]:
    """Start the load and wait until every lane of it runs its command (`ctl lanes`: a lane
    still waiting for its sandbox burns nothing yet); its lane ids. Each lane's timeout outlasts
    `runs` sessions of the longest `SESSION_TIMEOUT_S`: the load must not end before they do."""
    timeout_s = runs * SESSION_TIMEOUT_S + 60.0
    spec = f.PlanSpec(
        name="load",
        tasks=[
            f.TaskSpec(id=f"burn{i}", run=BURNER, timeout_s=timeout_s) for i in range(LOADED_LANES)
        ],
    )
    accepted = client.request(f.CtlSubmit(plan=spec), timeout_s=30.0)
    assert isinstance(accepted, f.PlanAccepted)
    deadline = time.monotonic() + 60.0
    while True:
        listed = client.request(f.CtlLanes(), timeout_s=30.0)
        assert isinstance(listed, f.LaneList)
        lanes = [i.lane for i in listed.lanes if i.plan == accepted.id and i.state == "running"]
        if len(lanes) == LOADED_LANES:
            return lanes
        if time.monotonic() > deadline:
            raise SupervisionError(f"the {LOADED_LANES} loaded lanes were not all running in 60 s")
        time.sleep(0.05)  # polling the shards' lanes, under the deadline above


def _cancel(client: CtlClient, lane: str) -> None:
    """Cancel load lane `lane`; one that has ended already is left be (a session that failed
    keeps its own error, not this one's)."""
    try:
        client.request(f.CtlCancel(lane=lane), timeout_s=30.0)
    except RemoteError as exc:
        if exc.code is not ErrorCode.NOT_FOUND:
            raise


def measure(mode: str, steps: int, runs: int, work: Path, cpu: dict[str, Any]) -> dict[str, Any]:
    """One shape's figures (`shape_figures`), plus "steps": every session's raw stamps. `cpu`
    is the `[cpu]` table of `separated` (the others run at the defaults)."""
    config = write_config(
        work / f"{mode}.toml",
        cpu if mode == "separated" else {},
        f'[coordinator]\nprograms = ["{STEPPER}"]',
    )
    raw: dict[str, list[list[tuple[int | None, int | None]]]] = {p: [] for p in PHASES}
    with private_tree(
        workspace=None,
        state_dir=work / mode,
        shards=SHARDS,
        lanes_per_shard=LANES_PER_SHARD,
        config=config,
        colocated=mode == "colocated",
    ) as client:
        raw["idle"] = [session_steps(client, steps) for _ in range(runs)]
        load = _load(client, runs)
        try:
            raw["loaded"] = [session_steps(client, steps) for _ in range(runs)]
        finally:
            for lane in load:
                _cancel(client, lane)
        status = client.request(f.CtlStatus(), timeout_s=30.0)
        assert isinstance(status, f.StatusReply)
    figures = shape_figures(
        [reactions(s) for s in raw["idle"]], [reactions(s) for s in raw["loaded"]]
    )
    figures["steps"] = {p: [[list(s) for s in run] for run in raw[p]] for p in PHASES}
    figures["cpu"] = {"supervisor": status.cpu, "lanes": status.lane_cpu} | {
        c.name: c.cpu for c in status.children
    }
    figures["rt_demoted"] = status.rt_demoted
    return figures


def run_reaction_bench(
    steps: int = STEPS, runs: int = RUNS, cpu_config: Path | None = None
) -> dict[str, Any]:
    """Every shape, separated first; see the module docstring for the figures and the JSON
    shape. `steps` per session (at least 2), `runs` sessions per phase; `cpu_config` a TOML
    file whose `[cpu]` separated runs with (None: `bench.policy.responsive`). Raises
    `ValueError` for fewer than 2 steps or no run, `ConfigError` when that file cannot be read,
    `SupervisionError` when a tree does not start or a session does not succeed."""
    if steps < 2 or runs < 1:
        raise ValueError("a reaction needs at least 2 steps and 1 run")
    cpu = policy_config(cpu_config)
    with tempfile.TemporaryDirectory(prefix="osup-bench-") as tmp:
        result: dict[str, Any] = {
            mode: measure(mode, steps, runs, Path(tmp), cpu) for mode in MODES
        }
    result["policy"] = cpu
    result["method"] = {
        "steps": steps,
        "runs": runs,
        "shards": SHARDS,
        "lanes_per_shard": LANES_PER_SHARD,
        "loaded_lanes": LOADED_LANES,
        "program": STEPPER,
        "reaction": "shard receipt of step i+1's LaneStart - coordinator receipt of step i's "
        "result InboxPut, CLOCK_MONOTONIC, ms",
        "percentiles": "nearest rank, all runs pooled; spread over the runs' own",
    }
    return result


def _cells(shape: dict[str, Any], key: str) -> list[str]:
    """One shape's cells for figure `key`: "idle / loaded" percentiles, then the same with
    each phase's spread (min-max) over the runs."""
    idle, loaded = shape["idle"], shape["loaded"]
    spread = idle["spread"].get(key), loaded["spread"].get(key)
    cells = [f"{idle[key]:.2f} / {loaded[key]:.2f}"]
    if spread[0] is not None and spread[1] is not None:
        cells.append(" / ".join(f"{s['min']:.1f}-{s['max']:.1f}" for s in spread))
    return cells


def format_table(result: dict[str, Any]) -> str:
    """The shapes side by side, for people."""
    width = 26
    rows: list[tuple[str, list[str]]] = []
    for name in ("p50", "p99", "max"):
        cells = [_cells(result[m], f"{name}_ms") for m in MODES]
        rows.append((f"reaction {name} idle / loaded, ms", [c[0] for c in cells]))
        if len(cells[0]) > 1:
            rows.append((f"runs' {name} min-max idle / loaded, ms", [c[1] for c in cells]))
    for name, key in (("p99", "ratio"), ("p50", "ratio_p50")):
        rows.append((f"slowdown under load ({name} ratio)", [str(result[m][key]) for m in MODES]))
    lines = [f"{'':40}" + "".join(f"{m:>{width}}" for m in MODES)]
    lines += [f"{label:40}" + "".join(f"{c:>{width}}" for c in cells) for label, cells in rows]
    method = result["method"]
    lines.append(
        f"{method['runs']} runs of {method['steps']} steps per phase, "
        f"{method['loaded_lanes']} loaded lanes"
    )
    return "\n".join(lines)

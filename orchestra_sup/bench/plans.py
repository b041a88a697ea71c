"""`orchestra-sup bench plan`: how long big plans take, and what they cost the coordinator's loop.

For each shape and size (default 100, 1,000 and 10,000 tasks), `runs` times (default 3), one plan
at a time on one private tree (2 shards of 8 lanes, its state in the temp directory):

- `chain`: each task needs the one before, listed goal first (the order issue 24 found
  quadratic);
- `fan_out`: one task, then all the others, each needing it;
- `fan_in`: all tasks but one independent, then a goal that needs them all.

Each task is a lane of `Done`, a program that succeeds at once, so what is timed is the tree's
cost per task (placement, the placement's synced write, the shard's lane and outbox, the
coordinator's inbox commit), not a command's. Figures per shape and size:

- `submit_to_done_s`: from sending `CtlSubmit` to `ctl plan --wait` answering done, per run,
  with its median, min and max;
- `lag_p99_ms`, `lag_max_ms`: the coordinator's event-loop lag during each run (its sampler wakes
  every 0.1 s, `runtime.looplag`), from the histogram its heartbeats carry to the supervisor
  (`orchestra_sup_loop_lag_seconds` on the metrics endpoint): the difference between a scrape
  before the plan is submitted and one after it is done holds the run's samples (give or take
  a heartbeat, 0.5 s, of idle ones at either end); each figure is the upper bound of the bucket
  holding it (`histogram.quantile`: 0.5, 1, 2.5, 5, 10, 25, 50, 100 ms, ...), so an upper
  estimate; `lag_samples` is how many there were.

Target (issue 24): 10,000-task plans settle with the coordinator's loop-lag p99 under 50 ms.
"""

from __future__ import annotations

import statistics
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from orchestra_sup.bench.scratch import scratch_tree
from orchestra_sup.client.ctl import CtlClient
from orchestra_sup.errors import SupervisionError
from orchestra_sup.histogram import quantile
from orchestra_sup.protocol import frames as f
from orchestra_sup.shards.program import LaneContext, Outcome

DONE = "orchestra_sup.bench.plans:Done"
SIZES = (100, 1000, 10_000)
RUNS = 3
SHARDS = 2
LANES_PER_SHARD = 8
TARGET_LAG_P99_MS = 50.0
TARGET_TASKS = 10_000
LAG = "orchestra_sup_loop_lag_seconds"


class Done:
    """A lane program that succeeds at once."""

    async def run(self, lane: LaneContext) -> Outcome:
        return Outcome(status="succeeded")


def _task(task_id: str, needs: list[str]) -> f.TaskSpec:
    return f.TaskSpec(id=task_id, run="", program=DONE, needs=needs)


def chain(n: int) -> list[f.TaskSpec]:
    """t0 <- t1 <- ... <- t(n-1), listed goal first."""
    return [_task(f"t{i}", [f"t{i - 1}"] if i else []) for i in range(n - 1, -1, -1)]


def fan_out(n: int) -> list[f.TaskSpec]:
    return [_task("t0", [])] + [_task(f"t{i}", ["t0"]) for i in range(1, n)]


def fan_in(n: int) -> list[f.TaskSpec]:
    heads = [_task(f"t{i}", []) for i in range(n - 1)]
    return [*heads, _task("goal", [t.id for t in heads])]


SHAPES: dict[str, Callable[[int], list[f.TaskSpec]]] = {
    "chain": chain,
    "fan_out": fan_out,
    "fan_in": fan_in,
}


def loop_lag(metrics_url: str, process: str = "coordinator") -> f.Histogram | None:
    """Process `process`'s loop-lag histogram (`supervisor`, or a child's name) as the
    supervisor's metrics endpoint serves it, or None before a child's first heartbeat with
    one."""
    with urllib.request.urlopen(metrics_url, timeout=10.0) as answer:
        text = answer.read().decode()
    buckets: list[tuple[float, int]] = []
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != LAG:
            continue
        for sample in family.samples:
            if sample.labels.get("process") != process:
                continue
            if sample.name == f"{LAG}_bucket":
                buckets.append((float(sample.labels["le"]), int(sample.value)))
            elif sample.name == f"{LAG}_sum":
                total = float(sample.value)
    if not buckets:
        return None
    buckets.sort()
    return f.Histogram(
        bounds=tuple(b for b, _ in buckets if b != float("inf")),
        counts=tuple(n for _, n in buckets),
        total=total,
    )


def lag_between(before: f.Histogram, after: f.Histogram) -> f.Histogram:
    """The samples `after` has that `before` had not."""
    return f.Histogram(
        bounds=after.bounds,
        counts=tuple(a - b for a, b in zip(after.counts, before.counts, strict=True)),
        total=after.total - before.total,
    )


def _metrics_url(client: CtlClient) -> str:
    status = client.request(f.CtlStatus(), timeout_s=30.0)
    assert isinstance(status, f.StatusReply)
    if not status.metrics_url:
        raise SupervisionError("the bench tree serves no metrics")
    return status.metrics_url


def _fresh_lag(url: str, since: f.Histogram | None, timeout_s: float = 30.0) -> f.Histogram:
    """A scrape holding more loop-lag samples than `since` (None: any); the heartbeat that
    carries them comes every 0.5 s."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = loop_lag(url)
        if now is not None and (since is None or now.counts[-1] > since.counts[-1]):
            return now
        if time.monotonic() > deadline:
            raise SupervisionError(f"no loop-lag samples of the coordinator for {timeout_s:g} s")
        time.sleep(0.1)


def run_once(client: CtlClient, url: str, spec: f.PlanSpec, timeout_s: float) -> dict[str, Any]:
    """Submit `spec`, wait for it to be done; its figures (see the module docstring)."""
    before = _fresh_lag(url, loop_lag(url))
    started = time.perf_counter()
    accepted = client.request(f.CtlSubmit(plan=spec), timeout_s=120.0)
    assert isinstance(accepted, f.PlanAccepted)
    deadline = time.monotonic() + timeout_s
    while True:
        report = client.request(f.CtlPlan(id=accepted.id, wait_s=30.0), timeout_s=90.0)
        assert isinstance(report, f.PlanReport)
        if report.done:
            break
        if time.monotonic() > deadline:
            raise SupervisionError(f"plan {spec.name} not done within {timeout_s:g} s")
    elapsed = time.perf_counter() - started
    if not report.ok:
        bad = next(t for t in report.tasks if t.status != "succeeded")
        raise SupervisionError(f"plan {spec.name}: task {bad.id} {bad.status}: {bad.error}")
    lag = lag_between(before, _fresh_lag(url, loop_lag(url)))
    p99, worst = quantile(lag, 0.99), quantile(lag, 1.0)
    return {
        "submit_to_done_s": round(elapsed, 3),
        "lag_p99_ms": None if p99 is None else round(p99 * 1000, 3),
        "lag_max_ms": None if worst is None else round(worst * 1000, 3),
        "lag_samples": lag.counts[-1],
    }


def run_plan_bench(sizes: tuple[int, ...] = SIZES, runs: int = RUNS) -> dict[str, Any]:
    """Every shape at every size, `runs` times each; see the module docstring. Raises
    `SupervisionError` when the tree does not start, a plan does not succeed, or one is not
    done within a minute plus a quarter of a second per task."""
    results: dict[str, Any] = {}
    config = f'[supervisor]\nmetrics_port = 0\n[lanes]\nprograms = ["{DONE}"]\n'
    with scratch_tree(config, shards=SHARDS, lanes_per_shard=LANES_PER_SHARD) as client:
        url = _metrics_url(client)
        for size in sizes:
            for shape, build in SHAPES.items():
                spec = f.PlanSpec(name=f"{shape}-{size}", tasks=build(size))
                each = [run_once(client, url, spec, 60.0 + 0.25 * size) for _ in range(runs)]
                results.setdefault(shape, {})[str(size)] = _summary(size, each)
    return {
        "results": results,
        "target": _target(results),
        "method": {
            "shards": SHARDS,
            "lanes_per_shard": LANES_PER_SHARD,
            "runs": runs,
            "lane": f"program {DONE}: succeeds at once",
            "submit_to_done": "CtlSubmit sent to ctl plan --wait answering done, this process",
            "lag": "the coordinator's loop-lag histogram (metrics endpoint) after the run minus "
            "before it; p99 and max are bucket upper bounds",
        },
    }


def _summary(size: int, each: list[dict[str, Any]]) -> dict[str, Any]:
    times = [r["submit_to_done_s"] for r in each]
    p99s = [r["lag_p99_ms"] for r in each if r["lag_p99_ms"] is not None]
    return {
        "tasks": size,
        "submit_to_done_s": {
            "median": round(statistics.median(times), 3),
            "min": min(times),
            "max": max(times),
        },
        "per_task_ms": round(statistics.median(times) / size * 1000, 3),
        "lag_p99_ms": max(p99s, default=None),
        "lag_max_ms": max((r["lag_max_ms"] or 0.0 for r in each), default=None),
        "runs": each,
    }


def _target(results: dict[str, Any]) -> dict[str, Any]:
    at = [r[str(TARGET_TASKS)] for r in results.values() if str(TARGET_TASKS) in r]
    worst = max((r["lag_p99_ms"] or 0.0 for r in at), default=None)
    return {
        "tasks": TARGET_TASKS,
        "lag_p99_ms": TARGET_LAG_P99_MS,
        "worst_lag_p99_ms": worst,
        "met": None if worst is None else worst < TARGET_LAG_P99_MS,
    }


def format_table(result: dict[str, Any]) -> str:
    """One line per shape and size, for people."""
    lines = [
        f"{'shape':>8} {'tasks':>6} {'done s (median)':>16} {'min-max s':>14} "
        f"{'ms/task':>8} {'lag p99 ms':>11} {'lag max ms':>11}"
    ]
    for shape, sizes in result["results"].items():
        for row in sizes.values():
            spread = row["submit_to_done_s"]
            lines.append(
                f"{shape:>8} {row['tasks']:>6} {spread['median']:>16} "
                f"{spread['min']:>6}-{spread['max']:<7} {row['per_task_ms']:>8} "
                f"{row['lag_p99_ms']!s:>11} {row['lag_max_ms']!s:>11}"
            )
    target = result["target"]
    if target["met"] is not None:
        lines.append(
            f"target: lag p99 < {target['lag_p99_ms']:g} ms at {target['tasks']:,} tasks: "
            f"{'met' if target['met'] else 'not met'} (worst {target['worst_lag_p99_ms']} ms)"
        )
    return "\n".join(lines)

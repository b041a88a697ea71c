"""`orchestra-sup bench console`: what open consoles cost the supervisor's loop (issue 23).

One private tree (`oneshot.private_tree`: custodian, coordinator, `SHARDS` shards of
`LANES_PER_SHARD` lanes) serves the HTTP API on a free loopback port, with a `read` token made
for it, and its metrics; from `WARMUP_S` seconds before the first phase to the end it runs
`bench soak`'s load: `soak.PLANS_IN_FLIGHT` plans of `soak.TASKS` short tasks at a time, each
slot given its next plan once its last is done and `soak.PLAN_EVERY_S` seconds have passed, so
the event log grows at a steady pace set by the clock, not by how fast the tree runs.

Each of `runs` runs has two phases of `duration_s` seconds: none, then consoles in the first,
third, ... run, consoles, then none in the second, fourth, ... (ABBA: a drift over the bench
favours neither side):

- `none`: no HTTP client;
- `consoles`: `consoles` console pages streaming, all in one child process
  (`bench.consoleclient`, which says what each does: the page's opening GETs, the event
  stream, a plan's GET on each of its events). The phase starts once every console's stream
  is open, so it measures consoles that stream, not their opening.

The supervisor's loop lag in a phase is the difference of its `orchestra_sup_loop_lag_seconds`
histogram (`process="supervisor"`, read from the metrics endpoint, which takes it from the
loop's own sampler when asked: `runtime.looplag`, a sample every 0.1 s, every one counted since
the start) between a scrape at the phase's start and one at its end: exactly that phase's
samples. `ctl status`'s `loop_lag_ms` comes from the same sampler but over its last 600
samples (a minute or more), which would mix the two phases. p50, p99 and max are bucket upper
bounds (`histogram.quantile`: 0.5, 1, 2.5, 5, 10, 25 ms, ...), so upper estimates on a coarse
scale; `mean_ms` (the histogram's sum over its count) is exact.

Per run and phase: `lag` (`p50_ms`, `p99_ms`, `max_ms`, `mean_ms`, `samples`), `seconds`,
`supervisor_cpu_s_per_s` (the supervisor process's CPU seconds per second, every thread of
it), `events_logged_per_s` (the log's last seq over the phase); for consoles also `consoles`:
`events_per_s` (log events every console read, summed, per second of the window),
`requests` and `requests_per_s` (GETs made within the window, streams opened not counted),
`requests_by` (every request by what and HTTP status), `delivery_lag_ms` (an event's `at` to
a console reading it: p50, p99, ...), `first_seq` and `last_seq` (each console's), `gaps`,
`repeats`, `reconnects`, `other`, `status_param` (`consoleclient.Report` says what each is),
`client_cpu_s_per_s` (the console process's). Per run `ratio_p99` and `ratio_mean` (consoles /
none); across runs their `median`, `min` and `max`, and the delivery lag over every run.
`restarts` (children's, summed), `plans`, `tasks` and `failed` (tasks that ended other than
succeeded, and plans not done at the end) say what the load did; `clean`: none failed, no
child restarted, and in every run the consoles read events, with no gap or repeat of a seq.

Raises `SupervisionError` when the tree does not start or the consoles are not streaming
within `READY_TIMEOUT_S`, `OrchestraError` when the tree stops answering ctl.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import psutil

from orchestra_sup.bench import machine, soak
from orchestra_sup.bench.consoleclient import Report
from orchestra_sup.bench.plans import lag_between, loop_lag
from orchestra_sup.bench.stats import summary
from orchestra_sup.client.ctl import CtlClient, status_or_none
from orchestra_sup.client.oneshot import private_tree
from orchestra_sup.errors import SupervisionError
from orchestra_sup.histogram import quantile
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.keys import default_keys_dir
from orchestra_sup.protocol.tokens import issue_token
from orchestra_sup.system import linux

CONSOLES = 20
DURATION_S = 30.0
RUNS = 3
SHARDS = 2
LANES_PER_SHARD = 4
WARMUP_S = 5.0
"""Seconds of load before the first phase."""
READY_TIMEOUT_S = 60.0
"""Seconds the consoles have to open their streams."""
STOP_TIMEOUT_S = 30.0
"""Seconds the console process has to report and exit once told to stop."""
TICK_S = 0.2
"""Seconds between two polls of the plans in flight."""
PLAN_TIMEOUT_S = 120.0
"""Seconds the plans in flight at the end have to finish."""
CONFIG = '[supervisor]\nmetrics_port = 0\n[http]\nlisten = "127.0.0.1:0"\n'


def run_console_bench(
    consoles: int = CONSOLES, duration_s: float = DURATION_S, runs: int = RUNS
) -> dict[str, Any]:
    """The bench; see the module docstring for what it does, returns and raises."""
    base = Path(tempfile.mkdtemp(prefix="osup-console-"))
    start = machine.sample()
    try:
        state = base / "state"
        token = issue_token(default_keys_dir(state), "console", "read")
        config = base / "tree.toml"
        config.write_text(CONFIG)
        with private_tree(
            workspace=None,
            state_dir=state,
            shards=SHARDS,
            lanes_per_shard=LANES_PER_SHARD,
            config=config,
        ) as client:
            status = client.request(f.CtlStatus(), timeout_s=30.0)
            assert isinstance(status, f.StatusReply)
            if not status.http_url or not status.metrics_url:
                raise SupervisionError("the bench tree serves no HTTP API or no metrics")
            load = _Load(client)
            load.drive(lambda: False, WARMUP_S)
            bench = _Bench(load, status, token, consoles, duration_s)
            each = [bench.run(i) for i in range(runs)]
            load.finish()
            done = status_or_none(client)
            restarts = sum(c.restarts for c in done.children) if done else -1
    finally:
        shutil.rmtree(base, ignore_errors=True)
    seen = [r["consoles"]["consoles"] for r in each]
    lags = [lag for s in seen for lag in s.pop("lags_ms")]
    streamed = all(s["events_per_s"] > 0 and s["gaps"] == s["repeats"] == 0 for s in seen)
    return {
        "clean": streamed and restarts == 0 and load.failed == 0,
        "consoles": consoles,
        "duration_s": duration_s,
        "runs": each,
        "ratio_p99": _spread([r["ratio_p99"] for r in each]),
        "ratio_mean": _spread([r["ratio_mean"] for r in each]),
        "delivery_lag_ms": summary(lags, "ms", 1) if lags else None,
        "restarts": restarts,
        "plans": load.plans,
        "tasks": load.tasks,
        "failed": load.failed,
        "machine": machine.record(start, machine.sample(), hold_cpu_latency=False),
    }


class _Load:
    """`bench soak`'s plans, kept in flight on one tree, and what came of those done."""

    def __init__(self, client: CtlClient) -> None:
        self.client = client
        self.slots: list[str | None] = [None] * soak.PLANS_IN_FLIGHT
        self.given = [0.0] * soak.PLANS_IN_FLIGHT
        self.submitted = self.plans = self.tasks = self.failed = 0

    def drive(self, until: Callable[[], bool], timeout_s: float) -> bool:
        """Keep the slots busy until `until()` or `timeout_s` seconds have passed; whether
        `until()` came true."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if until():
                return True
            self.tick()
            time.sleep(TICK_S)
        return False

    def tick(self) -> None:
        """Empty the slots whose plans are done; give a slot its next plan when it is due."""
        now = time.monotonic()
        for slot, plan_id in enumerate(self.slots):
            if plan_id is not None and self._done(plan_id):
                self.slots[slot] = plan_id = None
            if plan_id is None and now - self.given[slot] >= soak.PLAN_EVERY_S:
                self.submitted += 1
                spec = soak.soak_plan(f"console{self.submitted}", slot)
                reply = self.client.request(f.CtlSubmit(plan=spec), timeout_s=10.0)
                assert isinstance(reply, f.PlanAccepted)
                self.slots[slot], self.given[slot] = reply.id, now

    def finish(self) -> None:
        """Wait for the plans in flight (at most `PLAN_TIMEOUT_S`); those still not done count
        as failed."""
        deadline = time.monotonic() + PLAN_TIMEOUT_S
        while any(self.slots) and time.monotonic() < deadline:
            self.slots = [p if p is None or not self._done(p) else None for p in self.slots]
            time.sleep(TICK_S)
        self.failed += sum(p is not None for p in self.slots)

    def _done(self, plan_id: str) -> bool:
        reply = self.client.request(f.CtlPlan(id=plan_id), timeout_s=10.0)
        assert isinstance(reply, f.PlanReport)
        if reply.done:
            self.plans += 1
            self.tasks += len(reply.tasks)
            self.failed += sum(t.status != "succeeded" for t in reply.tasks)
        return reply.done

    def last_seq(self) -> int:
        """The event log's newest seq."""
        page = self.client.request(f.CtlEvents(since=0, limit=1), timeout_s=10.0)
        assert isinstance(page, f.EventsPage)
        return page.last


class _Bench:
    """The phases of every run, on one tree under `load`."""

    def __init__(
        self, load: _Load, status: f.StatusReply, token: str, consoles: int, duration_s: float
    ) -> None:
        self.load = load
        self.supervisor = psutil.Process(status.supervisor_pid)
        self.http_url = status.http_url
        self.metrics_url = status.metrics_url
        self.token = token
        self.consoles = consoles
        self.duration_s = duration_s

    def run(self, index: int) -> dict[str, Any]:
        """Run `index`: both phases, none first in even runs; their figures and ratios."""
        order = ("none", "consoles") if index % 2 == 0 else ("consoles", "none")
        phases = {kind: self.phase(kind == "consoles") for kind in order}
        none, busy = phases["none"]["lag"], phases["consoles"]["lag"]
        return {
            "order": list(order),
            **phases,
            "ratio_p99": _ratio(busy["p99_ms"], none["p99_ms"]),
            "ratio_mean": _ratio(busy["mean_ms"], none["mean_ms"]),
        }

    def phase(self, with_consoles: bool) -> dict[str, Any]:
        """One phase of `duration_s` seconds, with the consoles streaming or without."""
        consoles = None
        if with_consoles:
            consoles = _Consoles(self.http_url, self.token, self.consoles, self.load.last_seq())
        try:
            if consoles is not None and not self.load.drive(consoles.ready, READY_TIMEOUT_S):
                raise SupervisionError(f"the consoles were not streaming in {READY_TIMEOUT_S} s")
            client_cpu = consoles.cpu_s() if consoles is not None else 0.0
            before, cpu, seq = self._lag(), self._cpu_s(), self.load.last_seq()
            started = time.monotonic()
            self.load.drive(lambda: False, self.duration_s)
            after, seconds = self._lag(), time.monotonic() - started
            out: dict[str, Any] = {
                "seconds": round(seconds, 2),
                "lag": _lag_figures(lag_between(before, after)),
                "supervisor_cpu_s_per_s": round((self._cpu_s() - cpu) / seconds, 3),
                "events_logged_per_s": round((self.load.last_seq() - seq) / seconds, 1),
            }
            if consoles is not None:
                client_cpu = (consoles.cpu_s() - client_cpu) / seconds
                out["consoles"] = _console_figures(consoles.stop(), client_cpu)
            return out
        finally:
            if consoles is not None:
                consoles.kill()

    def _lag(self) -> f.Histogram:
        lag = loop_lag(self.metrics_url, "supervisor")
        if lag is None:
            raise SupervisionError("the metrics endpoint shows no loop lag of the supervisor")
        return lag

    def _cpu_s(self) -> float:
        times = self.supervisor.cpu_times()
        return times.user + times.system


class _Consoles:
    """The console process (`bench.consoleclient`), started when first asked whether it is
    ready."""

    def __init__(self, url: str, token: str, consoles: int, since: int) -> None:
        self.config = {"url": url, "token": token, "consoles": consoles, "since": since}
        self.proc: subprocess.Popen[bytes] | None = None

    def ready(self) -> bool:
        """Start the process if it is not running; whether it has said it is ready. Raises
        `SupervisionError` when it exits first."""
        if self.proc is None:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "orchestra_sup.bench.consoleclient"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                preexec_fn=_die_with_parent,
            )
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(self.config).encode() + b"\n")
            self.proc.stdin.flush()
        assert self.proc.stdout is not None
        if not select.select([self.proc.stdout], [], [], 0)[0]:
            return False
        line = self.proc.stdout.readline()
        if not line:
            raise SupervisionError(f"the console process exited with {self.proc.wait()}")
        return bool(json.loads(line).get("ready"))

    def cpu_s(self) -> float:
        """CPU seconds the process has used (it is started)."""
        assert self.proc is not None
        times = psutil.Process(self.proc.pid).cpu_times()
        return times.user + times.system

    def stop(self) -> Report:
        """Stop the consoles; what they report. Raises `SupervisionError` when the process
        does not report within `STOP_TIMEOUT_S` seconds, or fails."""
        assert self.proc is not None and self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(b"stop\n")
        self.proc.stdin.flush()
        if not select.select([self.proc.stdout], [], [], STOP_TIMEOUT_S)[0]:
            raise SupervisionError(f"the console process did not report in {STOP_TIMEOUT_S} s")
        line = self.proc.stdout.readline()
        if self.proc.wait(timeout=STOP_TIMEOUT_S) != 0 or not line:
            raise SupervisionError(f"the console process exited with {self.proc.returncode}")
        return msgspec.json.decode(line, type=Report)

    def kill(self) -> None:
        """End the process if it still runs (a phase that failed)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _die_with_parent() -> None:
    linux.set_parent_death_signal(signal.SIGTERM)
    os.setpgid(0, 0)  # a ^C to the bench stops the consoles through it, not beside it


def _lag_figures(lag: f.Histogram) -> dict[str, Any]:
    n = lag.counts[-1]
    marks = [quantile(lag, q) for q in (0.5, 0.99, 1.0)]
    shown = [None if m is None else round(m * 1000, 3) for m in marks]
    return {
        "p50_ms": shown[0],
        "p99_ms": shown[1],
        "max_ms": shown[2],
        "mean_ms": round(lag.total / n * 1000, 3) if n else None,
        "samples": n,
    }


def _console_figures(report: Report, cpu_s_per_s: float) -> dict[str, Any]:
    window = report.window_s or 1.0
    return {
        "events_per_s": round(report.events / window, 1),
        "requests": report.requests_in_window,
        "requests_per_s": round(report.requests_in_window / window, 1),
        "requests_by": report.requests,
        "delivery_lag_ms": summary(report.lags_ms, "ms", 1) if report.lags_ms else None,
        "lags_ms": report.lags_ms,
        "first_seq": report.first_seq,
        "last_seq": report.last_seq,
        "gaps": report.gaps,
        "repeats": report.repeats,
        "reconnects": report.reconnects,
        "other": report.other,
        "status_param": report.status_param,
        "client_cpu_s_per_s": round(cpu_s_per_s, 3),
    }


def _ratio(busy: float | None, none: float | None) -> float | None:
    return round(busy / none, 3) if busy is not None and none else None


def _spread(values: list[float | None]) -> dict[str, float | None]:
    got = [v for v in values if v is not None]
    if not got:
        return {"median": None, "min": None, "max": None}
    return {"median": round(statistics.median(got), 3), "min": min(got), "max": max(got)}


def format_table(result: dict[str, Any]) -> str:
    """One line per run (loop lag in ms, p50 / p99 / mean), then the ratios across runs."""
    lines = [
        f"{result['consoles']} consoles, {result['duration_s']:g} s a phase; supervisor loop lag "
        "ms p50 / p99 (bucket bounds) / mean",
        f"{'run':>3} {'order':<15} {'none':>20} {'consoles':>20} {'p99 x':>6} {'mean x':>6} "
        f"{'CPU s/s none/cons':>17} {'ev/s':>6} {'req/s':>6}",
    ]
    for i, r in enumerate(result["runs"]):
        none, busy = r["none"], r["consoles"]
        seen = busy["consoles"]
        lines.append(
            f"{i + 1:>3} {','.join(r['order']):<15} {_lags(none['lag']):>20} "
            f"{_lags(busy['lag']):>20} {r['ratio_p99']!s:>6} {r['ratio_mean']!s:>6} "
            f"{none['supervisor_cpu_s_per_s']:>8}/{busy['supervisor_cpu_s_per_s']:<8} "
            f"{seen['events_per_s']:>6} {seen['requests_per_s']:>6}"
        )
    p99, mean = result["ratio_p99"], result["ratio_mean"]
    lines.append(
        f"ratio consoles/none: p99 median {p99['median']} ({p99['min']}-{p99['max']}), "
        f"mean median {mean['median']} ({mean['min']}-{mean['max']})"
    )
    lag = result["delivery_lag_ms"]
    if lag is not None:
        lines.append(f"SSE delivery lag ms: p50 {lag['p50_ms']}, p99 {lag['p99_ms']}")
    verdict = "clean" if result["clean"] else "NOT clean"
    lines.append(
        f"plans {result['plans']}  tasks {result['tasks']}  failed {result['failed']}  "
        f"restarts {result['restarts']}: {verdict}"
    )
    lines.append(f"machine: {machine.one_line(result['machine'])}")
    return "\n".join(lines)


def _lags(lag: dict[str, Any]) -> str:
    return f"{lag['p50_ms']} / {lag['p99_ms']} / {lag['mean_ms']}"

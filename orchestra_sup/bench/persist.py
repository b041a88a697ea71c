"""`orchestra-sup bench persist`: one synced transaction per event versus write-behind, one run.

Both sides write the same generated event stream (8-byte sequence keys, `value_bytes`-byte values,
as in notes/performance.md) into fresh LMDB environments under a temporary directory, with the
`Store`'s own settings (LMDB's default sync: every commit is fsynced before it returns):

- `sync`: one write transaction per event, committed before the next event is written; the first
  `sync_events` events of the stream (the full stream would take minutes at a few thousand a
  second). Events/s = events / elapsed.
- `write_behind`: `Store.put` for every event, then wait until the persistence thread has
  committed the last one. Events/s = events / (first enqueue to the commit of the last event).
- `ratio`: write-behind events/s over sync events/s.
- `enqueue_p50_us`, `enqueue_p99_us`: the hot path: `time.perf_counter_ns()` read around each
  `Store.put` of the full stream (the timer's own cost included), on a fresh store whose thread
  drains concurrently.
- `durable_p50_ms`, `durable_p99_ms`: events put at a paced rate (`paced_rate` per second for
  `paced_s` seconds) on a fresh store; an event's latency runs from just before its `put` to the
  end of the commit that holds it. Commit times come from the store's `on_commit` hook (called on
  the persistence thread once per batch), so nothing is added to `put` itself.

Warm-up: one small pass of each kind on a throwaway environment first. Throughput and enqueue
figures are medians over `repeats` interleaved repeats (sync, write-behind, enqueue, ...); the paced
pass runs once. The figures are only comparable with each other, within one run.
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestra_sup.bench.stats import nearest_rank
from orchestra_sup.state.store import Store

DB = "events"
TARGET_RATIO = 50.0
TARGET_ENQUEUE_P99_US = 20.0
WAIT_S = 120.0  # a commit that takes longer than this is a broken disk, not a slow one

Event = tuple[bytes, bytes]


def event_stream(n: int, value_bytes: int = 200, seed: int = 0) -> list[Event]:
    """`n` events: an 8-byte big-endian sequence key and a random-looking `value_bytes` value."""
    rng = random.Random(seed)
    return [(i.to_bytes(8, "big"), rng.randbytes(value_bytes)) for i in range(n)]


def run_persist(
    events: int = 20_000,
    *,
    sync_events: int | None = None,
    value_bytes: int = 200,
    repeats: int = 3,
    paced_rate: int = 5_000,
    paced_s: float = 1.0,
    base_dir: Path | None = None,
) -> dict[str, Any]:
    """Run the benchmark (see the module docstring) and return its report as plain data."""
    if sync_events is None:
        sync_events = min(events, max(500, events // 10))
    paced_n = max(1, int(paced_rate * paced_s))
    stream = event_stream(max(events, paced_n), value_bytes)
    base = Path(tempfile.mkdtemp(prefix="osup-persist-", dir=base_dir))
    runs = iter(range(1_000_000))

    def fresh() -> Path:
        return base / f"env{next(runs)}"

    try:
        _sync(fresh(), stream[: min(200, sync_events)])  # warm-up
        _write_behind(fresh(), stream[: min(2_000, events)])
        sync_rates, wb_rates, p50s, p99s = [], [], [], []
        for _ in range(repeats):
            sync_rates.append(_sync(fresh(), stream[:sync_events]))
            wb_rates.append(_write_behind(fresh(), stream[:events]))
            p50, p99 = _enqueue_latency(fresh(), stream[:events])
            p50s.append(p50)
            p99s.append(p99)
        durable_p50, durable_p99, achieved = _paced(fresh(), stream[:paced_n], paced_rate)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    sync_rate = statistics.median(sync_rates)
    wb_rate = statistics.median(wb_rates)
    ratio = wb_rate / sync_rate
    enqueue_p99 = statistics.median(p99s)
    return {
        "sync": {"events_per_s": round(sync_rate, 1)},
        "write_behind": {
            "events_per_s": round(wb_rate, 1),
            "enqueue_p50_us": round(statistics.median(p50s), 3),
            "enqueue_p99_us": round(enqueue_p99, 3),
            "durable_p50_ms": round(durable_p50, 3),
            "durable_p99_ms": round(durable_p99, 3),
        },
        "ratio": round(ratio, 1),
        "targets": {
            "ratio_min": TARGET_RATIO,
            "enqueue_p99_us_max": TARGET_ENQUEUE_P99_US,
            "met": ratio >= TARGET_RATIO and enqueue_p99 <= TARGET_ENQUEUE_P99_US,
        },
        "method": {
            "events": events,
            "sync_events": sync_events,
            "value_bytes": value_bytes,
            "repeats": repeats,
            "statistic": "median of interleaved repeats (sync, write-behind, enqueue)",
            "warm_up": f"{min(200, sync_events)} sync + {min(2_000, events)} write-behind "
            "events on a throwaway environment, not counted",
            "paced_rate_per_s": paced_rate,
            "paced_events": paced_n,
            "paced_achieved_per_s": round(achieved, 1),
            "durable": "from just before put to the end of the commit holding the event "
            "(Store on_commit hook, once per batch)",
            "sync_mode": "LMDB sync=True, metasync=True: every commit fsynced",
            "compare": "figures are comparable only within one run",
        },
    }


def format_table(report: dict[str, Any]) -> str:
    """The report as a small table for people."""
    wb, m = report["write_behind"], report["method"]
    rows = [
        (
            "sync, 1 txn per event",
            f"{m['sync_events']:,} events",
            f"{report['sync']['events_per_s']:,.0f}/s",
        ),
        ("write-behind", f"{m['events']:,} events", f"{wb['events_per_s']:,.0f}/s"),
        ("ratio", "", f"{report['ratio']:,.1f}x"),
        (
            "enqueue p50 / p99",
            "hot path",
            f"{wb['enqueue_p50_us']:.2f} / {wb['enqueue_p99_us']:.2f} µs",
        ),
        (
            "enqueue-to-durable p50 / p99",
            f"{m['paced_achieved_per_s']:,.0f}/s paced",
            f"{wb['durable_p50_ms']:.2f} / {wb['durable_p99_ms']:.2f} ms",
        ),
    ]
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{a:<{width[0]}}  {b:<{width[1]}}  {c:>{width[2]}}" for a, b, c in rows]
    t = report["targets"]
    verdict = "met" if t["met"] else "NOT met"
    lines.append(
        f"targets (ratio >= {t['ratio_min']:g}, enqueue p99 <= {t['enqueue_p99_us_max']:g} µs): "
        f"{verdict}; median of {m['repeats']} interleaved repeats, compare within this run only"
    )
    return "\n".join(lines)


# --- the passes -----------------------------------------------------------------------------------


def _sync(path: Path, stream: list[Event]) -> float:
    """Events/s writing one synced transaction per event."""
    store = Store(path, [DB])  # the store's environment settings, no thread in the way
    env = store.env
    dbi = env.open_db(DB.encode())
    try:
        started = time.perf_counter_ns()
        for key, value in stream:
            with env.begin(write=True) as txn:
                txn.put(key, value, db=dbi)
        elapsed = time.perf_counter_ns() - started
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)
    return len(stream) / (elapsed / 1e9)


class _Commits:
    """The `on_commit` hook: (writes committed so far, perf_counter_ns) per commit, and an event
    set once `target` writes are committed."""

    def __init__(self, target: int):
        self.target = target
        self.marks: list[tuple[int, int]] = []
        self.done = threading.Event()

    def __call__(self, committed: int) -> None:
        self.marks.append((committed, time.perf_counter_ns()))
        if committed >= self.target:
            self.done.set()

    def wait(self) -> None:
        if not self.done.wait(WAIT_S):
            raise RuntimeError(f"the persistence thread committed nothing for {WAIT_S:g} s")


def _with_store(path: Path, n: int, body: Callable[[Store], None]) -> _Commits:
    commits = _Commits(n)
    store = Store(path, [DB], on_commit=commits)
    store.start()
    try:
        body(store)
        commits.wait()
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)
    return commits


def _write_behind(path: Path, stream: list[Event]) -> float:
    """Events/s from the first enqueue to the commit that holds the last event."""
    started = 0

    def body(store: Store) -> None:
        nonlocal started
        put = store.put
        started = time.perf_counter_ns()
        for key, value in stream:
            put(DB, key, value)

    commits = _with_store(path, len(stream), body)
    finished = next(t for n, t in commits.marks if n >= len(stream))
    return len(stream) / ((finished - started) / 1e9)


def _enqueue_latency(path: Path, stream: list[Event]) -> tuple[float, float]:
    """p50 and p99 in µs of one `put`, timed with perf_counter_ns around each call."""
    lat = [0] * len(stream)

    def body(store: Store) -> None:
        put, clock = store.put, time.perf_counter_ns
        for i, (key, value) in enumerate(stream):
            t0 = clock()
            put(DB, key, value)
            lat[i] = clock() - t0

    _with_store(path, len(stream), body)
    return nearest_rank(lat, 0.50) / 1e3, nearest_rank(lat, 0.99) / 1e3


def _paced(path: Path, stream: list[Event], rate: int) -> tuple[float, float, float]:
    """p50 and p99 in ms from enqueue to durable at `rate` events/s, and the rate achieved."""
    enqueued = [0] * len(stream)
    interval_ns = 1e9 / rate
    span = 0

    def body(store: Store) -> None:
        nonlocal span
        put, clock = store.put, time.perf_counter_ns
        start = clock()
        for i, (key, value) in enumerate(stream):
            ahead = start + int(i * interval_ns) - clock()
            if ahead > 0:
                time.sleep(ahead / 1e9)  # pacing, not synchronisation
            enqueued[i] = clock()
            put(DB, key, value)
        span = clock() - start

    commits = _with_store(path, len(stream), body)
    latencies = []
    marks = iter(commits.marks)
    committed, at = next(marks)
    for i, t in enumerate(enqueued):
        while committed < i + 1:  # the first commit whose running count covers event i
            committed, at = next(marks)
        latencies.append(at - t)
    achieved = len(stream) / (span / 1e9) if span else float(rate)
    return nearest_rank(latencies, 0.50) / 1e6, nearest_rank(latencies, 0.99) / 1e6, achieved

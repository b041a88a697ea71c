"""Durability of the state plane across SIGKILL, SIGTERM and coordinator crashes.

The first two tests run a small writer (a real `Store` in its own process) and look at its LMDB
environment afterwards from this process; the third runs a real tree and kills its coordinator
again and again while lanes deliver their results.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest

from orchestra_sup.coordinator.planstore import read_plan
from orchestra_sup.coordinator.runner import PlanRecord, TaskStatus
from tests.integration.harness import Tree, plan, task, wait_until

pytestmark = pytest.mark.integration

# Acknowledges a durable write (prints its key) only when its future resolves; every durable write
# is followed by 50 plain ones, so batches are thousands of writes and a kill lands mid-batch.
ACK_WRITER = """
import asyncio, sys
from pathlib import Path
from orchestra_sup.state.store import Store

async def main(path, first):
    store = Store(Path(path), ["events"])
    store.start()
    out = sys.stdout

    def ack(fut, k):
        if not fut.cancelled() and fut.exception() is None:
            out.write(k + "\\n")
            out.flush()

    inflight = set()
    i = first
    print("ready", flush=True)
    while True:
        for _ in range(20):
            k = f"{i:012d}"
            i += 1
            fut = store.put_durable("events", k.encode(), b"x" * 200)
            fut.add_done_callback(lambda f, k=k: ack(f, k))
            inflight.add(fut)
            for j in range(50):
                store.put("events", f"{k}.{j:02d}".encode(), b"y" * 200)
        if len(inflight) > 200:
            _, inflight = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""

# Enqueues plain writes as fast as it can until SIGTERM; its handler closes the store (which
# flushes), then it prints how many it enqueued and how many were still queued at the stop.
TERM_WRITER = """
import asyncio, signal, sys
from pathlib import Path
from orchestra_sup.state.store import Store

async def main(path):
    store = Store(Path(path), ["events"])
    store.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    n = 0
    reported = False
    while not stop.is_set():
        for _ in range(1000):
            store.put("events", n.to_bytes(8, "big"), b"z" * 200)
            n += 1
        if n >= 50_000 and not reported:
            print("writing", flush=True)
            reported = True
        await asyncio.sleep(0)
    backlog = store.queue_depth
    store.close()
    print(n, backlog, flush=True)

asyncio.run(main(sys.argv[1]))
"""


def writer(tmp_path: Path, script: str, *args: str) -> subprocess.Popen[str]:
    path = tmp_path / "writer.py"
    path.write_text(script)
    return subprocess.Popen(
        [sys.executable, str(path), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )


def committed_keys(path: Path, db: str) -> set[bytes]:
    env = lmdb.open(str(path), readonly=True, max_dbs=4, lock=False)
    try:
        dbi = env.open_db(db.encode(), create=False)
        with env.begin(db=dbi) as txn:
            return {bytes(k) for k in txn.cursor().iternext(keys=True, values=False)}
    finally:
        env.close()


def test_sigkill_mid_batch_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """Three times: a writer acknowledges durable writes as their futures resolve and is
    SIGKILLed at a random point while it writes; every key it acknowledged, in every round, is
    in the environment afterwards (which also reopens cleanly after each crash)."""
    state = tmp_path / "state"
    rng = random.Random()
    acked: set[bytes] = set()
    for round_ in range(3):
        proc = writer(tmp_path, ACK_WRITER, str(state), str(round_ * 10**9))
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready", proc.stderr
            kill_after = rng.randint(300, 1500)
            for _ in range(kill_after):
                line = proc.stdout.readline()
                assert line, f"writer exited early: {proc.stderr.read()}"  # type: ignore[union-attr]
                acked.add(line.strip().encode())
            proc.kill()
            rest, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        acked.update(line.encode() for line in rest.split())
        keys = committed_keys(state, "events")
        missing = acked - keys
        assert not missing, f"round {round_}: {len(missing)} acknowledged keys lost"
    assert len(acked) >= 900


def test_sigterm_flushes_what_was_queued_before_the_stop(tmp_path: Path) -> None:
    """A writer enqueues plain writes until SIGTERM; its handler's close() flushes: exactly the
    writes it enqueued are on disk, none missing, although many were still queued at the stop."""
    state = tmp_path / "state"
    proc = writer(tmp_path, TERM_WRITER, str(state))
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    enqueued, backlog = (int(x) for x in out.split())
    assert backlog > 0, "nothing was left queued at the stop; the test proved nothing"
    keys = committed_keys(state, "events")
    assert keys == {i.to_bytes(8, "big") for i in range(enqueued)}


def plan_on_disk(state: Path, plan_id: str) -> PlanRecord | None:
    """The coordinator's committed record of `plan_id`, read beside the live coordinator."""
    env = lmdb.open(str(state / "coordinator"), readonly=True, max_dbs=8)
    try:
        return read_plan(env, plan_id)
    finally:
        env.close()


def test_coordinator_kill9_repeatedly_lands_each_lane_result_once(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """20 lanes finish one after another while the coordinator is SIGKILLed five times (each
    time after its replacement is up): every task succeeds on its first attempt, and after the
    tree is stopped the coordinator's inbox holds exactly one row per lane result."""
    config = tmp_path / "tree.toml"
    config.write_text("[supervisor]\nmax_restarts = 100\nmax_seconds = 60.0\nbackoff_max_s = 0.5\n")
    tree = tree_factory(workspace=repo, shards=2, lanes=10, config=config)
    gate = tmp_path / "gate"
    runs = tmp_path / "runs"
    tasks = [
        task(
            f"t{i:02d}",
            f"while [ ! -e {gate} ]; do sleep 0.02; done; sleep {0.15 * i:.2f}; "
            f"echo $ORCHESTRA_TASK >> {runs}",
        )
        for i in range(20)
    ]
    plan_id = tree.submit(plan("kill9", *tasks))

    def all_running_on_disk() -> bool:
        record = plan_on_disk(tree.state_dir, plan_id)
        return record is not None and all(
            t.status is TaskStatus.RUNNING for t in record.tasks.values()
        )

    # placements are written behind: wait until they are committed, so a kill cannot make the
    # coordinator forget a lane it started (that would be a second attempt, not this test's point)
    wait_until(all_running_on_disk, 30, "all 20 lanes recorded as running")
    gate.touch()
    for _ in range(5):
        before = tree.child("coordinator")
        assert before.pid is not None
        os.kill(before.pid, signal.SIGKILL)
        tree.wait_running("coordinator", before.generation + 1)
    report = tree.wait_plan(plan_id, timeout_s=60)
    assert report.ok, report
    assert all(t.attempts == 1 for t in report.tasks), report
    assert sorted(runs.read_text().split()) == sorted(t.id for t in tasks)
    assert tree.stop() == 0
    lanes = {t.lane for t in report.tasks}
    assert len(lanes) == 20
    assert committed_keys(tree.state_dir / "coordinator", "inbox") == {
        f"result:{lane}".encode() for lane in lanes
    }


def test_bench_persist_reports_both_sides_of_one_run(tmp_path: Path) -> None:
    """`bench persist --json` on a small stream: both rates, their ratio, the enqueue and
    enqueue-to-durable percentiles, and the method."""
    proc = subprocess.run(
        [sys.executable, "-m", "orchestra_sup", "bench", "persist", "--events", "2000", "--json"],
        capture_output=True,
        text=True,
        timeout=110,
        stdin=subprocess.DEVNULL,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    wb = report["write_behind"]
    assert report["sync"]["events_per_s"] > 0 and wb["events_per_s"] > 0
    assert report["ratio"] == pytest.approx(
        wb["events_per_s"] / report["sync"]["events_per_s"], 0.01
    )
    assert 0 < wb["enqueue_p50_us"] <= wb["enqueue_p99_us"]
    assert 0 < wb["durable_p50_ms"] <= wb["durable_p99_ms"]
    assert report["method"]["events"] == 2000 and report["method"]["repeats"] >= 1
    assert list(tmp_path.iterdir()) == [], "the benchmark left files behind"

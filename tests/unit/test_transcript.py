"""Tests for `orchestra_sup.shards.transcript.Transcript` over a real LMDB store in a temp dir."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from orchestra_sup.config import settings_from_mapping
from orchestra_sup.errors import ConfigError
from orchestra_sup.protocol import frames as f
from orchestra_sup.shards.transcript import DBS, ROWS_DB, Transcript
from orchestra_sup.state.store import Store


class Clock:
    """A wall clock the test moves by hand (seconds)."""

    def __init__(self, now: float = 1_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def run(
    tmp_path: Path,
    body: Callable[[Transcript], Awaitable[None]],
    retention_s: float = 3600.0,
    settle: bool = True,
    **kw: Any,
) -> None:
    """Run `body` with a started store at `tmp_path/state` and an opened transcript over it
    (settled, as a shard that is the only generation of its name: `close_lost` ran, unless
    `settle` is false); both are closed afterwards (the store flushes)."""

    async def main() -> None:
        store = Store(tmp_path / "state", ["outbox", *DBS])
        store.start()
        transcript = Transcript(store, **kw)
        try:
            await transcript.open(retention_s)
            if settle:
                await transcript.close_lost()
            await body(transcript)
        finally:
            await transcript.close()
            store.close()

    asyncio.run(main())


async def landed(t: Transcript) -> None:
    """Every write queued so far has committed (the store commits in queue order)."""
    await t.store.put_durable("outbox", b"barrier", b"")


async def read_all(t: Transcript, lane: str, limit: int = 1000) -> tuple[list[f.LogRow], bool]:
    """Page through `lane`'s transcript from the first row; the rows and the last `done`."""
    rows: list[f.LogRow] = []
    while True:
        chunk = await t.read(lane, after_seq=rows[-1].seq if rows else -1, limit=limit)
        assert chunk.found
        rows += chunk.rows
        if chunk.done or not chunk.rows:
            return rows, chunk.done


def test_rows_have_increasing_seq_per_lane_and_are_never_coalesced(tmp_path: Path) -> None:
    """Every chunk and event is its own row, numbered from 0 per lane; equal chunks stay two."""

    async def body(t: Transcript) -> None:
        t.begin("a-1")
        t.begin("a-10")  # a lane id that extends another must not mix rows with it
        t.event("a-1", "started")
        t.output("a-1", "stdout", b"same\n")
        t.output("a-10", "stdout", b"other\n")
        t.output("a-1", "stdout", b"same\n")
        t.output("a-1", "stderr", b"oops\n")
        t.end("a-1", "succeeded: exited with status 0")
        t.end("a-10", "succeeded: exited with status 0")
        expected = [
            (0, "event", "started"),
            (1, "stdout", "same\n"),
            (2, "stdout", "same\n"),
            (3, "stderr", "oops\n"),
            (4, "event", "succeeded: exited with status 0"),
        ]
        live = await t.read("a-1")  # still in memory, or already landed: the same rows
        assert [(r.seq, r.stream, r.data) for r in live.rows] == expected
        await landed(t)
        assert t.held("a-1") is None  # its end landed: it reads from LMDB now
        stored, done = await read_all(t, "a-1")
        assert done
        assert [(r.seq, r.stream, r.data) for r in stored] == expected
        assert [r.ts for r in stored] == sorted(r.ts for r in stored)
        other, _ = await read_all(t, "a-10")
        assert [(r.seq, r.data) for r in other] == [(0, "other\n"), (1, expected[-1][2])]

    run(tmp_path, body)


def test_an_event_is_one_line(tmp_path: Path) -> None:
    """A newline in an event's text (a multi-line command) is written as `\\n`: one line."""

    async def body(t: Transcript) -> None:
        t.begin("L")
        t.event("L", "started in /s: make\nmake check\r\n")
        t.end("L", "failed: two\rlines")
        chunk = await t.read("L")
        assert [r.data for r in chunk.rows] == [
            "started in /s: make\\nmake check\\n",
            "failed: two\\nlines",
        ]

    run(tmp_path, body)


def test_memory_tail_is_bounded_in_rows_and_bytes(tmp_path: Path) -> None:
    """A live lane keeps at most `tail_rows` rows and `tail_bytes` bytes (the newest row always)."""

    async def body(t: Transcript) -> None:
        t.begin("L")
        for i in range(500):
            t.output("L", "stdout", b"%09d\n" % i)
            held = t.held("L")
            assert held is not None and held[0] <= 8 and held[1] <= 100
        assert t.held("L") == (8, 80)
        t.output("L", "stdout", b"x" * 1000)
        assert t.held("L") == (1, 1000)
        t.end("L", "succeeded: exited with status 0")

    run(tmp_path, body, tail_rows=8, tail_bytes=100)


def test_live_read_of_rows_older_than_the_tail_waits_until_they_land(tmp_path: Path) -> None:
    """Rows older than the in-memory tail come from LMDB only after every queued row has landed:
    with commits held back, the read waits, and then returns every row, in order."""

    async def body(t: Transcript) -> None:
        store = t.store
        t.begin("L")
        await landed(t)
        blocker = store.env.begin(write=True)  # the persistence thread cannot commit meanwhile
        try:
            for i in range(40):
                t.output("L", "stdout", b"%d\n" % i)
            barrier_queued = asyncio.Event()
            put_durable = store.put_durable

            def spy(*args: Any) -> asyncio.Future[None]:
                barrier_queued.set()
                return put_durable(*args)

            store.put_durable = spy  # type: ignore[method-assign]
            reader = asyncio.create_task(t.read("L", after_seq=-1, limit=1000))
            queued = asyncio.create_task(barrier_queued.wait())
            await asyncio.wait({reader, queued}, return_when=asyncio.FIRST_COMPLETED)
            queued.cancel()
        finally:
            blocker.abort()
        chunk = await reader
        assert [r.data for r in chunk.rows] == [f"{i}\n" for i in range(40)]
        assert not chunk.done
        t.end("L", "succeeded: exited with status 0")

    run(tmp_path, body, tail_rows=4)


def test_a_waiting_follower_is_woken_by_new_rows_and_by_the_end(tmp_path: Path) -> None:
    """A long poll returns as soon as a row comes, and with `done` when the lane ends."""

    async def body(t: Transcript) -> None:
        t.begin("L")
        t.output("L", "stdout", b"one\n")
        follower = asyncio.create_task(t.read("L", after_seq=0, wait_s=60.0))
        await asyncio.sleep(0)  # let it park on the lane (no time passes)
        assert not follower.done()
        t.output("L", "stdout", b"two\n")
        chunk = await asyncio.wait_for(follower, 10.0)
        assert [(r.seq, r.data) for r in chunk.rows] == [(1, "two\n")]
        assert not chunk.done
        follower = asyncio.create_task(t.read("L", after_seq=1, wait_s=60.0))
        await asyncio.sleep(0)
        t.end("L", "cancelled: cancelled by request")
        chunk = await asyncio.wait_for(follower, 10.0)
        assert [(r.stream, r.data) for r in chunk.rows] == [
            ("event", "cancelled: cancelled by request")
        ]
        assert chunk.done

    run(tmp_path, body)


def test_a_finished_lane_reads_whole_after_the_store_is_reopened(tmp_path: Path) -> None:
    """Every row of a finished lane, far more than the tail, is read back from LMDB after a
    restart, in order and paged, ending with `done`."""
    chunks = [b"line %d\n" % (i % 7) for i in range(600)]

    async def write(t: Transcript) -> None:
        t.begin("L")
        t.event("L", "started in /sandbox: make")
        for i, chunk in enumerate(chunks):
            t.output("L", "stderr" if i % 5 == 0 else "stdout", chunk)
        t.end("L", "failed: exited with status 2")

    async def check(t: Transcript) -> None:
        assert t.held("L") is None
        rows, done = await read_all(t, "L", limit=97)
        assert done
        assert [r.seq for r in rows] == list(range(602))
        assert [r.data.encode() for r in rows[1:-1]] == chunks
        assert rows[0].data == "started in /sandbox: make"
        assert rows[-1].data == "failed: exited with status 2"
        streams = ["stderr" if i % 5 == 0 else "stdout" for i in range(600)]
        assert [r.stream for r in rows[1:-1]] == streams
        unknown = await t.read("nope")
        assert not unknown.found and not unknown.rows

    run(tmp_path, write)
    run(tmp_path, check)


def test_a_lane_left_running_by_a_dead_shard_is_closed_as_lost(tmp_path: Path) -> None:
    """A lane unfinished in LMDB when the shard opens gets a `lost` event and reads as done."""

    async def write(t: Transcript) -> None:
        t.begin("L")
        for i in range(37):
            t.output("L", "stdout", b"%d\n" % i)

    async def check(t: Transcript) -> None:
        rows, done = await read_all(t, "L")  # before the lost entry lands: rows, and done
        assert done and [r.seq for r in rows][:37] == list(range(37))
        await landed(t)
        rows, done = await read_all(t, "L")
        assert done
        assert [r.seq for r in rows] == list(range(38))
        assert rows[-1].stream == "event" and rows[-1].data.startswith("lost:")

    run(tmp_path, write)
    run(tmp_path, check)


def test_a_moved_lane_continues_its_transcript_without_a_gap(tmp_path: Path) -> None:
    """A lane detached by one generation and resumed by the next (same environment) reads as
    one transcript: seq 0..n without a gap, one `done`; the old generation no longer claims it."""

    async def body(t: Transcript) -> None:
        old = t
        old.begin("L")
        for i in range(300):  # more than the tail: the old rows must come from LMDB
            old.output("L", "stdout", b"%d\n" % i)
        started = old.started_at("L")
        assert started is not None
        next_seq, barrier = old.detach("L")
        old.output("L", "stdout", b"late\n")  # dropped: the lane is not here any more
        await barrier
        assert next_seq == 300
        gone = await old.read("L")
        assert not gone.found
        new = Transcript(t.store)  # the next generation's, over the same environment
        new.settled = True
        new.resume("L", next_seq, started)
        new.event("L", "resumed from generation 1")
        new.output("L", "stdout", b"after\n")
        new.end("L", "succeeded")
        rows, done = await read_all(new, "L", limit=64)
        assert done
        assert [r.seq for r in rows] == list(range(303))
        assert [r.data for r in rows[299:]] == [
            "299\n",
            "resumed from generation 1",
            "after\n",
            "succeeded",
        ]
        await new.close()

    run(tmp_path, body)


def test_an_unsettled_successor_leaves_a_predecessors_lanes_open(tmp_path: Path) -> None:
    """While a predecessor may still run a lane, the successor neither closes it as lost nor
    says it is done (a follower waits); `close_lost` then closes only what is not live here."""

    async def write(t: Transcript) -> None:
        for lane in ("running-there", "moved-here"):
            t.begin(lane)
            t.output(lane, "stdout", b"x\n")

    async def check(t: Transcript) -> None:
        assert not t.settled
        chunk = await t.read("running-there", after_seq=0, wait_s=0.05)
        assert chunk.found and not chunk.done and not chunk.rows
        t.resume("moved-here", 1, 0.0)
        assert await t.close_lost() == ["running-there"]
        await landed(t)
        rows, done = await read_all(t, "running-there")
        assert done and rows[-1].data.startswith("lost:")
        t.end("moved-here", "succeeded")
        rows, done = await read_all(t, "moved-here")
        assert done and [r.data for r in rows] == ["x\n", "succeeded"]

    run(tmp_path, write, settle=False)
    run(tmp_path, check, settle=False)


def test_retention_prunes_only_finished_lanes_older_than_the_setting(tmp_path: Path) -> None:
    """`prune(retention_s)` deletes every row and the entry of lanes that finished more than
    `retention_s` ago; a recently finished lane and a live lane, however old, stay."""
    clock = Clock(1_000.0)

    async def body(t: Transcript) -> None:
        for lane in ("old", "recent", "running"):
            t.begin(lane)
            t.output(lane, "stdout", b"hello\n")
            t.output(lane, "stdout", b"hello\n")
        t.end("old", "succeeded: exited with status 0")
        clock.now = 1_090.0
        t.end("recent", "succeeded: exited with status 0")
        await landed(t)
        clock.now = 1_100.0
        assert await t.prune(retention_s=50.0) == 1
        await landed(t)
        assert not (await t.read("old")).found
        assert not [k for k, _ in t.store.items(ROWS_DB) if k.startswith(b"old\x00")]
        assert len((await t.read("recent")).rows) == 3
        assert len((await t.read("running")).rows) == 2
        clock.now = 1_000_000.0
        assert await t.prune(retention_s=50.0) == 1  # "recent" now; never the running lane
        await landed(t)
        assert not (await t.read("recent")).found
        assert len((await t.read("running")).rows) == 2
        t.end("running", "succeeded: exited with status 0")

    run(tmp_path, body, clock=clock)


def test_open_prunes_what_expired_while_the_shard_was_down(tmp_path: Path) -> None:
    """Opening a transcript prunes finished lanes already past retention."""
    clock = Clock(1_000.0)

    async def write(t: Transcript) -> None:
        t.begin("L")
        t.output("L", "stdout", b"x\n")
        t.end("L", "succeeded: exited with status 0")

    async def check(t: Transcript) -> None:
        await landed(t)
        assert not (await t.read("L")).found
        assert not list(t.store.items(ROWS_DB))

    run(tmp_path, write, clock=clock)
    clock.now += 61.0
    run(tmp_path, check, clock=clock, retention_s=60.0)


@pytest.mark.parametrize("value", [-1, "7d", True])
def test_retention_setting_is_validated(value: object) -> None:
    """`[retention] transcripts_s` is a number of seconds >= 0; anything else is refused. The
    key's old home, `[lanes] transcript_retention_s`, is refused too."""
    assert settings_from_mapping({}).retention.transcripts_s == 7 * 24 * 3600
    zero = settings_from_mapping({"retention": {"transcripts_s": 0}})
    assert zero.retention.transcripts_s == 0.0
    with pytest.raises(ConfigError, match="transcripts_s"):
        settings_from_mapping({"retention": {"transcripts_s": value}})
    with pytest.raises(ConfigError, match=r"transcript_retention_s.*\[retention\] transcripts_s"):
        settings_from_mapping({"lanes": {"transcript_retention_s": 60}})


@pytest.mark.parametrize(
    "lane", ["", "x" * 600, "caf\udce9"], ids=["empty", "too-long", "not-utf8"]
)
def test_an_id_no_lane_can_have_is_not_found(tmp_path: Path, lane: str) -> None:
    """`ctl logs` of an empty, over-long or non-UTF-8 lane id is `found=False`, as any unknown
    lane, not an LMDB error answered `internal` (MDB_BAD_VALSIZE on main)."""

    async def body(t: Transcript) -> None:
        chunk = await t.read(lane)
        assert (chunk.found, chunk.rows, chunk.done) == (False, [], False)

    run(tmp_path, body)

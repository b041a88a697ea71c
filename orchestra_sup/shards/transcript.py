"""Lane transcripts: every output chunk and lane event of a shard's lanes, one row each.

A row is `(seq, ts, stream, data)`: `seq` counts a lane's rows from 0 with no gap, `ts` is the
wall-clock time it was recorded (seconds since the epoch, for people; never used for an interval),
`stream` is "stdout", "stderr" or "event", `data` the bytes as `run_shell`'s `on_output` delivered
them (at most 64 KiB) or an event's text. Rows are stored in the shard's own LMDB environment:

- db `transcript`: key = lane id, NUL, seq as 8 big-endian bytes (a lane's rows are contiguous and
  in seq order; a lane id never contains NUL, so `a-1` and `a-10` cannot interleave); value = a
  msgpack `StoredRow`.
- db `transcript_lanes`: key = lane id; value = a msgpack `LaneEntry` (when the lane started and
  finished, its last seq). Named apart from a future `lanes` db of live-lane state.

Writing is write-behind (`Store.put`): one row per chunk, batched by the persistence thread and
never coalesced (seeds/002: "two events stay two rows"; two identical chunks are two rows).

Reading never trusts the queue (ARCHITECTURE.md §5, §11 invariants 1-3): a live lane keeps its last
`TAIL_ROWS` rows (at most `TAIL_BYTES`) in memory, which answers `ctl logs --follow`; older rows and
finished lanes are read from LMDB on this module's own small thread pool, and a read of a live
lane's older rows first awaits a durable write of the lane's entry: the persistence thread commits
in queue order, so once that barrier has landed, every row queued before it has too. A finished
lane is dropped from memory only once its finished entry (queued after its last row) has landed.

A lane moving to the next generation of its shard (a rollover's drain) leaves this process's
transcript without an end (`detach`, which gives its next seq and a barrier for the rows already
queued), and continues in the next generation's (`resume`) at that seq, in the same LMDB
environment: one transcript, no gap, across both processes.

A lane still unfinished in LMDB and not live here belonged to a generation that is gone: the shard
closes it with a `lost` event row (`close_lost`) once it is the only generation of its name, never
while a predecessor still drains (whose live lanes are unfinished too). Finished lanes older than
`[retention] transcripts_s` are pruned (every row, then the entry) at open and every
`[retention] every_s` seconds (`ChildArgs.prune_every_s`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Literal, TypeVar

import msgspec

from orchestra_sup.errors import StateError
from orchestra_sup.protocol import frames as f
from orchestra_sup.state.store import MAX_KEY_BYTES, Store

log = logging.getLogger(__name__)

ROWS_DB = "transcript"
INDEX_DB = "transcript_lanes"
DBS = [ROWS_DB, INDEX_DB]
"""The LMDB dbs a `Transcript` needs in its `Store`."""

TAIL_ROWS = 256
"""Rows of a live lane kept in memory (the newest)."""
TAIL_BYTES = 1024 * 1024
"""Bytes of row data a live lane keeps in memory at most (the newest row is always kept)."""
CHUNK_BYTES = 2 * 1024 * 1024
"""Row data in one `LogChunk` at most (at least one row): a reply stays far below the 16 MiB frame
limit even when every byte decodes to a 3-byte replacement character."""
MAX_LIMIT = 10_000
"""Rows in one `LogChunk` at most, whatever the request's `limit`."""
READ_THREADS = 4
"""LMDB reads in flight at most; more wait their turn, off the loop."""
DELETE_SLICE = 4096
"""Deletes queued per loop turn while pruning, so a long transcript never stalls the loop."""

Stream = Literal["stdout", "stderr", "event"]
T = TypeVar("T")


class StoredRow(msgspec.Struct, frozen=True, kw_only=True):
    """One row as stored (the seq is in the key)."""

    ts: float
    stream: str
    data: bytes


class LaneEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A lane's index entry. `finished_at` is None while it runs (wall-clock seconds, as `ts`);
    `last_seq` is exact once finished (-1: no row), a lower bound before."""

    started_at: float
    finished_at: float | None = None
    last_seq: int = -1


def row_key(lane: str, seq: int) -> bytes:
    return lane.encode() + b"\x00" + seq.to_bytes(8, "big")


_Mem = tuple[int, float, str, bytes]
"""A row in memory: (seq, ts, stream, data)."""


class _Wakeup:
    """Wakes whoever waits, once: `wait` returns at the next `set()` or after its timeout. No
    event exists while nobody waits, so setting one nobody waits on costs nothing."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None

    def set(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` seconds for the next `set()`."""
        if self._event is None:
            self._event = asyncio.Event()
        event = self._event
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await event.wait()


class _Live:
    """A running lane: its next seq, its bounded tail, and who waits for its next row."""

    __slots__ = ("ended", "entry", "next_seq", "rows", "size", "wake")

    def __init__(self, started_at: float):
        self.entry = LaneEntry(started_at=started_at)
        self.next_seq = 0
        self.rows: deque[_Mem] = deque()
        self.size = 0
        self.ended = False
        self.wake = _Wakeup()  # set on each new row and at the lane's end

    def keep(self, row: _Mem, max_rows: int, max_bytes: int) -> None:
        self.rows.append(row)
        self.size += len(row[3])
        while len(self.rows) > max_rows or (self.size > max_bytes and len(self.rows) > 1):
            self.size -= len(self.rows.popleft()[3])
        self.wake.set()


class Transcript:
    """The transcripts of one shard's lanes over its `Store` (which must hold `DBS`).

    `begin`, `output`, `event` and `end` are for the loop and never block or raise; `read` is a
    coroutine for a task off the receive loop. `clock` gives wall-clock seconds (default
    `time.time`): timestamps and retention must mean the same across restarts, which a monotonic
    clock does not.
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], float] = time.time,
        tail_rows: int = TAIL_ROWS,
        tail_bytes: int = TAIL_BYTES,
    ):
        self.store = store
        self.clock = clock
        self.tail_rows = tail_rows
        self.tail_bytes = tail_bytes
        self._live: dict[str, _Live] = {}
        self._detached: set[str] = set()  # moved to another generation (`detach`)
        self.settled = False
        """True once `close_lost` ran: an unfinished lane not live here is then known to be
        lost; before, it may still run in a predecessor generation, or be on its way here."""
        self._arrival = _Wakeup()  # set on `resume` and `close_lost`
        self._encoder = msgspec.msgpack.Encoder()
        self._rows = msgspec.msgpack.Decoder(StoredRow)
        self._entries = msgspec.msgpack.Decoder(LaneEntry)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            READ_THREADS, thread_name_prefix="transcript"
        )

    # --- lifecycle (loop side) -------------------------------------------------------------------

    async def open(self, retention_s: float) -> None:
        """Prune. Call once, before serving. Raises `StateError` when LMDB cannot be read."""
        await self.prune(retention_s)

    async def close_lost(self) -> list[str]:
        """Close every lane unfinished in LMDB and not live here (a gone generation's) with a
        `lost` event row; returns their ids. Call once no other generation of this shard runs:
        a draining predecessor's lanes are unfinished too. Raises `StateError` when LMDB cannot
        be read."""
        here = set(self._live)  # taken before the scan: a lane that ends meanwhile is kept
        lost = await self._off_loop(self._find_lost)
        closed = []
        for lane, entry, last in lost:
            if lane in here or lane in self._live:
                continue
            # Not awaited: a shard whose disk is failing still starts. Until these land, a read
            # of such a lane gives its rows up to the first missing one, and `done`.
            ts = self.clock()
            text = "lost: the shard process ended while the lane ran"
            self._put_row(lane, last + 1, ts, "event", text.encode())
            done = LaneEntry(started_at=entry.started_at, finished_at=ts, last_seq=last + 1)
            self._queue(INDEX_DB, lane.encode(), self._encoder.encode(done))
            closed.append(lane)
        self.settled = True
        self._arrival.set()
        return closed

    async def close(self) -> None:
        """Let reads in flight finish (they hold LMDB transactions) and refuse new ones. Call
        before the store is closed."""
        await asyncio.to_thread(self._pool.shutdown, True)

    async def prune_every(self, retention_s: float, every_s: float) -> None:
        """Prune every `every_s` seconds, for ever (a task the shard owns)."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.prune(retention_s)
            except StateError as exc:
                log.error("transcript: prune failed: %s", exc)

    async def prune(self, retention_s: float) -> int:
        """Delete every finished lane that finished more than `retention_s` seconds ago (its
        rows, then its entry, so an interrupted prune is finished by the next); returns how many.
        Live lanes are never pruned. The index is scanned off the loop; the deletes go through
        the store's queue, in the persistence thread's order."""
        cutoff = self.clock() - retention_s
        entries = await self._off_loop(self._scan)
        expired = [
            (lane, e)
            for lane, e in entries
            if e.finished_at is not None and e.finished_at < cutoff and lane not in self._live
        ]
        queued = 0
        for lane, entry in expired:
            for seq in range(entry.last_seq + 1):
                self.store.delete(ROWS_DB, row_key(lane, seq))
                queued += 1
                if queued % DELETE_SLICE == 0:
                    await asyncio.sleep(0)  # let the loop serve between slices
            self.store.delete(INDEX_DB, lane.encode())
        if expired:
            log.info("transcript: pruned %d finished lane(s)", len(expired))
        return len(expired)

    # --- writing (loop side) ---------------------------------------------------------------------

    def begin(self, lane: str) -> None:
        """Register `lane` as live (before its first row). A lane begun twice keeps its rows."""
        if lane in self._live:
            return
        live = self._live[lane] = _Live(self.clock())
        self._queue(INDEX_DB, lane.encode(), self._encoder.encode(live.entry))

    def resume(self, lane: str, next_seq: int, started_at: float) -> None:
        """Register `lane`, moved here from another generation, as live again: its rows go on
        at `next_seq` (the rows before it are in LMDB already: `detach`'s barrier). `started_at`
        is when it first began (wall-clock seconds). A lane already live here is left as it
        is."""
        if lane in self._live:
            return
        self._detached.discard(lane)
        live = self._live[lane] = _Live(started_at)
        live.next_seq = next_seq
        live.entry = LaneEntry(started_at=started_at, last_seq=next_seq - 1)
        self._arrival.set()

    def detach(self, lane: str) -> tuple[int, asyncio.Future[None]]:
        """`lane` moves to another generation: it leaves memory here without an end, and rows
        for it are dropped from now on. Returns its next seq and a future that resolves once
        every row queued for it here has landed (a durable write of its still unfinished
        entry: the persistence thread commits in queue order). Raises `KeyError` when `lane` is
        not live here, `StateError` when the store is closed."""
        live = self._live.pop(lane)
        self._detached.add(lane)
        live.ended = True
        live.wake.set()  # a follower re-reads: from LMDB, or from the next generation
        entry = LaneEntry(started_at=live.entry.started_at, last_seq=live.next_seq - 1)
        landed = self.store.put_durable(INDEX_DB, lane.encode(), self._encoder.encode(entry))
        return live.next_seq, landed

    def started_at(self, lane: str) -> float | None:
        """When live lane `lane` began (wall-clock seconds); None when it is not live here."""
        live = self._live.get(lane)
        return None if live is None else live.entry.started_at

    def output(self, lane: str, stream: str, chunk: bytes) -> None:
        """One chunk of the lane's command output, as it came: one row."""
        self._append(lane, stream, bytes(chunk))

    def event(self, lane: str, text: str) -> None:
        """One lane event: one row on stream "event", one line (a newline in `text` is written
        as the two characters `\\n`)."""
        self._append(lane, "event", _one_line(text))

    def end(self, lane: str, text: str) -> None:
        """The lane's last row (an event), then its finished entry, written durably; the lane
        leaves memory once that entry has landed, and reads then go to LMDB."""
        live = self._live.get(lane)
        if live is None or live.ended:
            return
        self._append(lane, "event", _one_line(text))
        live.ended = True
        live.entry = LaneEntry(
            started_at=live.entry.started_at,
            finished_at=self.clock(),
            last_seq=live.next_seq - 1,
        )
        try:
            landed = self.store.put_durable(
                INDEX_DB, lane.encode(), self._encoder.encode(live.entry)
            )
        except StateError as exc:  # the store is closed: nothing more lands
            log.error("transcript of lane %s: end not persisted: %s", lane, exc)
            del self._live[lane]
        else:
            landed.add_done_callback(functools.partial(self._landed, lane, live))
        live.wake.set()

    def _landed(self, lane: str, live: _Live, landed: asyncio.Future[None]) -> None:
        if not landed.cancelled() and landed.exception() is not None:
            log.error("transcript of lane %s: end not persisted: %s", lane, landed.exception())
        if self._live.get(lane) is live:
            del self._live[lane]

    def _append(self, lane: str, stream: str, data: bytes) -> None:
        live = self._live.get(lane)
        if live is None or live.ended:
            log.warning("transcript: row for lane %s that is not running, dropped", lane)
            return
        seq = live.next_seq
        live.next_seq += 1
        ts = self.clock()
        self._put_row(lane, seq, ts, stream, data)
        live.keep((seq, ts, stream, data), self.tail_rows, self.tail_bytes)

    def _put_row(self, lane: str, seq: int, ts: float, stream: str, data: bytes) -> None:
        row = StoredRow(ts=ts, stream=stream, data=data)
        self._queue(ROWS_DB, row_key(lane, seq), self._encoder.encode(row))

    def _queue(self, db: str, key: bytes, value: bytes) -> None:
        try:
            self.store.put(db, key, value)
        except StateError as exc:  # closed: a lane's last words after its shard's store closed
            log.error("transcript: row not persisted: %s", exc)

    def held(self, lane: str) -> tuple[int, int] | None:
        """(rows, bytes of data) the live lane `lane` holds in memory; None when it is not live."""
        live = self._live.get(lane)
        return None if live is None else (len(live.rows), live.size)

    # --- reading ---------------------------------------------------------------------------------

    async def read(
        self, lane: str, *, after_seq: int = -1, limit: int = 1000, wait_s: float = 0.0
    ) -> f.LogChunk:
        """The lane's rows after `after_seq`, oldest first, at most `limit` (1..`MAX_LIMIT`) and
        about `CHUNK_BYTES` of data. With `wait_s` > 0 and no such row yet, waits up to `wait_s`
        seconds for one (or for the lane's end). `done` is true when the lane has ended and the
        chunk reaches its last row; `found` is false for a lane this shard does not know (never
        ran here, or pruned), and for an id no lane can have (empty, not UTF-8, or too long
        for a row key). Raises `StateError` when LMDB cannot be read or written."""
        after_seq = max(-1, after_seq)
        limit = max(1, min(limit, MAX_LIMIT))
        if (
            not _could_be_lane(lane) or lane in self._detached
        ):  # moved on: the next generation answers for it
            return f.LogChunk(lane=lane, rows=[], done=False, found=False)
        live = self._live.get(lane)
        if live is not None and wait_s > 0 and not live.ended and live.next_seq - 1 <= after_seq:
            await live.wake.wait(wait_s)
            live = self._live.get(lane)  # its end may have landed meanwhile
        if live is not None:
            return await self._read_live(lane, live, after_seq, limit)
        settled = self.settled
        chunk = await self._off_loop(self._read_finished, lane, after_seq, limit, settled)
        if chunk.rows or chunk.done or not chunk.found or wait_s <= 0:
            return chunk
        # Unfinished, not live, and a predecessor may still run it (or be sending it here): its
        # rows come from that process, so wait for the lane to arrive or the shard to settle.
        await self._arrival.wait(wait_s)
        return await self.read(lane, after_seq=after_seq, limit=limit)

    async def _read_live(self, lane: str, live: _Live, after_seq: int, limit: int) -> f.LogChunk:
        first = live.rows[0][0] if live.rows else live.next_seq
        rows: list[f.LogRow] = []
        if after_seq + 1 < first:
            # Older than the tail: from LMDB, once every row queued so far has landed.
            upto = live.next_seq
            if not live.ended:  # the entry also keeps a lower bound of the last seq
                live.entry = msgspec.structs.replace(live.entry, last_seq=upto - 1)
            await self.store.put_durable(INDEX_DB, lane.encode(), self._encoder.encode(live.entry))
            rows, _ = await self._off_loop(self._read_rows, lane, after_seq, limit, upto)
            if not rows:
                # Only a prune could take rows below the barrier; nothing older to give.
                return f.LogChunk(lane=lane, rows=[], done=live.ended, found=True)
        last = rows[-1].seq if rows else after_seq
        newer = (_wire(*r) for r in live.rows if r[0] > last)
        rows = _extend(rows, newer, limit, last)
        last = rows[-1].seq if rows else after_seq
        return f.LogChunk(
            lane=lane, rows=rows, done=live.ended and last >= live.next_seq - 1, found=True
        )

    # --- the read threads ------------------------------------------------------------------------

    async def _off_loop(self, fn: Callable[..., T], *args: object) -> T:
        try:
            job = self._pool.submit(fn, *args)
        except RuntimeError as exc:  # the pool was shut down: the shard is stopping
            raise StateError("transcripts are closed: the shard is stopping") from exc
        return await asyncio.wrap_future(job)

    def _read_finished(self, lane: str, after_seq: int, limit: int, settled: bool) -> f.LogChunk:
        raw = self._get(INDEX_DB, lane.encode())
        if raw is None:
            return f.LogChunk(lane=lane, rows=[], done=False, found=False)
        entry = self._entries.decode(raw)
        # Not live and unfinished: once settled, a dead generation's lane whose `lost` entry has
        # not landed; before, maybe a lane a draining predecessor still runs.
        upto = None if entry.finished_at is None else entry.last_seq + 1
        rows, exhausted = self._read_rows(lane, after_seq, limit, upto)
        done = exhausted and (settled or entry.finished_at is not None)
        return f.LogChunk(lane=lane, rows=rows, done=done, found=True)

    def _read_rows(
        self, lane: str, after_seq: int, limit: int, upto: int | None
    ) -> tuple[list[f.LogRow], bool]:
        """Rows after `after_seq` and below `upto` (None: until one is missing), within `limit`
        and `CHUNK_BYTES`; and whether they reach the end (nothing more to read below `upto`)."""
        rows: list[f.LogRow] = []
        size = 0
        seq = after_seq + 1
        while upto is None or seq < upto:
            raw = self._get(ROWS_DB, row_key(lane, seq))
            if raw is None:
                return rows, True
            row = self._rows.decode(raw)
            if len(rows) >= limit or (rows and size + len(row.data) > CHUNK_BYTES):
                return rows, False
            rows.append(_wire(seq, row.ts, row.stream, row.data))
            size += len(row.data)
            seq += 1
        return rows, True

    def _find_lost(self) -> list[tuple[str, LaneEntry, int]]:
        """Unfinished entries (a dead generation's lanes) with their last stored seq."""
        return [
            (lane, e, self._last_seq(lane, e.last_seq))
            for lane, e in self._scan()
            if e.finished_at is None
        ]

    def _last_seq(self, lane: str, known: int) -> int:
        """The last stored seq of `lane`, given one that is stored (or -1). Rows are contiguous
        from 0 (the persistence thread commits in order, a crash loses a suffix at most), so a
        galloping then binary search finds it in O(log n) reads."""
        low, step = known, 1
        while self._get(ROWS_DB, row_key(lane, low + step)) is not None:
            low += step
            step *= 2
        high = low + step  # missing
        while high - low > 1:
            mid = (low + high) // 2
            if self._get(ROWS_DB, row_key(lane, mid)) is None:
                high = mid
            else:
                low = mid
        return low

    def _scan(self) -> list[tuple[str, LaneEntry]]:
        entries = []
        for key, value in self.store.items(INDEX_DB):
            try:
                entries.append((key.decode(), self._entries.decode(value)))
            except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                log.error("transcript: unreadable entry %r skipped: %s", key, exc)
        return entries

    def _get(self, db: str, key: bytes) -> bytes | None:
        try:
            return self.store.get(db, key)
        except Exception as exc:  # lmdb.Error and its kin: the environment is unusable
            raise StateError(f"state {self.store.path}: read failed: {exc}") from exc


def _one_line(text: str) -> bytes:
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\\n").encode()


def _could_be_lane(lane: str) -> bool:
    """Whether `lane` fits a transcript key: 1 byte or more of UTF-8, short enough that the row
    key (`lane`, a NUL, 8 bytes of sequence number) is one LMDB takes."""
    try:
        size = len(lane.encode())
    except UnicodeEncodeError:
        return False
    return 0 < size <= MAX_KEY_BYTES - 9


def _wire(seq: int, ts: float, stream: str, data: bytes) -> f.LogRow:
    # Each row is decoded on its own: a character split across two chunks shows as U+FFFD.
    kind: Stream = stream if stream in ("stdout", "stderr") else "event"  # type: ignore[assignment]
    return f.LogRow(seq=seq, ts=ts, stream=kind, data=data.decode("utf-8", errors="replace"))


def _extend(
    rows: list[f.LogRow], more: Iterable[f.LogRow], limit: int, last: int
) -> list[f.LogRow]:
    """`rows` and then those of `more` that continue seq `last` without a gap, while within
    `limit` rows and `CHUNK_BYTES` of data (the first row always fits)."""
    size = sum(len(r.data) for r in rows)
    for row in more:
        if len(rows) >= limit or row.seq != last + 1:
            break
        if rows and size + len(row.data) > CHUNK_BYTES:
            break
        rows.append(row)
        size += len(row.data)
        last = row.seq
    return rows

"""One LMDB environment per process, written behind the event loop by one persistence thread.

Handlers call `put`/`delete`/`append` and go on: the write is queued (O(1), no future, no lock
beyond the queue's own) and the persistence thread drains the queue into one transaction per
batch. Batching, never coalescing (seeds/002, "Batching only, never coalescing"): every queued
write becomes its own operation, in queue order, in the batch's transaction; two appends stay two
rows even with the same key and value, two puts to one key leave the last value. `put_durable`
returns a future that resolves only after the transaction holding its write has committed, for
operations whose failure a user must see (plan submission, inbox entries that are acknowledged
after commit).

Durability: the environment is opened with LMDB's default `sync=True, metasync=True`, so
`mdb_txn_commit` fsyncs the data pages and then the meta page before it returns. A batch whose
commit returned is on disk; a process killed (SIGKILL) at any moment loses at most writes whose
batch had not committed, none of which was acknowledged (`put_durable` futures are settled after
the commit returns, never before).

Failures (full disk, I/O error): a batch whose commit fails is never dropped. The thread keeps it,
and everything queued after it stays queued behind it in order; it retries with a backoff
(`retry_initial_s` doubling to `retry_max_s`) until a commit succeeds. Meanwhile `degraded` is a
`StateError` naming the path and the OS error, `check_writable()` raises it so owners refuse new
work, and the failed batch's `put_durable` futures stay pending. The first commit that succeeds
clears `degraded`: new work is accepted again without a restart. A full map is not a failure:
`MapFullError` doubles the map and the batch is retried at once.

Two processes may hold one environment at once (a shard's old and new generation during a
rollover's surge): LMDB lets one write transaction in at a time across processes, so `append`'s
sequence, read and bumped inside the write transaction, stays unique. When the other process has
grown the map, this one's next transaction fails with `MapResizedError`; the store then adopts the
new size (`set_mapsize(0)`, with no transaction of its own open) and retries, for reads and writes.

Reads at start-up come straight from LMDB (`items`, `rows`, `get`); after that, owners answer from
their in-memory projections, never from the queue, which may not have landed. Shutdown (`close`,
which owners call on SIGTERM and `ctl stop`) flushes the queue before it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import lmdb

from orchestra_sup.errors import StateError
from orchestra_sup.histogram import BATCH_BOUNDS_ROWS, Buckets
from orchestra_sup.state.permissions import PRIVATE_FILE, private_dir

log = logging.getLogger(__name__)

_STOP = object()
# A queued write is a plain tuple (kind, dbi, key, value, future-or-None): the cheapest thing to
# build on the hot path. `value` is None for a delete.
_PUT, _DELETE, _APPEND, _DELETE_PREFIX = 0, 1, 2, 3
_Write = tuple[int, Any, bytes, bytes | None, "asyncio.Future[None] | None"]

_T = TypeVar("_T")

_META_DB = "__meta__"
_SEQ_KEY = b"append_seq"  # the last sequence number `append` handed out (8 bytes, big-endian)
SEQ_BYTES = 8

DEFAULT_MAP_SIZE = 64 * 1024 * 1024
MAX_BATCH = 10_000


class Store:
    """An LMDB environment at `path` with named databases `dbs`, written by one thread.

    `map_size` is the initial map in bytes (default 64 MiB; it doubles when full). A failed commit
    is retried after `retry_initial_s`, doubling up to `retry_max_s`. A batch holds at most
    `max_batch` writes. `on_commit`, if given, is called on the persistence thread after every
    commit, before its writers are told, with the number of writes committed so far (for
    measurement; it must be quick).
    `thread_start`, if given, is called first thing on the persistence thread (the coordinator
    puts it in real time there, one below its loop: `cpupolicy.same_class`).
    `on_degraded`, an attribute an owner may set, is called on the store's loop whenever
    `degraded` changes: with the `StateError` when commits start failing, with None when one
    succeeds again (an owner that refused work can resume it then).
    The directory is made 0700 and its files 0600 (`state.permissions`), an existing one's too.
    Raises `StateError` when the environment cannot be opened (another process holds it, or the
    directory is unusable, or not this uid's to chmod).

    Counters (read from any thread; approximate while the thread runs): `batches` (commits),
    `writes` (writes committed), `last_batch` (writes in the last commit), `failures` (failed
    commit attempts), `grows` (map doublings), `adopted` (map sizes taken over from another
    process that grew it), and `queue_depth`; `batch_rows` counts the writes of every commit
    into buckets (`histogram.BATCH_BOUNDS_ROWS`), for the metrics.
    """

    def __init__(
        self,
        path: Path,
        dbs: list[str],
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        retry_initial_s: float = 0.2,
        retry_max_s: float = 5.0,
        max_batch: int = MAX_BATCH,
        on_commit: Callable[[int], None] | None = None,
        thread_start: Callable[[], None] | None = None,
    ):
        if _META_DB in dbs:
            raise ValueError(f"{_META_DB!r} is reserved")
        try:
            private_dir(path)
            # LMDB's defaults, spelled out: a commit is on disk (fsynced) when it returns. Its
            # files are the tree's alone (`state.permissions`), those an older release made too.
            self.env = lmdb.open(
                str(path),
                map_size=map_size,
                max_dbs=len(dbs) + 2,
                sync=True,
                metasync=True,
                mode=PRIVATE_FILE,
            )
            for name in ("data.mdb", "lock.mdb"):
                os.chmod(path / name, PRIVATE_FILE)
        except (lmdb.Error, OSError) as exc:
            raise StateError(f"cannot open state {path}: {exc}") from exc
        self.path = path
        self._dbs = {name: self.env.open_db(name.encode()) for name in dbs}
        self._meta = self.env.open_db(_META_DB.encode())
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._enqueue = self._queue.put
        self._loop: asyncio.AbstractEventLoop | None = None
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._max_batch = max_batch
        self._on_commit = on_commit
        self._thread_start = thread_start
        # set_mapsize must not run while this process has a transaction open (it remaps): reads
        # hold `_remap`, the write transaction holds `_writing`; adopting a size takes both,
        # always `_writing` first.
        self._remap = threading.Lock()
        self._writing = threading.Lock()
        self._wake = threading.Event()  # cuts a retry backoff short (close)
        self._closed = False
        self._abandon = False
        # A daemon, so a process that fails before `close()` exits instead of hanging on it;
        # every orderly path calls `close()`, which flushes.
        self._thread = threading.Thread(
            target=self._drain, name=f"persist:{path.name}", daemon=True
        )
        self.degraded: StateError | None = None
        # called with the new `degraded` (a StateError, or None once a commit succeeds again)
        self.on_degraded: Callable[[StateError | None], None] | None = None
        self.batches = 0
        self.writes = 0
        self.last_batch = 0
        self.failures = 0
        self.grows = 0
        self.adopted = 0
        self.batch_rows = Buckets(BATCH_BOUNDS_ROWS)

    def start(self) -> None:
        """Start the persistence thread. Called on a running loop, `put_durable` futures resolve
        on that loop; without one, `put_durable` is unavailable (the rest works)."""
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        if self._thread.ident is None:
            self._thread.start()

    # --- the loop side ---------------------------------------------------------------------------

    def put(self, db: str, key: bytes, value: bytes) -> None:
        """Queue a write and return at once (the hot path: one tuple and one queue put).
        Raises `ValueError` for a key LMDB cannot hold (`check_key`)."""
        if self._closed:
            raise self._closed_error()
        check_key(key)
        self._enqueue((_PUT, self._dbs[db], key, value, None))

    def delete(self, db: str, key: bytes) -> None:
        """Queue a delete and return at once. Raises `ValueError` as `put` does."""
        if self._closed:
            raise self._closed_error()
        check_key(key)
        self._enqueue((_DELETE, self._dbs[db], key, None, None))

    def delete_prefix(self, db: str, prefix: bytes) -> None:
        """Queue the delete of every key of `db` that starts with `prefix` (as the queue
        reaches it: rows appended under it before are deleted, later ones are not). For
        retention: a pruned plan's task records, a session's rows. Raises `ValueError` as
        `put` does."""
        if self._closed:
            raise self._closed_error()
        check_key(prefix)
        self._enqueue((_DELETE_PREFIX, self._dbs[db], prefix, None, None))

    def append(self, db: str, key: bytes, value: bytes) -> None:
        """Queue a new row and return at once: the row is stored at `key` followed by an 8-byte
        big-endian sequence number that the store assigns at commit, in queue order, and keeps
        across restarts. Two appends are two rows, whatever their keys and values (`rows`)."""
        if self._closed:
            raise self._closed_error()
        check_key(key + bytes(SEQ_BYTES))
        self._enqueue((_APPEND, self._dbs[db], key, value, None))

    def put_durable(self, db: str, key: bytes, value: bytes) -> asyncio.Future[None]:
        """Queue a write; the future resolves after the transaction holding it has committed.

        While the state is degraded the future stays pending until a retry commits it (it is
        never resolved before the write is on disk); it raises `StateError` only if the store is
        closed before the write could be committed. Raises `ValueError` at once for a key LMDB
        cannot hold (`check_key`): queued, it would fail every retry and hold up every later
        write behind it.
        """
        if self._loop is None:
            raise RuntimeError("put_durable needs start() called on a running event loop")
        if self._closed:
            raise self._closed_error()
        check_key(key)
        done: asyncio.Future[None] = self._loop.create_future()
        self._enqueue((_PUT, self._dbs[db], key, value, done))
        return done

    def hold(self, seconds: float) -> None:
        """Fault injection (`ctl debug NAME hold_commits`): start no commit for `seconds` from
        now, as behind a stalled disk. Returns at once; a commit already running ends first.
        Writes go on queueing, their `put_durable` futures wait, reads are served."""
        threading.Thread(
            target=self._held, args=(seconds,), name=f"hold:{self.path.name}", daemon=True
        ).start()

    def _held(self, seconds: float) -> None:
        with self._writing:  # the lock every commit takes (`_write`)
            time.sleep(seconds)

    def check_writable(self) -> None:
        """Raise the degraded `StateError` while commits fail (call it before accepting work)."""
        degraded = self.degraded
        if degraded is not None:
            raise StateError(str(degraded))

    @property
    def queue_depth(self) -> int:
        """Writes queued and not yet taken by the thread (approximate)."""
        return self._queue.qsize()

    def stats(self) -> dict[str, int]:
        """The counters, for metrics."""
        return {
            "batches": self.batches,
            "writes": self.writes,
            "last_batch": self.last_batch,
            "queue_depth": self.queue_depth,
            "failures": self.failures,
            "grows": self.grows,
            "adopted": self.adopted,
            "degraded": int(self.degraded is not None),
        }

    def items(self, db: str) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) of `db` as committed (a snapshot); for start-up, before serving."""
        dbi = self._dbs[db]
        return iter(self._read(lambda txn: list(txn.cursor(dbi).iternext(keys=True, values=True))))

    def rows(self, db: str, key: bytes) -> list[bytes]:
        """The values appended under `key` (`append`), in append order, as committed."""
        want = len(key) + SEQ_BYTES
        dbi = self._dbs[db]

        def scan(txn: lmdb.Transaction) -> list[bytes]:
            out: list[bytes] = []
            cursor = txn.cursor(dbi)
            if cursor.set_range(key):
                for k, v in cursor.iternext(keys=True, values=True):
                    if not k.startswith(key):
                        break
                    if len(k) == want:
                        out.append(v)
            return out

        return self._read(scan)

    def scan(self, db: str, start: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        """At most `limit` (key, value) pairs of `db` from the first key >= `start`, in key
        order, as committed. Safe from any thread (a reader off the loop)."""
        dbi = self._dbs[db]

        def page(txn: lmdb.Transaction) -> list[tuple[bytes, bytes]]:
            cursor = txn.cursor(dbi)
            if not cursor.set_range(start):
                return []
            out: list[tuple[bytes, bytes]] = []
            for pair in cursor.iternext(keys=True, values=True):
                out.append(pair)
                if len(out) >= limit:
                    break
            return out

        return self._read(page)

    def last_key(self, db: str) -> bytes | None:
        """The greatest key of `db`, as committed (None: empty)."""
        dbi = self._dbs[db]

        def last(txn: lmdb.Transaction) -> bytes | None:
            cursor = txn.cursor(dbi)
            return cursor.key() if cursor.last() else None

        return self._read(last)

    def get(self, db: str, key: bytes) -> bytes | None:
        dbi = self._dbs[db]
        return self._read(lambda txn: txn.get(key, db=dbi))

    def _read(self, fn: Callable[[lmdb.Transaction], _T]) -> _T:
        """`fn` in a read transaction, retried after adopting a map another process grew."""
        while True:
            try:
                with self._remap, self.env.begin() as txn:
                    return fn(txn)
            except lmdb.MapResizedError:
                self._adopt_map_size()

    def close(self, timeout_s: float = 2.0) -> None:
        """Flush everything queued, stop the thread and close the environment.

        A healthy flush is always waited for. While the state is degraded, the thread retries at
        once and then on its backoff for `timeout_s`; after that it gives up at its next failed
        commit, logs how many writes were not persisted and fails their `put_durable` futures.
        """
        if self._closed:
            return
        self._closed = True
        if self._thread.ident is None:
            self._thread.start()  # never started: still flush what was queued
        self._enqueue(_STOP)
        self._wake.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._abandon = True  # only a failing commit obeys it; a healthy flush goes on
            self._wake.set()
            self._thread.join()
        self.env.close()

    def _closed_error(self) -> StateError:
        return StateError(f"state {self.path} is closed")

    # --- the persistence thread ------------------------------------------------------------------

    def _drain(self) -> None:
        if self._thread_start is not None:
            self._thread_start()
        get, get_nowait, max_batch = self._queue.get, self._queue.get_nowait, self._max_batch
        stop = False
        while not stop:
            batch: list[_Write] = []
            item = get()
            while True:
                if item is _STOP:
                    stop = True
                else:
                    batch.append(item)  # type: ignore[arg-type]
                    if len(batch) >= max_batch:
                        break
                try:
                    item = get_nowait()
                except queue.Empty:
                    break
            if batch and not self._persist(batch):
                return

    def _persist(self, batch: list[_Write]) -> bool:
        """Commit `batch` as one transaction, retrying until it commits (True) or the store is
        abandoned on close (False; the batch and everything queued after it are reported lost)."""
        delay = self._retry_initial_s
        while True:
            try:
                self._write(batch)
            except lmdb.MapFullError:
                self._grow()
                continue
            except lmdb.MapResizedError:
                self._adopt_map_size()
                continue
            except lmdb.TxnFullError:
                if len(batch) > 1:  # too many dirty pages for one transaction: split, in order
                    half = len(batch) // 2
                    return self._persist(batch[:half]) and self._persist(batch[half:])
                self._fail(_describe(self.path, "one write is too large for a transaction"), batch)
            except Exception as exc:  # a full disk, an I/O error, or a bad write (a bug)
                if not isinstance(exc, (lmdb.Error, OSError)) and self.degraded is None:
                    log.exception("state %s: unexpected error in a commit", self.path)
                self._fail(_describe(self.path, exc), batch)
            else:
                self._committed(batch)
                return True
            if self._abandon:
                self._give_up(batch)
                return False
            self._wake.wait(delay)
            self._wake.clear()
            delay = min(delay * 2, self._retry_max_s)

    def _write(self, batch: list[_Write]) -> None:
        with self._writing, self.env.begin(write=True) as txn:
            put, delete = txn.put, txn.delete
            seq = -1
            for kind, dbi, key, value, _ in batch:
                if kind == _PUT:
                    put(key, value, db=dbi)
                elif kind == _DELETE:
                    delete(key, db=dbi)
                elif kind == _DELETE_PREFIX:
                    _delete_prefix(txn, dbi, key)
                else:
                    if seq < 0:
                        raw = txn.get(_SEQ_KEY, db=self._meta)
                        seq = int.from_bytes(raw, "big") if raw else 0
                    seq += 1
                    put(key + seq.to_bytes(SEQ_BYTES, "big"), value, db=dbi)  # type: ignore[arg-type]
            if seq >= 0:
                put(_SEQ_KEY, seq.to_bytes(SEQ_BYTES, "big"), db=self._meta)
        # leaving the block committed the transaction: data and meta are fsynced

    def _grow(self) -> None:
        with self._remap:
            size = self.env.info()["map_size"] * 2
            self.env.set_mapsize(size)
        self.grows += 1
        log.info("state %s: map full, grown to %d bytes", self.path, size)

    def _adopt_map_size(self) -> None:
        """Take the map size another process grew the environment to (any thread)."""
        with self._writing, self._remap:
            self.env.set_mapsize(0)
            size = self.env.info()["map_size"]
        self.adopted += 1
        log.info("state %s: map grown by another process, now %d bytes", self.path, size)

    def _fail(self, error: StateError, batch: list[_Write]) -> None:
        self.failures += 1
        if self.degraded is None or str(self.degraded) != str(error):
            held = len(batch) + self.queue_depth
            log.error("%s (retrying; %d writes held in order, none dropped)", error, held)
            self.degraded = error
            self._notify(error)

    def _committed(self, batch: list[_Write]) -> None:
        if self.degraded is not None:
            log.warning(
                "state %s: writable again after %d failed commits", self.path, self.failures
            )
            self.degraded = None
            self._notify(None)
        self.batches += 1
        self.writes += len(batch)
        self.last_batch = len(batch)
        self.batch_rows.observe(len(batch))
        if self._on_commit is not None:  # before anyone awaiting the commit is told of it
            try:
                self._on_commit(self.writes)
            except Exception:
                log.exception("state %s: on_commit hook failed", self.path)
        dones = [w[4] for w in batch if w[4] is not None]
        if dones:
            self._settle(dones, None)

    def _give_up(self, batch: list[_Write]) -> None:
        lost = list(batch)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                lost.append(item)  # type: ignore[arg-type]
        why = str(self.degraded).split("; ", 1)[0]
        error = StateError(f"{why}; closed with {len(lost)} queued writes not persisted")
        log.error("%s", error)
        dones = [w[4] for w in lost if w[4] is not None]
        if dones:
            self._settle(dones, error)

    def _notify(self, degraded: StateError | None) -> None:
        """Tell `on_degraded` (on the store's loop when there is one) that the state changed."""
        callback = self.on_degraded
        if callback is None:
            return
        if self._loop is None:
            callback(degraded)
            return
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening any more
            self._loop.call_soon_threadsafe(callback, degraded)

    def _settle(self, dones: list[asyncio.Future[None]], error: Exception | None) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            loop.call_soon_threadsafe(_settle_all, dones, error)


def _delete_prefix(txn: lmdb.Transaction, dbi: Any, prefix: bytes) -> None:
    cursor = txn.cursor(dbi)
    if cursor.set_range(prefix):
        while cursor.key().startswith(prefix):
            if not cursor.delete():  # the cursor moves to the next key, or says there is none
                break


MAX_KEY_BYTES = 511
"""The longest key LMDB takes (its default `mdb_env_get_maxkeysize`)."""


def check_key(key: bytes) -> None:
    """Raise `ValueError` unless `key` is 1 to `MAX_KEY_BYTES` bytes: LMDB refuses any other,
    and a write the store queued with one would be retried for ever."""
    if not 0 < len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"a state key is 1 to {MAX_KEY_BYTES} bytes, got {len(key)}")


def _describe(path: Path, exc: BaseException | str) -> StateError:
    """One line for a user: the state path, what failed, and what it means for new work."""
    if isinstance(exc, str):
        text = exc
    elif isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror
    elif isinstance(exc, lmdb.Error):
        text = str(exc).rsplit(": ", 1)[-1]  # "mdb_txn_commit: No space left on device"
    else:
        text = f"write failed: {type(exc).__name__}: {exc}"
    text = text[:1].lower() + text[1:]
    full = text in _NO_ROOM or (isinstance(exc, OSError) and exc.errno in _NO_ROOM_CODES)
    if not full and (free := _free_bytes(path)) is not None and free < ROOMLESS_BYTES:
        # LMDB can report a write the full disk refused as EIO (tmpfs, msync)
        text += f" (the disk is full: {free} bytes free)"
        full = True
    until = "there is room" if full else "a write succeeds"
    return StateError(f"state {path}: {text}; new work is refused until {until}")


def _free_bytes(path: Path) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


ROOMLESS_BYTES = 1 << 20
"""Free bytes below which a failed commit is taken as one the full disk refused."""
_NO_ROOM_CODES = (errno.ENOSPC, errno.EDQUOT)
_NO_ROOM = {os.strerror(code)[:1].lower() + os.strerror(code)[1:] for code in _NO_ROOM_CODES}


def _settle_all(dones: list[asyncio.Future[None]], error: Exception | None) -> None:
    for done in dones:
        if done.done():
            continue
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

"""One LMDB environment per process, written behind the event loop by one persistence thread.

Handlers call `put`/`delete` and go on: the write is queued, and the persistence thread drains the
queue into one transaction per batch. Batching, never coalescing: two puts stay two writes, in
order (seeds/002, "Batching only, never coalescing"). `put_durable` returns a future that resolves
once the batch holding it has committed, for operations whose failure a user must see (plan
submission, inbox entries that are acknowledged after commit).

Reads at start-up come straight from LMDB (`items`); after that, owners answer from their in-memory
projections, never from the queue, which may not have landed.

A full map grows (doubling) instead of failing.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import lmdb

from orchestra_sup.errors import StateError

log = logging.getLogger(__name__)

_STOP = object()


class _Write:
    __slots__ = ("db", "done", "key", "value")

    def __init__(
        self, db: bytes, key: bytes, value: bytes | None, done: asyncio.Future[None] | None
    ):
        self.db = db
        self.key = key
        self.value = value
        self.done = done


class Store:
    """An LMDB environment at `path` with named databases `dbs`, written by one thread.

    `map_size` is the initial map in bytes (default 64 MiB; it doubles when full). Raises
    `StateError` when the environment cannot be opened (another process holds it, or the
    directory is unusable).
    """

    def __init__(self, path: Path, dbs: list[str], *, map_size: int = 64 * 1024 * 1024):
        path.mkdir(parents=True, exist_ok=True)
        try:
            self.env = lmdb.open(str(path), map_size=map_size, max_dbs=len(dbs) + 1)
        except lmdb.Error as exc:
            raise StateError(f"cannot open state {path}: {exc}") from exc
        self.path = path
        self._dbs = {name: self.env.open_db(name.encode()) for name in dbs}
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        # A daemon, so a process that fails before `close()` exits instead of hanging on it;
        # every orderly path calls `close()`, which flushes.
        self._thread = threading.Thread(
            target=self._drain, name=f"persist:{path.name}", daemon=True
        )
        self.batches = 0
        self.writes = 0

    def start(self) -> None:
        """Start the persistence thread; futures from `put_durable` resolve on the calling loop."""
        self._loop = asyncio.get_running_loop()
        self._thread.start()

    # --- the loop side ---------------------------------------------------------------------------

    def put(self, db: str, key: bytes, value: bytes) -> None:
        """Queue a write and return at once."""
        self._queue.put(_Write(db.encode(), key, value, None))

    def delete(self, db: str, key: bytes) -> None:
        """Queue a delete and return at once."""
        self._queue.put(_Write(db.encode(), key, None, None))

    def put_durable(self, db: str, key: bytes, value: bytes) -> asyncio.Future[None]:
        """Queue a write; the future resolves after its batch commits, or raises `StateError`."""
        assert self._loop is not None, "store not started"
        done: asyncio.Future[None] = self._loop.create_future()
        self._queue.put(_Write(db.encode(), key, value, done))
        return done

    def items(self, db: str) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) of `db` as committed; for start-up, before serving."""
        with self.env.begin(db=self._dbs[db]) as txn:
            yield from txn.cursor().iternext(keys=True, values=True)

    def get(self, db: str, key: bytes) -> bytes | None:
        with self.env.begin(db=self._dbs[db]) as txn:
            return txn.get(key)

    def close(self) -> None:
        """Flush everything queued, stop the thread and close the environment."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        self.env.close()

    # --- the persistence thread ------------------------------------------------------------------

    def _drain(self) -> None:
        stop = False
        while not stop:
            batch: list[_Write] = []
            item = self._queue.get()
            while True:
                if item is _STOP:
                    stop = True
                else:
                    assert isinstance(item, _Write)
                    batch.append(item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._commit(batch)

    def _commit(self, batch: list[_Write]) -> None:
        error: Exception | None = None
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    for w in batch:
                        dbi = self._dbs[w.db.decode()]
                        if w.value is None:
                            txn.delete(w.key, db=dbi)
                        else:
                            txn.put(w.key, w.value, db=dbi)
                break
            except lmdb.MapFullError:
                size = self.env.info()["map_size"] * 2
                log.info("state %s: map full, growing to %d bytes", self.path, size)
                self.env.set_mapsize(size)
            except lmdb.Error as exc:
                error = StateError(f"state {self.path}: write failed: {exc}")
                log.error("%s", error)
                break
        self.batches += 1
        self.writes += len(batch)
        for w in batch:
            if w.done is not None and self._loop is not None:
                self._loop.call_soon_threadsafe(_settle, w.done, error)


def _settle(done: asyncio.Future[None], error: Exception | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)

"""Tests for `orchestra_sup.state.store.Store` on real LMDB environments in `tmp_path`.

Writes queued before `start()` are drained as one batch (the thread takes everything queued when it
wakes), which is how a test puts several writes in one transaction on purpose; `batches` and
`last_batch` confirm it. Async tests run their own loop (`asyncio.run`); waits poll a condition
under a deadline, never a bare sleep.
"""

from __future__ import annotations

import asyncio
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestra_sup.errors import StateError
from orchestra_sup.state.store import Store

DEADLINE_S = 10.0
"""Upper bound for anything that should happen promptly; only reached when a test fails."""


def key(i: int) -> bytes:
    return i.to_bytes(8, "big")


async def until(pred: Callable[[], object], what: str, timeout_s: float = DEADLINE_S) -> None:
    """Poll `pred` on the running loop until it is truthy (fail naming `what` at the deadline)."""
    async with asyncio.timeout(timeout_s):
        while not pred():
            await asyncio.sleep(0.002)
    assert pred(), what


def read_from_another_process(path: Path, db: str) -> dict[bytes, bytes]:
    """Every row of `db` as a separate process sees it (its own LMDB handle and reader slot)."""
    code = (
        "import lmdb, sys\n"
        "env = lmdb.open(sys.argv[1], readonly=True, max_dbs=8)\n"
        "dbi = env.open_db(sys.argv[2].encode(), create=False)\n"
        "with env.begin(db=dbi) as txn:\n"
        "    for k, v in txn.cursor():\n"
        "        sys.stdout.write(k.hex() + ' ' + v.hex() + '\\n')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path), db],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    rows = (line.split() for line in out.splitlines())
    return {bytes.fromhex(k): bytes.fromhex(v) for k, v in rows}


def test_a_prefix_delete_takes_what_was_queued_before_it_and_nothing_else(tmp_path: Path) -> None:
    """`delete_prefix` in queue order: rows under the prefix queued before it go (appended
    ones too), a row queued after it stays, and keys that only share a start do not go
    (`p1/` is not `p10/`)."""
    store = Store(tmp_path / "s", ["a"])
    for k in (b"p1/a", b"p1/b", b"p10/a", b"p1", b"q/a"):
        store.put("a", k, b"v")
    store.append("a", b"p1/rows/", b"r")
    store.delete_prefix("a", b"p1/")
    store.put("a", b"p1/late", b"v")
    store.delete_prefix("a", b"z/")  # nothing under it, and the last key
    store.start()
    store.close()
    assert rows_of(tmp_path / "s", "a") == {
        b"p10/a": b"v",
        b"p1": b"v",
        b"q/a": b"v",
        b"p1/late": b"v",
    }
    other = Store(tmp_path / "t", ["a"])
    with pytest.raises(ValueError):
        other.delete_prefix("a", b"")
    other.close()


def reopened(path: Path, dbs: list[str]) -> Store:
    return Store(path, dbs)


def rows_of(path: Path, db: str) -> dict[bytes, bytes]:
    """Every committed row of `db`, read through a fresh Store that is closed again."""
    store = Store(path, [db])
    try:
        return dict(store.items(db))
    finally:
        store.close()


def rows_of_store(store: Store, db: str) -> dict[bytes, bytes]:
    return dict(store.items(db))


# --- batching, never coalescing ------------------------------------------------------------------


def test_one_batch_keeps_every_write_as_its_own_row_in_order(tmp_path: Path) -> None:
    """An event log keyed by sequence, with repeated identical payloads, queued as one batch:
    every event is a row (none merged, none dropped as a duplicate), and the counters count
    every write."""
    store = Store(tmp_path / "s", ["log"])
    payloads = [b"tick", b"tick", b"tick", b"tock", b"tick", b"tick"] * 50
    for i, payload in enumerate(payloads):
        store.put("log", key(i), payload)
    store.start()
    store.close()
    assert (store.batches, store.last_batch, store.writes) == (1, len(payloads), len(payloads))
    assert rows_of(tmp_path / "s", "log") == {key(i): p for i, p in enumerate(payloads)}


def test_two_writes_to_distinct_keys_in_one_batch_are_two_rows(tmp_path: Path) -> None:
    store = Store(tmp_path / "s", ["a"])
    store.put("a", b"k1", b"v")
    store.put("a", b"k2", b"v")
    store.start()
    store.close()
    assert store.last_batch == 2 and store.batches == 1
    assert rows_of(tmp_path / "s", "a") == {b"k1": b"v", b"k2": b"v"}


def test_puts_to_one_key_in_one_batch_end_with_the_last_value(tmp_path: Path) -> None:
    """Applied in queue order: the last put wins, a delete between puts does not."""
    store = Store(tmp_path / "s", ["a"])
    for v in (b"1", b"2", b"3"):
        store.put("a", b"k", v)
    store.put("a", b"gone", b"x")
    store.delete("a", b"gone")
    store.delete("a", b"back")
    store.put("a", b"back", b"again")
    store.start()
    store.close()
    assert store.batches == 1 and store.writes == 7
    assert rows_of(tmp_path / "s", "a") == {b"k": b"3", b"back": b"again"}


def test_appends_with_the_same_key_and_value_stay_separate_rows(tmp_path: Path) -> None:
    """Two events stay two rows: appends under one key, identical or not, in one batch and
    across batches and restarts, come back one row each, in order."""
    store = Store(tmp_path / "s", ["ev"])
    for text in (b"hello", b"hello", b" world", b"hello"):
        store.append("ev", b"turn-1", text)
    store.append("ev", b"turn-2", b"other")
    store.start()
    store.close()
    assert store.batches == 1 and store.last_batch == 5
    again = reopened(tmp_path / "s", ["ev"])
    assert again.rows("ev", b"turn-1") == [b"hello", b"hello", b" world", b"hello"]
    assert len(rows_of_store(again, "ev")) == 5
    again.append("ev", b"turn-1", b"hello")
    again.start()
    again.close()
    third = reopened(tmp_path / "s", ["ev"])
    assert third.rows("ev", b"turn-1") == [b"hello", b"hello", b" world", b"hello", b"hello"]
    assert third.rows("ev", b"turn-2") == [b"other"]
    assert third.rows("ev", b"turn-") == []
    third.close()


# --- durability ----------------------------------------------------------------------------------


class GatedEnv:
    """Wraps a store's environment so each write transaction waits at its commit (`__exit__`)
    until `gate` is set, after signalling `at_commit`: a test can look at the world between
    "the batch is written" and "the batch is committed"."""

    def __init__(self, env: Any):
        self._env = env
        self.at_commit = threading.Event()
        self.gate = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def begin(self, **kw: Any) -> Any:
        txn = self._env.begin(**kw)
        return _GatedTxn(txn, self) if kw.get("write") else txn


class _GatedTxn:
    def __init__(self, txn: Any, env: GatedEnv):
        self.txn = txn
        self.env = env

    def __enter__(self) -> Any:
        return self.txn.__enter__()

    def __exit__(self, *exc: object) -> Any:
        self.env.at_commit.set()
        self.env.gate.wait(DEADLINE_S)
        return self.txn.__exit__(*exc)


def test_put_durable_resolves_only_after_the_commit_returned(tmp_path: Path) -> None:
    """While the batch holding a durable write sits at its commit, the future is pending (even
    after the loop ran everything the thread handed it); once the commit returns it resolves, and
    another process then sees the row."""
    path = tmp_path / "s"

    async def main() -> None:
        store = Store(path, ["a"])
        gated = GatedEnv(store.env)
        store.env = gated
        store.start()
        try:
            done = store.put_durable("a", b"k", b"durable")
            for i in range(2000):  # a batch with some weight behind the durable write
                store.put("a", key(i), b"x" * 200)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, gated.at_commit.wait, DEADLINE_S)
            # anything the thread scheduled before reaching the commit has run by now
            await asyncio.sleep(0)
            assert not done.done(), "acknowledged before its batch committed"
            assert b"k" not in read_from_another_process(path, "a")
            gated.gate.set()
            async with asyncio.timeout(DEADLINE_S):
                await done
            assert read_from_another_process(path, "a")[b"k"] == b"durable"
        finally:
            gated.gate.set()
            store.close()

    asyncio.run(main())


def test_close_flushes_everything_queued(tmp_path: Path) -> None:
    """Writes queued just before close() are all on disk after it, in every kind."""
    store = Store(tmp_path / "s", ["a", "ev"])
    store.start()
    for i in range(20_000):
        store.put("a", key(i), b"v" * 200)
    store.append("ev", b"e", b"last")
    store.close()
    again = reopened(tmp_path / "s", ["a", "ev"])
    assert sum(1 for _ in again.items("a")) == 20_000
    assert again.rows("ev", b"e") == [b"last"]
    again.close()
    with pytest.raises(StateError, match="closed"):
        store.put("a", b"late", b"x")


def test_a_small_map_that_fills_grows_and_every_write_lands(tmp_path: Path) -> None:
    store = Store(tmp_path / "s", ["a"], map_size=64 * 1024)
    store.start()
    for i in range(3000):
        store.put("a", key(i), b"v" * 200)
    store.close()
    assert store.grows >= 3, store.stats()
    assert store.failures == 0 and store.degraded is None
    assert rows_of(tmp_path / "s", "a") == {key(i): b"v" * 200 for i in range(3000)}


def test_items_is_a_snapshot_that_survives_a_map_grow(tmp_path: Path) -> None:
    """Start-up reads while the thread grows the map (the coordinator writes behind while it
    replays its inbox): items() holds no read transaction open across its iteration."""
    store = Store(tmp_path / "s", ["a"], map_size=64 * 1024)
    for i in range(100):
        store.put("a", key(i), b"v" * 200)
    store.start()
    store.close()
    again = Store(tmp_path / "s", ["a"], map_size=64 * 1024)
    again.start()
    seen = 0
    for i, _ in enumerate(again.items("a")):
        seen += 1
        for j in range(20):
            again.put("a", key(1000 + i * 20 + j), b"w" * 200)
    again.close()
    assert seen == 100 and again.grows >= 1


# --- a full disk ---------------------------------------------------------------------------------


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs mounted for this test (needs root or CAP_SYS_ADMIN)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root): {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        # lazily if something still holds it open (a failed test's store): never leave it mounted
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_full_disk_degrades_refuses_new_work_and_loses_nothing(tiny_fs: Path) -> None:
    """Durable writes one at a time until a commit fails for lack of room: `degraded` names the
    path and the OS error, check_writable raises it, the failed write's future stays pending and
    so do writes accepted after it, across retries. Freeing room lets a retry land everything, in
    order; degraded clears (the owner is told both ways) and the futures resolve without a
    restart."""
    filler = tiny_fs / "filler"
    filler.write_bytes(b"\0" * (320 * 1024))
    path = tiny_fs / "state"
    value = b"d" * 4096

    async def main() -> None:
        store = Store(path, ["a", "ev"], retry_initial_s=0.02, retry_max_s=0.1)
        changes: list[StateError | None] = []
        store.on_degraded = changes.append
        store.start()
        try:
            acked: list[int] = []
            failing: asyncio.Future[None] | None = None
            for i in range(1000):
                fut = store.put_durable("a", key(i), value)
                await until(lambda f=fut: f.done() or store.degraded is not None, "commit or fail")
                if store.degraded is not None:
                    failing = fut
                    break
                fut.result()
                acked.append(i)
            assert failing is not None, "the tmpfs never filled"
            assert not failing.done(), "a write whose commit failed was acknowledged"
            message = str(store.degraded)
            assert message.startswith(f"state {path}: no space left on device;"), message
            assert "new work is refused until there is room" in message
            assert "\n" not in message
            with pytest.raises(StateError, match="no space left on device"):
                store.check_writable()
            # accepted while degraded: queued behind the failed batch, in order
            later = [store.put_durable("a", key(5000 + j), b"later") for j in range(5)]
            store.put("a", b"plain", b"1")
            store.put("a", b"plain", b"2")
            store.append("ev", b"e", b"one")
            store.append("ev", b"e", b"one")
            tried = store.failures
            await until(lambda: store.failures >= tried + 3, "three more failed retries")
            assert not failing.done() and not any(f.done() for f in later)
            assert store.degraded is not None

            filler.unlink()  # room again
            async with asyncio.timeout(DEADLINE_S):
                await failing
                await asyncio.gather(*later)
            await until(lambda: store.degraded is None, "degraded to clear")
            await until(lambda: len(changes) == 2, "the owner told of the recovery")
            assert str(changes[0]) == message and changes[1] is None
            store.check_writable()
            store.put("a", b"after", b"ok")  # new work is accepted again, no restart
        finally:
            store.close()
        again = reopened(path, ["a", "ev"])
        try:
            rows = dict(again.items("a"))
            appended = again.rows("ev", b"e")
        finally:
            again.close()
        for i in [*acked, len(acked)]:
            assert rows[key(i)] == value
        assert all(rows[key(5000 + j)] == b"later" for j in range(5))
        assert rows[b"plain"] == b"2" and rows[b"after"] == b"ok"
        assert appended == [b"one", b"one"]

    asyncio.run(main())


def grow_from_another_process(path: Path, rows: int, value_bytes: int) -> None:
    """A second `Store` on `path`, in its own process (LMDB forbids one environment opened twice
    in one process), appends `rows` rows under b"r" to db "a" from a 1 MiB map, growing it."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from orchestra_sup.state.store import Store\n"
        "s = Store(Path(sys.argv[1]), ['a'], map_size=1 << 20)\n"
        "for i in range(int(sys.argv[2])):\n"
        "    s.append('a', b'r', bytes(int(sys.argv[3])))\n"
        "s.close(timeout_s=30)\n"
        "assert s.grows >= 1, s.stats()\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(path), str(rows), str(value_bytes)],
        check=True,
        timeout=60,
    )


def test_a_map_grown_by_another_process_is_adopted_for_reads_and_writes(tmp_path: Path) -> None:
    """Two processes on one environment (a shard's surge): after the other grew the map, this
    one's reads and writes adopt the new size and go on; appends of both share one sequence."""
    path = tmp_path / "s"
    store = Store(path, ["a"], map_size=1 << 20)
    store.start()
    store.append("a", b"r", b"mine-1")
    store.close()  # flushed; reopened below so the open handle predates the growth
    store = Store(path, ["a"], map_size=1 << 20)
    store.start()
    grow_from_another_process(path, rows=400, value_bytes=8192)  # ~3 MiB through a 1 MiB map
    assert len(store.rows("a", b"r")) == 401  # a read: MapResizedError, adopted, retried
    assert store.adopted == 1
    store.append("a", b"r", b"mine-2")
    store.put("a", b"k", b"v")
    store.close()
    assert store.failures == 0 and store.degraded is None
    rows = rows_of(path, "a")
    appended = sorted(k for k in rows if k.startswith(b"r"))
    assert len(appended) == 402 and rows[appended[-1]] == b"mine-2"  # one sequence, no overwrite
    assert rows[b"k"] == b"v"


def test_a_write_after_another_process_grew_the_map_adopts_it(tmp_path: Path) -> None:
    """The persistence thread meets the grown map first: it adopts the size, nothing fails."""
    path = tmp_path / "s"
    store = Store(path, ["a"], map_size=1 << 20)
    store.start()
    grow_from_another_process(path, rows=400, value_bytes=8192)
    store.put("a", b"k", b"v")
    store.close()
    assert store.adopted == 1 and store.failures == 0
    assert rows_of(path, "a")[b"k"] == b"v"


def test_check_writable_passes_while_healthy(tmp_path: Path) -> None:
    store = Store(tmp_path / "s", ["a"])
    store.start()
    store.put("a", b"k", b"v")
    store.close()
    store.check_writable()
    assert store.degraded is None
    assert store.stats() == {
        "batches": 1,
        "writes": 1,
        "last_batch": 1,
        "queue_depth": 0,
        "failures": 0,
        "grows": 0,
        "adopted": 0,
        "degraded": 0,
    }


def test_an_unknown_database_is_refused_at_the_call(tmp_path: Path) -> None:
    """A typo fails the caller at once, not the persistence thread later."""
    store = Store(tmp_path / "s", ["a"])
    with pytest.raises(KeyError):
        store.put("nope", b"k", b"v")
    store.close()


def test_open_failure_is_a_state_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StateError, match="cannot open state"):
        Store(tmp_path / "file" / "s", ["a"])


def test_lmdb_default_sync_is_on(tmp_path: Path) -> None:
    """The store relies on LMDB's default: every commit fsynced (no NOSYNC, no NOMETASYNC)."""
    store = Store(tmp_path / "s", ["a"])
    flags = store.env.flags()
    store.close()
    assert flags["sync"] and flags["metasync"]


def test_an_environment_is_the_trees_alone(tmp_path: Path) -> None:
    """Its directory 0700 and its files 0600 (a lane of another uid reads no plan, answer or
    transcript), those an older release left 0755 and 0644 too."""
    path = tmp_path / "env"
    Store(path, ["d"]).env.close()
    for name in ("data.mdb", "lock.mdb"):
        (path / name).chmod(0o644)
    path.chmod(0o755)
    store = Store(path, ["d"])
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
        for name in ("data.mdb", "lock.mdb"):
            assert stat.S_IMODE((path / name).stat().st_mode) == 0o600, name
    finally:
        store.env.close()

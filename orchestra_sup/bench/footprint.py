"""What a running tree occupies, read from outside it: one `sample` of named figures.

For `bench soak` (issue 22): each figure is read by the calling process, from the file system
and `/proc`, never by asking the tree's event loops for it (only `ctl status`, which the
supervisor answers from its own record, names the processes). Every figure is a number, or None
when it cannot be read at that moment; the names:

- `state_bytes`: bytes allocated to the files under the state directory (`st_blocks * 512` of
  each, so a sparse LMDB file counts by what it uses, a directory by its own blocks), except the
  tree's log (`tree.log`, which a private tree writes there and which grows with what it logs:
  a production tree logs to its journal). Files that vanish during the walk are skipped;
- `state_entries`: the files and directories under the state directory (but `tree.log`),
  outside the sandboxes' own trees (each a checkout of the workspace, which `sandboxes`
  counts): LMDB's files, the ended marks, the sandboxes' base records, the lanes' inbox files,
  ... A leak of one small or empty file a lane shows here long before it would in bytes;
- `lmdb.<env>.file_bytes`: bytes allocated to `data.mdb` of each LMDB environment (each
  directory under the state directory holding one; `<env>` its path relative to the state
  directory, `coordinator`, `shard-0`, ...);
- `lmdb.<env>.used_bytes`: `(last page number + 1) * page size` from the environment's own
  info: its high-water mark, which grows only when no freed page could be reused. Read through
  a read-only transaction with LMDB's lock file (a reader slot like any reader's), so a live
  writer is never disturbed; None when the environment cannot be opened so;
- `rss.<name>`, `fds.<name>`: resident bytes and open descriptors of the supervisor and of each
  child `ctl status` lists with a pid (`coordinator`, `custodian`, `shard-0`, ...), by psutil;
  None while a process is down or not readable;
- `sandboxes`: directories in `<state_dir>/sandboxes` whose names do not start with "." (so not
  the ended marks' `.ended`, nor a clone still being made, `.<lane>.partial`);
- `events`: entries of db `events` in the LMDB environment `<state_dir>/events` (the event
  log); None while there is no such environment or db.
"""

from __future__ import annotations

import os
from pathlib import Path

import lmdb
import psutil

from orchestra_sup.protocol import frames as f

LOG_NAME = "tree.log"
"""The private tree's log in its state directory (`client.oneshot`), left out of `state_bytes`."""
SANDBOXES = "sandboxes"
"""The custodian's sandboxes directory in the state directory (`custodian.role`)."""
EVENTS_ENV = "events"
"""The event log's LMDB environment in the state directory, and its db's name."""
MAX_DBS = 32
"""Named dbs an environment may have when this process opens it (read-only, to count one)."""

Figures = dict[str, float | None]


def sample(state_dir: Path, status: f.StatusReply | None) -> Figures:
    """Every figure of the module docstring, read now. `status` names the processes (None: no
    process figure this time, the tree did not answer). Never raises for a file or process that
    is gone or unreadable: that figure is None, or the file is not counted."""
    allocated, entries, environments = _walk(state_dir)
    figures: Figures = {"state_bytes": float(allocated), "state_entries": float(entries)}
    for env in environments:
        name = env.relative_to(state_dir).as_posix()
        figures[f"lmdb.{name}.file_bytes"] = float(_blocks(env / "data.mdb") or 0)
        figures[f"lmdb.{name}.used_bytes"] = _used_bytes(env)
    if status is not None:
        pids = {"supervisor": status.supervisor_pid}
        pids |= {c.name: c.pid for c in status.children if c.pid}
        for name, pid in pids.items():
            rss, fds = _process(pid)
            figures[f"rss.{name}"] = rss
            figures[f"fds.{name}"] = fds
    figures["sandboxes"] = float(_sandboxes(state_dir / SANDBOXES))
    figures["events"] = _entries(state_dir / EVENTS_ENV, EVENTS_ENV)
    return figures


def _blocks(path: Path | str) -> int | None:
    """Bytes allocated to `path` (not following a symlink), or None when it is gone."""
    try:
        return os.lstat(path).st_blocks * 512
    except OSError:
        return None


def _walk(root: Path) -> tuple[int, int, list[Path]]:
    """(`st_blocks * 512` summed over `root` and everything under it, the number of entries
    under it but those inside a sandbox, the directories under it that hold a `data.mdb` in
    path order), in one walk; `root/LOG_NAME` left out. An entry gone before it is read counts
    in neither sum."""
    total, entries = _blocks(root) or 0, 0
    environments = []
    sandboxes = os.path.join(root, SANDBOXES)
    for top, dirs, files in os.walk(root, onerror=lambda _exc: None):
        if "data.mdb" in files:
            environments.append(Path(top))
        inside = top.startswith(sandboxes + os.sep) and not os.path.relpath(
            top, sandboxes
        ).startswith(".")
        for name in dirs + files:
            if top == str(root) and name == LOG_NAME:
                continue
            size = _blocks(os.path.join(top, name))
            if size is not None:
                total, entries = total + size, entries + (not inside)
    return total, entries, sorted(environments)


def _open(path: Path) -> lmdb.Environment:
    """`path` opened read-only with its lock file: this process takes a reader slot, as any
    reader does, and writes nothing (`lock=False` would read without telling the writer, which
    may then reuse the pages being read)."""
    return lmdb.open(str(path), readonly=True, lock=True, create=False, max_dbs=MAX_DBS)


def _used_bytes(path: Path) -> float | None:
    """The environment's high-water mark in bytes, or None when it cannot be opened."""
    try:
        env = _open(path)
    except lmdb.Error:
        return None
    try:
        return float((env.info()["last_pgno"] + 1) * env.stat()["psize"])
    finally:
        env.close()


def _entries(path: Path, db: str) -> float | None:
    """Entries of db `db` in the environment at `path`; None without that environment or db."""
    if not (path / "data.mdb").exists():
        return None
    try:
        env = _open(path)
    except lmdb.Error:
        return None
    try:
        with env.begin() as txn:
            handle = env.open_db(db.encode(), txn=txn, create=False)
            return float(txn.stat(handle)["entries"])
    except lmdb.Error:  # NotFoundError: no such db (yet)
        return None
    finally:
        env.close()


def _process(pid: int) -> tuple[float | None, float | None]:
    """(resident bytes, open descriptors) of `pid`; None for what cannot be read."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            return float(proc.memory_info().rss), float(proc.num_fds())
    except psutil.Error:
        return None, None


def _sandboxes(path: Path) -> int:
    """Directories in `path` whose names do not start with "." (0 when there is no `path`)."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return 0
    count = 0
    for entry in entries:
        try:
            count += not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False)
        except OSError:
            continue
    return count

"""Track a lane's processes with a cgroup v2, so none of them outlives the lane or its shard: the
cgroups orchestra-sup makes, where they live, and how their content is killed (the per-shard
view of them is `system.lanecgroups.LaneCgroups`).

A lane's command is the leader of its own process group (`shards.shell.run_shell`), but a
descendant that calls `setsid` or double-forks leaves the group and is not killed with it. A
cgroup holds on to every descendant whatever it does with sessions, groups or parents: the
command joins its lane's cgroup between fork and exec (`LaneCgroups.join_fn`, as Popen's
`preexec_fn`), so everything it ever forks is born inside, and `LaneCgroups.kill` kills the
cgroup's whole content once the lane ends.

Layout (one directory per tree, per shard, per lane)::

    <base>/orchestra-sup/<tree_id>/<shard name>/<lane id>

`base` (`cgroups_base()`) is the cgroup this process runs in when systemd delegated it to us
(a unit with `Delegate=yes`, as `orchestra-sup systemd-unit` writes): the lanes are then the
unit's, accounted to it and killed with it, and a user unit gets tracking too. Elsewhere it is
the cgroup v2 mount point (`cgroup2_root()`).

`tree_id(run_dir)` names a tree by its run directory, so the supervisor can find (and, through
`kill_tree_sync`, kill) what a shard it saw die left behind: `tree_path(run_dir)` is that
directory, `tree_path(run_dir) / shard_name` one shard's.

Where cgroup v2 is missing or not writable (not root, a read-only mount, or
`ORCHESTRA_SUP_CGROUP=off` in the environment), `cgroup2_root()` is None and `LaneCgroups` does
nothing: callers then rely on the process group and on the supervisor being a child subreaper
(orphans are reparented to it and killed).

Hybrid-mode caveat: on machines that mount cgroup v1 controllers under `/sys/fs/cgroup/<ctrl>`
and cgroup v2 at `/sys/fs/cgroup/unified` (these machines do), the v2 hierarchy has no memory,
pids or cpu controller, so this module only tracks and kills: it sets no limits. On a pure-v2
system under systemd without delegation, `/sys/fs/cgroup` is systemd's hierarchy; creating
`orchestra-sup/` at its top works for root but is outside the unit (systemd leaves foreign
cgroups alone, but does not account for them, nor kill them when the unit stops).

Nothing is ever signalled by name or pattern: only processes listed in our own cgroups.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import re
import select
import signal
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "ENV_SWITCH",
    "KILL_TIMEOUT_S",
    "TOP",
    "cgroup2_root",
    "cgroups_base",
    "check_component",
    "delegated_cgroup",
    "kill_and_remove",
    "kill_tree_sync",
    "send_kill",
    "tree_id",
    "tree_path",
]

log = logging.getLogger(__name__)

ENV_SWITCH = "ORCHESTRA_SUP_CGROUP"
"""Environment variable: `off` disables cgroup tracking (`cgroup2_root()` returns None)."""

TOP = "orchestra-sup"
"""The directory under the cgroup v2 root that holds every tree's cgroups."""

KILL_TIMEOUT_S = 5.0
"""Default seconds a kill waits for its cgroup to empty before giving up (and leaving it)."""

_RECHECK_S = 0.1
"""Longest wait (seconds) between two looks at `cgroup.events`, notification or not: a missed
notification costs at most this, and the fallback kill makes another pass this often."""

_MOUNTINFO = Path("/proc/self/mountinfo")
_OWN_CGROUP = Path("/proc/self/cgroup")
_DELEGATE_XATTRS = ("trusted.delegate", "user.delegate")
"""Extended attributes systemd (>= 251) sets to "1" on a delegated unit's cgroup; `user.` for
a user manager's units, which cannot read `trusted.` ones."""


# --- discovery -------------------------------------------------------------------------------


def _unescape(field: str) -> str:
    """Undo mountinfo's octal escapes (`\\040` is a space, `\\134` a backslash, ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _cgroup2_mounts() -> list[Path]:
    """Mount points of every cgroup2 filesystem in this mount namespace, in mountinfo order."""
    try:
        text = _MOUNTINFO.read_text()
    except OSError:
        return []
    mounts = []
    for line in text.splitlines():
        # id parent maj:min root mountpoint options [optional...] - fstype source superoptions
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 6 or not right.split():
            continue
        if right.split()[0] == "cgroup2":
            mounts.append(Path(_unescape(fields[4])))
    return mounts


def cgroup2_root() -> Path | None:
    """The mount point of a writable cgroup v2 hierarchy, or None.

    Reads `/proc/self/mountinfo` and returns the first `cgroup2` mount this process may create
    directories in (`/sys/fs/cgroup/unified` in hybrid mode, `/sys/fs/cgroup` on pure v2). None
    when there is none, when none is writable (not root, a read-only mount), or when the
    environment variable `ORCHESTRA_SUP_CGROUP` is `off` (any case). Looked up afresh on every
    call (no caching), so the variable can be changed at run time. Never raises.
    """
    if os.environ.get(ENV_SWITCH, "").strip().lower() == "off":
        return None
    for mount in _cgroup2_mounts():
        if os.access(mount, os.W_OK | os.X_OK):
            return mount
    return None


def delegated_cgroup() -> Path | None:
    """The cgroup this process runs in, as a directory under a cgroup2 mount, when systemd
    delegated it (one of `_DELEGATE_XATTRS` is "1": `Delegate=yes`) and this process may create
    cgroups in it; else None (and None when `ORCHESTRA_SUP_CGROUP` is `off`). Looked up afresh
    on every call. Never raises."""
    if os.environ.get(ENV_SWITCH, "").strip().lower() == "off":
        return None
    try:
        lines = _OWN_CGROUP.read_text().splitlines()
    except OSError:
        return None
    own = next((line[3:] for line in lines if line.startswith("0::")), None)
    if own is None:
        return None
    for mount in _cgroup2_mounts():
        path = mount / own.lstrip("/")
        for name in _DELEGATE_XATTRS:
            try:
                delegated = os.getxattr(path, name) == b"1"
            except OSError:  # no such attribute, not allowed to read it, not this mount
                continue
            if delegated and os.access(path, os.W_OK | os.X_OK):
                return path
    return None


def cgroups_base() -> Path | None:
    """Where `orchestra-sup/` (`TOP`) goes: `delegated_cgroup()`, else `cgroup2_root()`, else
    None (no tracking). Never raises."""
    return delegated_cgroup() or cgroup2_root()


def tree_id(run_dir: Path | str) -> str:
    """A short stable id of a tree: the first 12 hex digits of the SHA-256 of its run directory.

    The path is made absolute and resolved first (symlinks followed, `..` removed; it need not
    exist), so the supervisor and its shards agree however the directory was spelled. Never
    raises.
    """
    resolved = Path(run_dir).resolve()
    return hashlib.sha256(os.fsencode(resolved)).hexdigest()[:12]


def tree_path(run_dir: Path | str) -> Path | None:
    """`<base>/orchestra-sup/<tree_id(run_dir)>`: every cgroup of that tree; None where
    cgroups are unavailable (see `cgroups_base`). The directory may not exist. Never raises."""
    root = cgroups_base()
    return None if root is None else root / TOP / tree_id(run_dir)


def check_component(name: str, what: str) -> None:
    """Refuse a name that is not one plain path component (no traversal out of our cgroups):
    raises ValueError("bad <what> for a cgroup name: ...") when `name` is empty, contains "/"
    or NUL, or starts with "."."""
    if not name or "/" in name or "\0" in name or name.startswith("."):
        raise ValueError(f"bad {what} for a cgroup name: {name!r}")


# --- the cgroup files ------------------------------------------------------------------------


def _subtree(path: Path) -> Iterator[Path]:
    """`path` and every cgroup below it, deepest first (the order rmdir needs)."""
    for dirpath, _dirs, _files in os.walk(path, topdown=False):
        yield Path(dirpath)


def _pids(cgroup: Path) -> set[int]:
    """The pids (thread-group ids) listed in one cgroup's `cgroup.procs`; empty if it is gone."""
    try:
        return {int(tok) for tok in (cgroup / "cgroup.procs").read_text().split()}
    except (FileNotFoundError, NotADirectoryError):
        return set()
    except OSError as exc:
        if exc.errno == errno.ENODEV:  # the cgroup was removed while we had it open
            return set()
        raise


def _populated(events_fd: int) -> bool:
    """Whether the cgroup whose `cgroup.events` is open as `events_fd` (or any cgroup below it)
    still holds a live process. Reading also re-arms the file's change notification. A cgroup
    removed meanwhile (ENODEV) counts as empty."""
    try:
        text = os.pread(events_fd, 4096, 0).decode()
    except OSError as exc:
        if exc.errno == errno.ENODEV:
            return False
        raise
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "populated":
            return value.strip() != "0"
    return False


def _has_kill_file(cgroup: Path) -> bool:
    """Whether the kernel offers `cgroup.kill` (Linux >= 5.14)."""
    return (cgroup / "cgroup.kill").exists()


def _write(file: Path, value: str) -> None:
    fd = os.open(file, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _sigkill_listed(cgroups: list[Path]) -> None:
    """SIGKILL every process listed in `cgroups`, never a pid that was recycled meanwhile.

    Each listed pid is pinned with a pidfd, the listing is read again, and only pids still listed
    are signalled, through their pidfd: a pidfd whose process is alive at the signal held its pid
    since it was opened, so it is the process the second listing saw.
    """
    if not hasattr(os, "pidfd_open"):  # pragma: no cover - Linux < 5.3
        for cg in cgroups:
            for pid in _pids(cg):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return
    pinned: dict[int, int] = {}
    try:
        for cg in cgroups:
            for pid in _pids(cg):
                with contextlib.suppress(ProcessLookupError):
                    pinned[pid] = os.pidfd_open(pid)
        still = set().union(*(_pids(cg) for cg in cgroups))
        for pid, fd in pinned.items():
            if pid in still:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        for fd in pinned.values():
            os.close(fd)


class _Killer:
    """Kills everything in one cgroup subtree: `cgroup.kill` where the kernel has it, else freeze,
    SIGKILL every listed pid (again on every `again()`, until the caller sees it empty), thaw."""

    def __init__(self, path: Path):
        self.path = path
        self.frozen = False
        self.use_kill_file = _has_kill_file(path)

    def start(self) -> None:
        """Send the kill. Raises OSError if the cgroup files cannot be written (other than the
        cgroup having disappeared, which is not an error)."""
        if self.use_kill_file:
            with contextlib.suppress(FileNotFoundError):
                _write(self.path / "cgroup.kill", "1")
            return
        if (self.path / "cgroup.freeze").exists():  # Linux >= 5.2: nothing forks while we list
            with contextlib.suppress(FileNotFoundError):
                _write(self.path / "cgroup.freeze", "1")
                self.frozen = True
        self.again()

    def again(self) -> None:
        """Another SIGKILL pass over what is listed (the fallback only; the kernel's
        `cgroup.kill` needs none: it also catches forks in flight)."""
        if not self.use_kill_file:
            _sigkill_listed(list(_subtree(self.path)))

    def finish(self) -> None:
        """Thaw what the fallback froze (fatal signals reach frozen tasks, so this is only so
        that nothing stays frozen if something could not be killed in time)."""
        if self.frozen:
            with contextlib.suppress(FileNotFoundError):
                _write(self.path / "cgroup.freeze", "0")
            self.frozen = False


def _refuse_self(path: Path) -> None:
    """Refuse to kill a subtree that holds the calling process (it would kill or freeze us)."""
    me = os.getpid()
    for cg in _subtree(path):
        if me in _pids(cg):
            raise ValueError(f"refusing to kill cgroup {path}: it contains this process ({me})")


def _remove(path: Path) -> bool:
    """rmdir `path` and every cgroup below it, deepest first. True when it is all gone; False
    (logged) when some directory could not be removed (e.g. still populated: EBUSY)."""
    for cg in _subtree(path):
        try:
            cg.rmdir()
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("cgroup %s not removed: %s", cg, exc)
            return False
    return True


def _open_events(path: Path) -> int | None:
    """The fd of `cgroup.events` of the subtree at `path`, opened to read once `_refuse_self`
    let the subtree pass; None when `path` is no directory or has no such file, for the kill to
    be skipped and `_remove` to finish (it returns True at once for a `path` that is gone)."""
    if not path.is_dir():
        return None
    _refuse_self(path)
    try:
        return os.open(path / "cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None


def _kill_and_remove_sync_impl(path: Path, timeout_s: float) -> bool:
    """Kill everything in the subtree at `path`, wait (blocking, at most `timeout_s`) until it is
    empty, remove it. True when it is gone; False (logged) when it still had live processes at the
    deadline (it is then left in place) or could not be removed."""
    events = _open_events(path)
    if events is None:
        return _remove(path)
    killer = _Killer(path)
    deadline = time.monotonic() + timeout_s
    try:
        poller = select.poll()
        poller.register(events, select.POLLPRI)
        killer.start()
        while _populated(events):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("cgroup %s still populated %.1f s after the kill", path, timeout_s)
                return False
            poller.poll(min(remaining, _RECHECK_S) * 1000)
            killer.again()
    finally:
        killer.finish()
        os.close(events)
    return _remove(path)


async def _kill_and_remove_impl(path: Path, timeout_s: float) -> bool:
    """`_kill_and_remove_sync` without blocking the loop: the wait is on a change notification of
    `cgroup.events` (POLLPRI), through an epoll fd watched by the running loop."""
    events = _open_events(path)
    if events is None:
        return _remove(path)
    loop = asyncio.get_running_loop()
    killer = _Killer(path)
    deadline = loop.time() + timeout_s
    # A kernfs file is always "readable", so the loop's own (EPOLLIN) reader cannot watch it: an
    # inner epoll set watches it for EPOLLPRI, and the loop watches the inner epoll fd.
    inner = select.epoll()
    changed = asyncio.Event()
    try:
        inner.register(events, select.EPOLLPRI)
        loop.add_reader(inner.fileno(), changed.set)
        try:
            killer.start()
            while _populated(events):  # reading re-arms the notification
                remaining = deadline - loop.time()
                if remaining <= 0:
                    log.warning("cgroup %s still populated %.1f s after the kill", path, timeout_s)
                    return False
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, _RECHECK_S)):
                        await changed.wait()
                killer.again()
        finally:
            loop.remove_reader(inner.fileno())
    finally:
        killer.finish()
        inner.close()
        os.close(events)
    return _remove(path)


def _kill_and_remove_sync(path: Path, timeout_s: float) -> bool:
    """`_kill_and_remove_sync_impl`, with an OSError logged and reported as False."""
    try:
        return _kill_and_remove_sync_impl(path, timeout_s)
    except OSError as exc:
        log.warning("cgroup %s: kill failed: %s", path, exc)
        return False


async def kill_and_remove(path: Path, timeout_s: float = KILL_TIMEOUT_S) -> bool:
    """Kill every process in the cgroup subtree at `path`, wait until it is empty and remove it
    (sub-cgroups deepest first), without blocking the loop: the kill is sent before the first
    await (`cgroup.kill`, or freeze + SIGKILL + thaw on Linux < 5.14), the wait is at most
    `timeout_s` seconds (typically ~15 ms) on change notifications of `cgroup.events`.

    Returns True when the subtree is gone, also when it never existed. Returns False (logged)
    when live processes remained at the deadline (the subtree is then left in place), a
    directory could not be removed, or a control file could not be read or written (no OSError
    is raised). Unlike `kill_tree_sync` it does not check that `path` is one of ours: for a
    caller that built it from `tree_path` or `LaneCgroups`.

    Raises:
        ValueError: the subtree contains the calling process.
        asyncio.CancelledError: the caller was cancelled while waiting; the kill has been sent.
    """
    try:
        return await _kill_and_remove_impl(path, timeout_s)
    except OSError as exc:
        log.warning("cgroup %s: kill failed: %s", path, exc)
        return False


def _check_ours(path: Path) -> None:
    """Refuse a path that is not `<base>/orchestra-sup/<tree>[/...]`, where `<base>` is a
    cgroup2 mount or, under systemd's delegation, a cgroup below one."""
    absolute = Path(os.path.abspath(path))
    for mount in _cgroup2_mounts():
        try:
            rel = absolute.relative_to(mount)
        except ValueError:
            continue
        if TOP in rel.parts[:-1] and ".." not in rel.parts:
            return
    raise ValueError(f"{path} is not a cgroup of orchestra-sup (<cgroup2>/.../{TOP}/<tree>/...)")


def kill_tree_sync(path: Path, timeout_s: float = KILL_TIMEOUT_S) -> bool:
    """Kill every process in the cgroup subtree at `path` and remove the subtree; blocking.

    For the supervisor: `kill_tree_sync(tree_path(run_dir) / shard_name)` after a shard died
    (SIGKILL included) kills whatever its lanes left running; `kill_tree_sync(tree_path(run_dir))`
    does so for the whole tree. Uses `cgroup.kill` (Linux >= 5.14), else freezes the subtree and
    SIGKILLs every listed pid until it is empty, then thaws it. Waits at most `timeout_s` seconds
    for the subtree to empty (typically ~15 ms), on `cgroup.events` change notifications.

    Returns True when the subtree is gone, also when `path` does not exist (safe to call
    unconditionally, whether cgroups are available or not; `ORCHESTRA_SUP_CGROUP=off` does not
    stop it from cleaning up cgroups that exist). Returns False, logging a warning, when live
    processes remained at the deadline (the subtree is then left in place for a later call), a
    directory could not be removed, or a control file could not be read or written (an OSError,
    e.g. not root, is never raised: this runs in clean-up paths).

    Raises:
        ValueError: `path` exists but is not below `<base>/orchestra-sup/<tree>` (a
            guard against killing anything else), or the subtree contains the calling process.
    """
    if not Path(path).is_dir():
        return True
    _check_ours(Path(path))
    return _kill_and_remove_sync(Path(path), timeout_s)


def send_kill(path: Path) -> None:
    """Send the kill to every process in the cgroup subtree at `path` now, on the caller's
    thread, without waiting for it to empty or removing it (`kill_and_remove` does both):
    `cgroup.kill` (Linux >= 5.14: one write), else freeze, SIGKILL every listed pid, thaw.
    A no-op when `path` is not a cgroup directory. Never raises for the cgroup's files (an
    OSError is logged)."""
    if not path.is_dir():
        return
    killer = _Killer(path)
    try:
        killer.start()
    except OSError as exc:
        log.warning("cgroup %s: kill failed: %s", path, exc)
    finally:
        killer.finish()

"""Ownership of a tree's directories: one live tree per run directory and per state directory.

The supervisor holds an exclusive `flock` on `<run_dir>/supervisor.lock` and on
`<state_dir>/tree.lock` for its whole life and writes its pid in both. The kernel drops a lock
when the process dies however it dies, so a lock that can be taken is stale by construction and is
taken over; no pid is ever signalled or trusted to decide that.

A lock is held by an open file description, so it survives `execve` when its descriptor is
inheritable: a supervisor that re-executes itself (`supervisor.reexec`) passes both descriptors
to its new image, which takes them over with `inherit` and never lets go of either directory.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Self

from orchestra_sup.errors import ConfigError, DirBusy
from orchestra_sup.paths import Paths


class DirLock:
    """A held lock on `directory/name`; `what` names the directory in errors.

    The directory is made mode `mode` (an existing one too). The run directory must also belong
    to this process's effective uid: whoever owns it could chmod it open again, or swap a socket
    in it for their own.

    Raises `DirBusy` when a live tree holds it, `ConfigError` when the directory cannot be made
    (a file is in the way, no permission, read-only file system) or, for the run directory,
    belongs to another user.
    """

    def __init__(self, directory: Path, name: str, what: str, *, mode: int = 0o700):
        self.directory = directory
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=mode)
            if what == "run directory":
                owner = directory.stat().st_uid
                if owner != os.geteuid():
                    raise ConfigError(
                        f"{what} {directory} belongs to uid {owner}, not to uid "
                        f"{os.geteuid()} that runs the tree; pick another --run-dir"
                    )
            os.chmod(directory, mode)
            self.path = directory / name
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ConfigError(f"{what} {directory}: {exc.strerror}") from exc
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = read_owner(self.path)
            os.close(self._fd)
            raise DirBusy(what, str(directory), owner) from None
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"{os.getpid()}\n".encode())

    @classmethod
    def inherit(cls, fd: int, directory: Path, name: str, what: str) -> Self:
        """Take over the lock held by descriptor `fd`, inherited across `execve` from the image
        this process was (`supervisor.reexec`): no second open, no gap in which another tree
        could take the directory, and nothing in the directory touched. The descriptor is made
        close-on-exec again, so no child inherits it.

        Raises `ConfigError` when `fd` is not open on `directory/name`, or does not hold its
        lock (another open file holds it)."""
        self = cls.__new__(cls)
        self.directory, self.path, self._fd = directory, directory / name, fd
        try:
            held, there = os.fstat(fd), os.stat(self.path)
            if (held.st_dev, held.st_ino) != (there.st_dev, there.st_ino):
                raise ConfigError(f"{what} {directory}: descriptor {fd} is not its lock file")
            # Taking a lock this open file already holds succeeds at once; anyone else's blocks.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{what} {directory}: descriptor {fd} is not its lock") from None
        except OSError as exc:
            raise ConfigError(f"{what} {directory}: descriptor {fd}: {exc.strerror}") from exc
        os.set_inheritable(fd, False)
        return self

    def fileno(self) -> int:
        """The descriptor that holds the lock (close-on-exec unless a re-exec made it
        inheritable)."""
        return self._fd

    def release(self) -> None:
        os.close(self._fd)


class RunLock(DirLock):
    """The run directory's lock; taking it over also removes a crashed tree's stale sockets."""

    def __init__(self, run_dir: Path):
        super().__init__(run_dir, "supervisor.lock", "run directory")
        for stale in run_dir.glob("*.ipc"):
            stale.unlink(missing_ok=True)

    @classmethod
    def inherited(cls, fd: int, run_dir: Path) -> Self:
        """`DirLock.inherit` for the run directory. Its sockets are left alone: they are the
        live children's, not a crashed tree's. Raises `ConfigError` (see `inherit`)."""
        return cls.inherit(fd, run_dir, "supervisor.lock", "run directory")

    def release(self) -> None:
        for sock in self.directory.glob("*.ipc"):
            sock.unlink(missing_ok=True)
        super().release()


class StateLock(DirLock):
    """The state directory's lock: two trees on one state would each think the other's lanes
    were lost. The state directory is made mode 0700, an existing one too (systemd's
    `StateDirectory=` makes it 0755): it holds the tree's records, its sandboxes and its CURVE
    keys, which no lane's uid may read (`state.permissions`; the custodian opens it to 0711
    where lanes of their own uid must walk to their sandboxes)."""

    def __init__(self, state_dir: Path):
        super().__init__(state_dir, "tree.lock", "state directory", mode=0o700)

    @classmethod
    def inherited(cls, fd: int, state_dir: Path) -> Self:
        """`DirLock.inherit` for the state directory. Raises `ConfigError` (see `inherit`)."""
        return cls.inherit(fd, state_dir, "tree.lock", "state directory")


def read_owner(lock_path: Path) -> int | None:
    """The pid recorded by the tree that holds (or last held) a lock, for messages only."""
    try:
        return int(lock_path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def is_owned(run_dir: Path) -> bool:
    """True when a live tree holds the run directory's lock."""
    return _held(run_dir / "supervisor.lock")


def refuse_owned(state_dir: Path, run_dir: Path | None = None) -> None:
    """Raise `DirBusy` when a live tree holds the state directory or the run directory (None:
    a fresh private one, not asked about; the state directory is named first), creating,
    opening for writing and changing nothing: a `start` or `run` refused here leaves no
    directory behind. What can be taken now is taken for real by `StateLock` and `RunLock`
    later, which refuse again if a tree got there first."""
    for directory, name, what in (
        (state_dir, "tree.lock", "state directory"),
        (run_dir, "supervisor.lock", "run directory"),
    ):
        if directory is not None and _held(directory / name):
            raise DirBusy(what, str(directory), read_owner(directory / name))


def _held(lock_path: Path) -> bool:
    """True when a live process holds the flock on `lock_path`; False when none does, or the
    file does not exist or cannot be opened (then nothing can hold it for a tree of ours)."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def lock_dirs(paths: Paths, inherited: tuple[int, int] | None) -> tuple[DirLock, DirLock]:
    """Take the run and state directories' locks, or, adopting (`inherited`: the descriptors
    of the run and state locks the old image held, across a re-exec), those: no gap, and the
    children's sockets in the run directory are left alone. Raises `DirBusy` or
    `ConfigError`."""
    if inherited is not None:
        return (
            RunLock.inherited(inherited[0], paths.run_dir),
            StateLock.inherited(inherited[1], paths.state_dir),
        )
    lock = RunLock(paths.run_dir)
    try:
        return lock, StateLock(paths.state_dir)
    except BaseException:
        lock.release()
        raise

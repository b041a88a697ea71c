"""Ownership of a run directory: one live tree per run directory.

The supervisor holds an exclusive `flock` on `<run_dir>/supervisor.lock` for its whole life and
writes its pid there. The kernel drops the lock when the process dies however it dies, so a lock
that can be taken is stale by construction and is taken over; no pid is ever signalled or trusted
to decide that.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from orchestra_sup.errors import RunDirBusy, SupervisionError


class RunLock:
    """The held lock. Raises `RunDirBusy` when a live tree owns `run_dir`, `SupervisionError` when
    the directory cannot be made private (mode 0700)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        try:
            run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(run_dir, 0o700)
        except OSError as exc:
            raise SupervisionError(f"run directory {run_dir}: {exc.strerror}") from exc
        self.path = run_dir / "supervisor.lock"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = read_owner(run_dir)
            os.close(self._fd)
            raise RunDirBusy(str(run_dir), owner) from None
        for stale in run_dir.glob("*.ipc"):
            stale.unlink(missing_ok=True)
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"{os.getpid()}\n".encode())

    def release(self) -> None:
        for sock in self.run_dir.glob("*.ipc"):
            sock.unlink(missing_ok=True)
        os.close(self._fd)


def read_owner(run_dir: Path) -> int | None:
    """The pid recorded by the tree that holds (or last held) `run_dir`, for messages only."""
    try:
        return int((run_dir / "supervisor.lock").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def is_owned(run_dir: Path) -> bool:
    """True when a live tree holds the run directory's lock."""
    try:
        fd = os.open(run_dir / "supervisor.lock", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False

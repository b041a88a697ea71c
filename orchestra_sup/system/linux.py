"""Linux process-control primitives that Python's standard library does not wrap (prctl, joining
a cgroup between fork and exec), and the machine's one clock for lease deadlines."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, arg: int) -> None:
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` to this process when the thread that spawned it exits.

    It is tied to the spawning *thread* (prctl(2)), so the supervisor spawns from its loop thread,
    which lives as long as the supervisor does.
    """
    _prctl(_PR_SET_PDEATHSIG, int(sig))


def set_child_subreaper() -> None:
    """Make this process the reaper of orphaned descendants (they are reparented here)."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def cgroup_joiner(paths: list[Path], unmet: str) -> Callable[[], None]:
    """A function for a child between fork and exec (Popen's `preexec_fn`) that moves it into
    every cgroup of `paths` (writes "0" to each `cgroup.procs`), so that it, and everything it
    ever forks, is born inside whatever it does with sessions, groups or parents. Plain `os`
    calls only, on paths prepared here; it never raises: a move that fails is one line on the
    child's stderr, "orchestra-sup: <unmet>: <error>", and the command runs without it rather
    than fail its spawn."""
    files = [os.fsencode(p / "cgroup.procs") for p in paths]

    def join() -> None:
        for procs in files:
            try:
                fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, b"0")
                finally:
                    os.close(fd)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.write(2, f"orchestra-sup: {unmet}: {exc}\n".encode())

    return join


def set_no_new_privs() -> None:
    """Make this process and everything it executes unable to gain privileges (a setuid or
    file-capability program runs without them); for good, inherited across fork and exec."""
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)


def boottime() -> float:
    """Seconds on CLOCK_BOOTTIME: monotonic, counting while the machine is suspended, as etcd's
    lease clock does, and one clock for every process of the machine (a host's agent and its
    shards compare lease deadlines on it)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)

"""Linux process-control primitives that Python's standard library does not wrap (prctl)."""

from __future__ import annotations

import ctypes
import os
import signal

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


def set_no_new_privs() -> None:
    """Make this process and everything it executes unable to gain privileges (a setuid or
    file-capability program runs without them); for good, inherited across fork and exec."""
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)

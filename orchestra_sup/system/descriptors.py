"""This process's file descriptors: its open-file limit raised at start, and how many are in use.

Why raise it: systemd gives every unit a soft `RLIMIT_NOFILE` of 1024 and a hard one far above
(524288 on current systemd), keeping the soft limit low only for programs that still use
`select(2)`, which cannot watch a descriptor numbered 1024 or more. Nothing in the tree does:
asyncio, libzmq and the pidfd and cgroup waits all poll or epoll. A tree of many lanes and ctl
clients outgrows 1024, and libzmq aborts the whole process when it runs out inside its accept
of an `ipc://` connection (`ipc_listener.cpp`: EMFILE is not among the errors its accept
tolerates), so every process of the tree (the supervisor, the fork template, every child)
raises its soft limit to its hard limit first thing (`raise_limit`, as systemd's own
documentation of `LimitNOFILE=` advises such programs to do).

What is left is watched (`usage`), and `protocol.connections` keeps a process's listeners out
of libzmq's way as it nears the limit.
"""

from __future__ import annotations

import errno
import os
import resource
from dataclasses import dataclass

PROC_FDS = "/proc/self/fd"


@dataclass(frozen=True, slots=True)
class Usage:
    """Descriptors `open` in this process against its soft `limit` (the one the kernel
    refuses a new descriptor at, with EMFILE)."""

    open: int
    limit: int

    @property
    def free(self) -> int:
        """Descriptors this process can still open (0 at the limit, never negative)."""
        return max(0, self.limit - self.open)


def raise_limit() -> tuple[int, int]:
    """Raise this process's soft `RLIMIT_NOFILE` to its hard limit; returns (soft before, soft
    now). Never raises: a limit the kernel will not take (a hard limit of "unlimited" above
    `fs.nr_open`) is left as it was, and (before, before) returned."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, hard


def usage() -> Usage:
    """How many descriptors this process has open (read from /proc/self/fd, whose own listing
    descriptor is not counted) against its soft limit, read now (another process may have
    lowered it since: `prlimit --pid`). At the limit already the listing itself cannot be
    opened: that is reported as `open == limit`. Raises nothing else but what /proc raises
    when it is not mounted (`OSError`)."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    try:
        listed = len(os.listdir(PROC_FDS))
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return Usage(open=limit, limit=limit)
        raise
    return Usage(open=listed - 1, limit=limit)

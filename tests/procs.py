"""Process checks shared by the tests: waiting on a pidfd, never polling."""

from __future__ import annotations

import os
import select


def dead(pid: int, timeout_s: float = 5.0) -> bool:
    """Block until process `pid` has terminated (exited or zombie); False if still alive after
    `timeout_s`. Waits on a pidfd, which becomes readable when the process terminates."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout_s)
        return bool(readable)
    finally:
        os.close(fd)

"""Which session's program was running when the coordinator process died.

A program runs on the coordinator's loop, one step (one `send` into its coroutine) at a time. A
step that never returns (a CPU loop, a blocking call: the watchdog kills the process) or that
ends the process (`os._exit`) leaves no trace in the program's own state. `Marker` leaves one: a
memory-mapped file of the coordinator's state directory holds the id of the session whose step
is running, written before each step and cleared after it. A store to a shared mapping is a
memory write, no system call, and it survives the process (the page belongs to the file), so the
next process reads who was stepping when the last one died (`blamed`), and the seat counts it
against that session alone (`seat.MAX_WEDGES`).
"""

from __future__ import annotations

import logging
import mmap
import os
import stat
import types
from collections.abc import Coroutine, Generator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SLOT_BYTES = 64
"""The marker's size: a session id (12 hex digits today) fits with room."""


class Marker:
    """The marker file at `path` (created, `SLOT_BYTES` long). `blamed` is the session id it
    held when opened: whose step was running when the last process died (None: no step)."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{path} is not a regular file")
            if os.fstat(fd).st_size != SLOT_BYTES:
                os.ftruncate(fd, SLOT_BYTES)
            self._map = mmap.mmap(fd, SLOT_BYTES)
        finally:
            os.close(fd)
        held = bytes(self._map).rstrip(b"\0").decode(errors="replace")
        self.blamed = held or None
        self.clear()

    def mark(self, session: str) -> None:
        data = session.encode()[:SLOT_BYTES]
        self._map[:SLOT_BYTES] = data.ljust(SLOT_BYTES, b"\0")

    def clear(self) -> None:
        self._map[:SLOT_BYTES] = bytes(SLOT_BYTES)

    @classmethod
    def open(cls, path: Path) -> Marker | None:
        """The marker at `path`, or None (logged) when it cannot be one: a directory, a link,
        an unwritable file there. Without a marker no session is ever blamed; the tree runs."""
        try:
            return cls(path)
        except OSError as exc:
            log.error("no stepping marker at %s (%s): no program is blamed for a wedge", path, exc)
            return None


@types.coroutine
def stepped(
    coro: Coroutine[Any, Any, Any], marker: Marker, session: str
) -> Generator[Any, Any, Any]:
    """Run `coro` with `marker` naming `session` during each of its steps (and empty between
    them); what it returns or raises is what this returns or raises. An exception thrown into
    the wait (a task's cancellation) is thrown into `coro`, as `await` would."""
    value: Any = None
    error: BaseException | None = None
    while True:
        marker.mark(session)
        try:
            awaited = coro.throw(error) if error is not None else coro.send(value)
        except StopIteration as stop:
            return stop.value
        finally:
            marker.clear()
        try:
            value, error = (yield awaited), None
        except BaseException as exc:  # the wait's outcome goes into the program, as await does
            value, error = None, exc

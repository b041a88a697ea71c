"""The state disk's reserve: below it the tree refuses new work, and above it again resumes.

A full state disk is a state, not a crash (issue 22). The store already survives a commit that
fails for want of space (`state.store`: the batch is kept and retried, `degraded` refuses new
work); the reserve keeps the tree from getting there. While the file system holding the state
directory has less free space than `[state] min_free`, the coordinator refuses new plans and
new lanes in one line, and keeps everything already accepted running: the reserve is the room
that work has to finish and be recorded in. Nothing latches: the first check after space comes
back accepts again.

`min_free` is bytes (an int) or a share of the file system ("5%", the flood-stage watermark
at which Elasticsearch stops accepting writes, `cluster.routing.allocation.disk.watermark.
flood_stage`). Free space is `statvfs`'s `f_bavail` (what an unprivileged writer may still use)
times `f_frsize`, read afresh at every check: one syscall of about a microsecond, next to the
fsync that records what it admits, and never a scan. A reading kept for a second would let
a burst of submissions through after the disk filled.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import msgspec

from orchestra_sup.errors import ConfigError, StateError

DEFAULT_MIN_FREE = "5%"
MAX_BYTES = 1 << 60
"""The largest reserve in bytes (an exbibyte): beyond it a figure is a typing mistake."""

_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


class MinFree(msgspec.Struct, frozen=True, kw_only=True):
    """`[state] min_free` parsed: `bytes` (0: none), or a `percent` of the file system's size
    (0.0: none). One of the two is set."""

    bytes: int = 0
    percent: float = 5.0

    def of(self, total_bytes: int) -> int:
        """The reserve in bytes on a file system of `total_bytes`."""
        return self.bytes or int(total_bytes * self.percent / 100.0)

    def text(self) -> str:
        return f"{self.percent:g}%" if not self.bytes else str(self.bytes)


def parse_min_free(value: object) -> MinFree:
    """`[state] min_free` as given: an int of bytes (>= 0) or a string "N%" (0 <= N < 100).

    Raises `ConfigError` naming the value for anything else."""
    if isinstance(value, bool):
        raise ConfigError(f"[state] min_free = {value!r}: give bytes (an int) or a share, '5%'")
    if isinstance(value, int):
        if not 0 <= value <= MAX_BYTES:
            raise ConfigError(f"[state] min_free = {value}: give 0 to 2**60 bytes")
        return MinFree(bytes=value, percent=0.0)
    if isinstance(value, str) and (match := _PERCENT.match(value)):
        percent = float(match.group(1))
        if percent >= 100:
            raise ConfigError(f"[state] min_free = {value!r}: a share must be below 100%")
        return MinFree(bytes=0, percent=percent)
    raise ConfigError(f"[state] min_free = {value!r}: give bytes (an int) or a share, '5%'")


class DiskSpace(msgspec.Struct, frozen=True, kw_only=True):
    """One reading of the state disk, bytes: `free` (available to this writer), `total`,
    `min_free` (the reserve in force), and `short` (free is below the reserve)."""

    free: int
    total: int
    min_free: int

    @property
    def short(self) -> bool:
        return self.free < self.min_free

    def text(self) -> str:
        return f"{_size(self.free)} free of {_size(self.total)} (reserve {_size(self.min_free)})"


class DiskReserve:
    """The reserve of the file system holding `path`, kept as `min_free` (`MinFree`).

    `space()` reads it; `check()` raises `StateError` while the
    disk is short, naming the path, the free space and the reserve. A `path` that cannot be
    read (`statvfs` fails) reads as short: a state directory the tree cannot see is no place
    to accept work into."""

    def __init__(self, path: Path, min_free: MinFree) -> None:
        self.path = path
        self.min_free = min_free

    def is_short(self) -> bool:
        return self.space().short

    def check(self) -> None:
        space = self.space()
        if space.short:
            raise StateError(
                f"state disk nearly full: {space.text()} at {self.path}; new plans and lanes "
                f"are refused until space is freed ([state] min_free = {self.min_free.text()})"
            )

    def space(self) -> DiskSpace:
        try:
            st = os.statvfs(self.path)
        except OSError:
            return DiskSpace(free=0, total=0, min_free=1)
        total = st.f_blocks * st.f_frsize
        return DiskSpace(
            free=st.f_bavail * st.f_frsize, total=total, min_free=self.min_free.of(total)
        )


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"

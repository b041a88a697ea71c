"""Finished lanes' sandboxes, removed once `[retention] sandboxes_s` has passed (issue 22).

A shard tells its sandboxes' maker (the custodian, or on a host its mirror) when one of its
lanes ended (`SandboxDone`, sent once the lane's result is in the shard's outbox). The maker
marks it: an empty file `<sandboxes>/.ended/<lane>`, whose mtime is when. Every `every_s`, a
sandbox whose mark is older than `sandboxes_s` is removed, then the record of its base commit
beside it (`workspace.base_record`), then its mark; a mark with no sandbox goes too, with its
record if there is one. So a live lane's sandbox is never touched (it has no mark: a lane moved
to the next generation of its shard by a rollover is not ended), and what is removed, and when,
survives a restart of the maker (the marks are files, next to the sandboxes).

Removal runs on a thread, never on the loop. A sandbox the lane made hard to remove (a
directory without write permission) is opened up as it is walked (`_opened`); one that still
cannot be removed is logged and tried again at the next run.

Not covered: a lane whose shard died with it never says it ended; its sandbox stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestra_sup.custodian.workspace import base_record

log = logging.getLogger(__name__)

ENDED = ".ended"
"""The directory of the marks, in the sandboxes' own (a lane id never starts with ".")."""


def mark_ended(sandboxes: Path, lane: str) -> None:
    """Mark lane `lane`'s sandbox ended now (blocking: run it off the loop). A second mark
    keeps the first's time."""
    marks = sandboxes / ENDED
    marks.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(marks / lane, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    os.close(fd)


def prune(sandboxes: Path, keep_s: float, now: float | None = None) -> list[str]:
    """Remove the sandboxes marked ended longer than `keep_s` seconds before `now` (default:
    the wall clock), then their base records and their marks; the lanes whose sandboxes went.
    Blocking: run it off the loop. A sandbox that cannot be removed is logged, and its mark
    kept for the next run."""
    marks = sandboxes / ENDED
    now = time.time() if now is None else now
    gone: list[str] = []
    try:
        entries = list(os.scandir(marks))
    except FileNotFoundError:
        return gone
    for entry in entries:
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime < keep_s:
                continue
            sandbox = sandboxes / entry.name
            if os.path.lexists(sandbox):
                shutil.rmtree(sandbox, onerror=_opened)
                gone.append(entry.name)
            with contextlib.suppress(FileNotFoundError):  # the mark goes last: a run killed
                os.unlink(base_record(sandbox))  # here is finished by the next
            os.unlink(entry.path)
        except OSError as exc:
            log.warning("sandboxes: lane %s's sandbox stays for now: %s", entry.name, exc)
    return gone


async def run(
    sandboxes: Path, keep_s: float, every_s: float, short: Callable[[], bool] = lambda: False
) -> None:
    """`prune` every `every_s` seconds, until cancelled; while `short()` (the state disk has
    less free space than `[state] min_free`), every ended lane's sandbox goes at once,
    whatever `keep_s` says: the room is for work the tree accepted, not for what ended."""
    while True:
        await asyncio.sleep(every_s)
        hurry = await asyncio.to_thread(short)
        gone = await asyncio.to_thread(prune, sandboxes, 0.0 if hurry else keep_s)
        if gone:
            why = " now: the state disk is short of its reserve" if hurry else ""
            log.info("sandboxes: %d finished lanes' sandboxes removed%s", len(gone), why)


def _opened(func: Any, path: str, _exc: Any) -> None:
    """`rmtree`'s error handler: give the directory holding `path` (and `path`, if it is one)
    the owner's full rights, and try once more; raises what that raises."""
    parent = os.path.dirname(path)
    os.chmod(parent, stat.S_IRWXU)
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, stat.S_IRWXU)
    func(path)

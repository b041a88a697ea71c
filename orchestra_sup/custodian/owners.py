"""Which uid owns each sandbox: the uid its lane's commands run as (`laneuser`).

With uids of their own (`laneuser.decide`), every sandbox the custodian hands out belongs to a
uid of the lanes' range, with the group of the same number: one it makes, or finds owned by
someone else (made under `lane_user = "tree"`, or by an older release). The uid is the next of
the range, recorded in `<sandboxes>/.next-uid` (0600) before it is used, and never below the
highest any sandbox there has: a uid is never given twice in one state directory, so no lane
reads what another left behind, even after that one's sandbox was removed. Its whole tree is
chowned (symlinks themselves, never followed, walked by descriptor: nothing in it can redirect
the walk), the top directory last and made 0700: a sandbox whose top belongs to a lane's uid is
wholly that uid's.

Without, sandboxes stay as made: the tree's.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestra_sup.state.permissions import PRIVATE_DIR, PRIVATE_FILE
from orchestra_sup.system.laneuser import FIRST_UID, LAST_UID, is_lane_uid

__all__ = ["SandboxOwners"]

_RECORD = ".next-uid"


class SandboxOwners:
    """The owners of the sandboxes in directory `sandboxes`; `own_uids`: whether each gets a uid
    of its own. Not thread-safe: the custodian claims one sandbox at a time (its ordered queue).
    """

    def __init__(self, sandboxes: Path, own_uids: bool):
        self.sandboxes = sandboxes
        self.own_uids = own_uids
        self._next: int | None = None  # read on first use

    def claim(self, sandbox: Path) -> int:
        """The uid `sandbox` (a directory in `sandboxes`) runs its lane as: with own uids, a
        lane's uid, given now if it has none yet; else its owner as it is. Blocking (it may
        walk the whole tree): run it off the loop.

        Raises `OSError` when the sandbox cannot be chowned or the record written, and
        `RuntimeError` when the range is spent (`laneuser.LAST_UID`)."""
        owner = os.lstat(sandbox).st_uid
        if not self.own_uids or is_lane_uid(owner):
            return owner
        uid = self._take()
        _chown_tree(sandbox, uid)
        return uid

    def _take(self) -> int:
        if self._next is None:
            self._next = max(FIRST_UID, self._recorded(), self._highest() + 1)
        uid = self._next
        if uid > LAST_UID:
            raise RuntimeError(f"every lane uid up to {LAST_UID} was given in {self.sandboxes}")
        self._record(uid + 1)
        self._next = uid + 1
        return uid

    def _recorded(self) -> int:
        try:
            return int((self.sandboxes / _RECORD).read_text())
        except (OSError, ValueError):
            return 0

    def _highest(self) -> int:
        owners = [0]
        for entry in os.scandir(self.sandboxes):
            uid = entry.stat(follow_symlinks=False).st_uid
            if is_lane_uid(uid):
                owners.append(uid)
        return max(owners)

    def _record(self, value: int) -> None:
        """Write `value` durably (temporary file, fsync, rename) before the uid is used."""
        final = self.sandboxes / _RECORD
        partial = final.with_name(_RECORD + ".partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE)
        try:
            os.write(fd, f"{value}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(partial, final)


def _chown_tree(top: Path, uid: int) -> None:
    """Give everything under `top` to `uid` and group `uid`, by descriptor (never following a
    symlink), then `top` itself, made 0700."""
    for _dir, dirs, files, dir_fd in os.fwalk(top, follow_symlinks=False):
        for name in (*dirs, *files):
            os.chown(name, uid, uid, dir_fd=dir_fd, follow_symlinks=False)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, PRIVATE_DIR)
        os.fchown(fd, uid, uid)
    finally:
        os.close(fd)

"""Who a lane's commands run as, and what a lane must reach on the host to run at all.

A lane runs as its sandbox's owner. When the tree runs as root, the custodian gives each new
sandbox a uid of its own (`FIRST_UID`..`LAST_UID`, never given twice in one state directory:
`custodian.owners`), with a group of the same number and no other group; so, whatever bubblewrap
does or fails to do, a lane cannot read the tree's state (files 0600, directories 0700:
`state.permissions`), another lane's sandbox (0700, another uid), the keys or the run
directory's sockets. docs/adr/0016-lanes-see-only-their-sandbox.md says why.

`[isolation] lane_user` says whether sandboxes get those uids (`decide`):

- "auto" (default): yes when the tree runs as root and either lanes run under bubblewrap (its
  mounts give the lane's uid its interpreter, object store, sandbox and inbox, whatever the
  host's modes on the way to them) or, in mode "none", such a uid can reach each of them on the
  host (`impassable`); else lanes run as the tree's uid, and `doctor`, the custodian's log and
  each lane's transcript say so.
- "dynamic": yes, always (refused when the tree is not root: `check`), even where the lane's
  uid cannot reach the interpreter (`$ORCHESTRA_PYTHON` then fails in the lane).
- "tree": no: lanes run as the tree's uid.

The range is the one systemd documents as unused (UIDS-GIDS.md: 0x70000000..0x7FFDFFFF), above
regular users, DynamicUser= and container ranges; none of its uids has a passwd entry.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import msgspec

from orchestra_sup.errors import ConfigError

__all__ = [
    "FIRST_UID",
    "LANE_USERS",
    "LAST_UID",
    "Decision",
    "LaneUser",
    "check",
    "decide",
    "impassable",
    "is_lane_uid",
    "lane_needs",
    "object_stores",
    "python_paths",
]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""This release's `orchestra_sup/` (this module is `orchestra_sup/system/laneuser.py`)."""

LANE_USERS = ("auto", "dynamic", "tree")
"""What `[isolation] lane_user` may say."""

LaneUser = Literal["auto", "dynamic", "tree"]

FIRST_UID = 0x7000_0000
"""The first uid (and gid) a sandbox may be given: 1879048192."""

LAST_UID = 0x7FFD_FFFF
"""The last one: 2147352575 (268 million sandboxes per state directory)."""


def is_lane_uid(uid: int) -> bool:
    """Whether `uid` is in the lanes' range (`FIRST_UID`..`LAST_UID`)."""
    return FIRST_UID <= uid <= LAST_UID


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """Whether sandboxes get a uid of their own (`own_uids`), and why, in words (`reason`)."""

    own_uids: bool
    reason: str


def check(setting: str) -> None:
    """Refuse a `lane_user` this tree cannot honour.

    Raises:
        ConfigError: `setting` is not one of `LANE_USERS`, or is "dynamic" and this process is
            not root (only root may run a command as another uid).
    """
    if setting not in LANE_USERS:
        raise ConfigError(
            f"[isolation] lane_user = {setting!r}: expected one of {', '.join(LANE_USERS)}"
        )
    if setting == "dynamic" and os.geteuid() != 0:
        raise ConfigError(
            f'[isolation] lane_user = "dynamic": the tree runs as uid {os.geteuid()}, and only '
            'root can run lanes as uids of their own (use "auto" or "tree")'
        )


def decide(setting: str, needs: Iterable[tuple[Path, bool]]) -> Decision:
    """Whether sandboxes get uids of their own, for the resolved `lane_user = setting`
    (`system.isolation.resolve_lane_user`: "auto" is left only in mode "none"), given what a
    lane must reach on the host (`lane_needs`: each path, and whether it must list it): under
    "auto", yes only when a uid of the range can reach each of them (`impassable`). Never
    raises (`check` refuses bad settings first)."""
    if os.geteuid() != 0:
        return Decision(own_uids=False, reason=f"the tree runs as uid {os.geteuid()}, not root")
    if setting == "tree":
        return Decision(own_uids=False, reason='lane_user = "tree"')
    if setting == "dynamic":
        return Decision(own_uids=True, reason='lane_user = "dynamic", the tree is root')
    for path, listed in needs:
        blocked = impassable(path, FIRST_UID, listed=listed)
        if blocked is not None:
            bits = stat.S_IMODE(os.stat(blocked).st_mode)
            return Decision(
                own_uids=False,
                reason=f"in mode none a lane's uid could not reach {path} "
                f"({blocked} is {bits:04o})",
            )
    return Decision(own_uids=True, reason="the tree is root and a lane's uid reaches what it needs")


def impassable(path: Path, uid: int, *, listed: bool = True) -> Path | None:
    """The first directory on the way to `path` (resolved) that `uid`, with the group of the
    same number and no other, may not pass through (search), or `path` itself when that uid may
    not read it (`listed`: list it, for a directory; else only pass through it); None when it
    can. Decided from the mode bits, as the kernel would for such a uid: a uid of the lanes'
    range is named in no ACL. A path that does not exist is not in the way (None)."""
    real = Path(os.path.realpath(path))
    chain = [*reversed(real.parents), real]
    for step in chain:
        try:
            st = os.stat(step)
        except OSError:
            return None
        if st.st_uid == uid:
            shift = 6
        elif st.st_gid == uid:
            shift = 3
        else:
            shift = 0
        bits = (st.st_mode >> shift) & 0o7
        if step != real or (not listed and stat.S_ISDIR(st.st_mode)):
            needed = 0o1  # search
        elif stat.S_ISDIR(st.st_mode):
            needed = 0o5  # read and search
        else:
            needed = 0o4
        if bits & needed != needed:
            return step
    return None


def python_paths() -> list[Path]:
    """What this interpreter needs to run (it is the lanes' `$ORCHESTRA_PYTHON`): its prefixes
    (a venv's and the base installation's), the directory of its real executable, the
    directories of its import path, and this release's own package directory, resolved.
    Existing directories only.

    The package directory is named on its own because an editable install (`pip install -e`,
    as `make` sets up) finds it through an import hook, not through the import path: a
    checkout under `/tmp` or a home directory (private in a lane) left a lane's
    `$ORCHESTRA_PYTHON -m orchestra_sup` unable to import it. Only `orchestra_sup/` itself
    is named, not the checkout around it, which may hold the tree's state.

    Not the first entry of the import path when it is the directory the process was started
    from (`python -m`, `-c`: its working directory; not so under `-P`): a tree started from
    `/tmp/x` would otherwise hand every lane `/tmp/x`, and whatever lies in it (a state
    directory under it did)."""
    entries = sys.path if sys.flags.safe_path else sys.path[1:]
    found = [
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        *(p for p in entries if p and os.path.isabs(p)),
        _PACKAGE_DIR,
    ]
    real = dict.fromkeys(Path(os.path.realpath(p)) for p in found)
    return [p for p in real if p.is_dir()]


def object_stores(workspace: Path) -> list[Path]:
    """The object store a `git clone --shared` sandbox borrows (docs/adr/0002): the workspace's
    `.git/objects`, as the tree knows its workspace, resolved, when it is a directory; else
    nothing. Never raises.

    Never read from the sandbox's own `.git/objects/info/alternates`: the lane writes that
    file, and a path it named there would be mounted into its next command, over the very
    directories isolation hides (an attacker read the tree's CURVE secret key and steered it
    through `ctl.ipc` that way)."""
    objects = workspace / ".git" / "objects"
    return [Path(os.path.realpath(objects))] if objects.is_dir() else []


def lane_needs(state_dir: Path, workspace: Path) -> list[tuple[Path, bool]]:
    """What a lane must reach on the host to run, besides its sandbox and inbox (which the tree
    hands to its uid), each with whether it must list it: the interpreter (`python_paths`:
    Python lists its import path) and the object store (`object_stores`), and the way to the
    state directory, in which its sandbox and inbox lie (passed through only)."""
    listed = [(path, True) for path in (*python_paths(), *object_stores(workspace))]
    return [*listed, (Path(os.path.realpath(state_dir)).parent, False)]

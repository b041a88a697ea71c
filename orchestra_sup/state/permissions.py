"""The modes of the tree's files on disk: nobody but the tree's uid reads its state.

Every file the tree keeps in its state directory is 0600 (LMDB environments' files, `tree.log`,
`tree.lock`, the inboxes, the keys) and every directory 0700, whatever the umask, the mode an
existing directory had (systemd's `StateDirectory=` makes it 0755) or an older release left
behind; the run directory is 0700 and its sockets 0600 (`supervisor.runlock`, the endpoints).
A lane that runs as a uid of its own (`laneuser`) reads none of it, bubblewrap or not.

Two exceptions, only where lanes run as uids of their own in mode "none" (`PASSAGE`): the state
directory and its `sandboxes` and `inboxes` directories are 0711, so that a lane can walk to its
own sandbox and inbox by name, but list none of them; each entry keeps its own mode (a sandbox
0700 and owned by its lane's uid, an inbox 0640 with its lane's group).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["PASSAGE", "PRIVATE_DIR", "PRIVATE_FILE", "private_dir", "private_file"]

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
PASSAGE = 0o711
"""A directory others may pass through to an entry they know the name of, never list."""


def private_dir(path: Path, mode: int = PRIVATE_DIR) -> Path:
    """Make directory `path` (and missing parents, with the default mode) and set its mode to
    exactly `mode` (default 0700), an existing one too. Returns `path`.

    Raises `OSError` when it cannot be made or is not a directory (`FileExistsError`,
    `NotADirectoryError`), or its mode cannot be set (not its owner)."""
    path.mkdir(parents=True, exist_ok=True, mode=mode)
    os.chmod(path, mode)
    return path


def private_file(path: Path, mode: int = PRIVATE_FILE) -> Path:
    """Make file `path` if missing (never truncating it) and set its mode to exactly `mode`
    (default 0600). Returns `path`. Raises `OSError` when it cannot be made or chmod'ed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return path

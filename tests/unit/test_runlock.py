"""The run directory `RunLock` takes is private to the tree's owner (issue 9, ADR 0012)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestra_sup.errors import ConfigError
from orchestra_sup.supervisor.runlock import RunLock, StateLock


def test_an_open_run_dir_of_ours_is_made_0700(tmp_path: Path) -> None:
    """A run directory given 0755 (or made under a lax umask) is 0700 once the lock is held."""
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    os.chmod(run, 0o755)
    lock = RunLock(run)
    try:
        assert stat.S_IMODE(run.stat().st_mode) == 0o700
        assert stat.S_IMODE((run / "supervisor.lock").stat().st_mode) == 0o600
    finally:
        lock.release()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")
def test_a_run_dir_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    """Its owner could open it again or swap a socket in it: refused in one line, untouched."""
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    try:
        os.chown(run, 65534, 65534)
    except OSError as exc:  # root in a user namespace (a sandboxed lane) where 65534 is unmapped
        pytest.skip(f"cannot give a directory to uid 65534 here: {exc.strerror}")
    with pytest.raises(ConfigError, match="belongs to uid 65534") as info:
        RunLock(run)
    assert "\n" not in str(info.value)
    assert list(run.iterdir()) == []


def test_a_state_directory_it_creates_is_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    lock = StateLock(state)
    try:
        assert state.stat().st_mode & 0o777 == 0o700
    finally:
        lock.release()

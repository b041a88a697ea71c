"""The run directory `RunLock` takes is private to the tree's owner (issue 9, ADR 0012)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestra_sup.errors import ConfigError, DirBusy
from orchestra_sup.supervisor.runlock import RunLock, StateLock, refuse_owned


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


def test_refusing_a_live_trees_directory_creates_nothing(tmp_path: Path) -> None:
    """A held state or run directory is refused, naming it, and neither the other directory
    nor a missing one is made; free directories pass, still untouched."""
    state, run = tmp_path / "state", tmp_path / "run"
    refuse_owned(state, run)
    assert not state.exists() and not run.exists()
    held = StateLock(state)
    try:
        with pytest.raises(DirBusy, match=f"state directory {state} is owned by a live tree"):
            refuse_owned(state, run)
        assert not run.exists()
    finally:
        held.release()
    held = RunLock(run)
    try:
        with pytest.raises(DirBusy, match=f"run directory {run} is owned"):
            refuse_owned(tmp_path / "other", run)
        assert not (tmp_path / "other").exists()
        refuse_owned(state)  # the run directory not asked about: a private one is made later
    finally:
        held.release()

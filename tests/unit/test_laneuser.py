"""Who a lane runs as: the reachability of what it needs, and the `lane_user` decision."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestra_sup.errors import ConfigError
from orchestra_sup.system import laneuser
from orchestra_sup.system.laneuser import FIRST_UID, check, decide, impassable


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory under /tmp that any uid may pass (pytest's own tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="osup-laneuser-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_impassable_names_the_first_directory_a_uid_cannot_pass(open_dir: Path) -> None:
    """From the mode bits, as the kernel decides for a uid with no name and no group: the
    first directory closed to it on the way, or the path itself when it cannot read (list) it;
    a directory it only passes through needs search alone."""
    closed = open_dir / "closed"
    inner = closed / "inner"
    inner.mkdir(parents=True)
    closed.chmod(0o700)
    assert impassable(inner, FIRST_UID) == closed
    closed.chmod(0o711)
    assert impassable(inner, FIRST_UID) is None
    assert impassable(closed, FIRST_UID) == closed  # it cannot list it
    assert impassable(closed, FIRST_UID, listed=False) is None
    secret = open_dir / "secret"
    secret.write_text("x")
    secret.chmod(0o600)
    assert impassable(secret, FIRST_UID) == secret
    if os.geteuid() == 0:
        os.chown(secret, FIRST_UID, -1)
        assert impassable(secret, FIRST_UID) is None  # its owner reads it
    assert impassable(open_dir / "missing", FIRST_UID) is None


def test_impassable_follows_a_symlink_to_where_it_leads(open_dir: Path) -> None:
    """What is reached is the link's target: the modes on the way there count."""
    target = open_dir / "target"
    (target / "in").mkdir(parents=True)
    target.chmod(0o700)
    (open_dir / "link").symlink_to(target)
    assert impassable(open_dir / "link" / "in", FIRST_UID) == target


def test_decide_follows_the_setting_and_the_way_to_what_a_lane_needs(open_dir: Path) -> None:
    """As root: "tree" never, "dynamic" always; "auto" (left only in mode none) only when a
    lane's uid reaches everything it needs, else the reason names the closed directory."""
    if os.geteuid() != 0:
        pytest.skip("only root runs lanes as other uids")
    reachable = [(open_dir, True)]
    assert not decide("tree", reachable).own_uids
    assert decide("dynamic", [(Path("/root"), True)]).own_uids
    assert decide("auto", reachable).own_uids
    closed = open_dir / "venv"
    closed.mkdir(mode=0o700)
    no = decide("auto", [*reachable, (closed, True)])
    assert not no.own_uids
    assert str(closed) in no.reason and "0700" in no.reason


def test_a_tree_not_run_as_root_keeps_its_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not root: lanes run as the tree's uid whatever the setting, and "dynamic" is refused
    where the config is checked (one line that says why)."""
    monkeypatch.setattr(laneuser.os, "geteuid", lambda: 1000)
    decision = decide("dynamic", [])
    assert not decision.own_uids and "uid 1000, not root" in decision.reason
    with pytest.raises(ConfigError, match='lane_user = "dynamic": the tree runs as uid 1000'):
        check("dynamic")
    check("auto")
    with pytest.raises(ConfigError, match="expected one of auto, dynamic, tree"):
        check("nobody")


def test_lane_needs_the_way_to_the_state_directory_only_to_pass(tmp_path: Path) -> None:
    """The interpreter and the object store are listed; the state directory's parent only
    passed through (its sandbox and inbox are handed to the lane's uid)."""
    workspace = tmp_path / "ws"
    (workspace / ".git" / "objects").mkdir(parents=True)
    needs = laneuser.lane_needs(tmp_path / "state", workspace)
    assert (Path(os.path.realpath(workspace / ".git" / "objects")), True) in needs
    assert needs[-1] == (Path(os.path.realpath(tmp_path)), False)
    assert all(listed for _path, listed in needs[:-1])

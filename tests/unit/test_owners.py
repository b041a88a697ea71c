"""Each sandbox belongs to a uid of its own, never given twice (`custodian.owners`), and the
custodian still reads and commits a sandbox another uid owns (`custodian.workspace`)."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from orchestra_sup.custodian.owners import SandboxOwners
from orchestra_sup.custodian.workspace import open_workspace
from orchestra_sup.system.laneuser import FIRST_UID

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another uid needs root")


def _sandbox(parent: Path, name: str) -> Path:
    top = parent / name
    (top / "sub").mkdir(parents=True)
    (top / "sub" / "file").write_text("x")
    return top


def test_each_sandbox_gets_the_next_uid_and_all_of_it_is_that_uids(tmp_path: Path) -> None:
    """Consecutive uids from `FIRST_UID`; every file and directory is chowned, a symlink
    itself and never its target; the top is 0700; a sandbox already a lane's keeps its uid."""
    outside = tmp_path / "outside"
    outside.write_text("the tree's")
    sandboxes = tmp_path / "sandboxes"
    first, second = _sandbox(sandboxes, "a"), _sandbox(sandboxes, "b")
    (first / "sub" / "out").symlink_to(outside)
    owners = SandboxOwners(sandboxes, own_uids=True)
    assert owners.claim(first) == FIRST_UID
    assert owners.claim(second) == FIRST_UID + 1
    assert owners.claim(first) == FIRST_UID  # asked again (a lane restarted): the same
    for path in (first, first / "sub", first / "sub" / "file", first / "sub" / "out"):
        st = os.lstat(path)
        assert (st.st_uid, st.st_gid) == (FIRST_UID, FIRST_UID), path
    assert os.stat(outside).st_uid == 0
    assert stat.S_IMODE(os.stat(first).st_mode) == 0o700


def test_a_uid_is_never_given_twice_in_one_state_directory(tmp_path: Path) -> None:
    """Across a custodian's restart, and after the sandbox that had the highest uid is gone
    (its files elsewhere, e.g. in /tmp in mode none, would be the next lane's to read)."""
    sandboxes = tmp_path / "sandboxes"
    owners = SandboxOwners(sandboxes, own_uids=True)
    assert owners.claim(_sandbox(sandboxes, "a")) == FIRST_UID
    last = _sandbox(sandboxes, "b")
    assert owners.claim(last) == FIRST_UID + 1
    shutil.rmtree(last)
    again = SandboxOwners(sandboxes, own_uids=True)
    assert again.claim(_sandbox(sandboxes, "c")) == FIRST_UID + 2
    assert stat.S_IMODE(os.stat(sandboxes / ".next-uid").st_mode) == 0o600


def test_without_own_uids_a_sandbox_stays_the_trees(tmp_path: Path) -> None:
    """`lane_user = "tree"`: nothing is chowned."""
    top = _sandbox(tmp_path, "a")
    assert SandboxOwners(tmp_path, own_uids=False).claim(top) == 0
    assert os.stat(top / "sub" / "file").st_uid == 0


def test_the_custodian_reads_and_commits_a_sandbox_a_lane_uid_owns(tmp_path: Path) -> None:
    """git refuses a repository another uid owns ("dubious ownership"); the custodian's
    read-only questions trust the sandbox by name, so a lane re-asking for its sandbox gets it
    back, and its work lands."""
    repo = tmp_path / "ws"
    repo.mkdir()
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "seed"]):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True
        )

    async def go() -> tuple[str, str | None]:
        workspace = await open_workspace(repo, tmp_path / "state")
        dest = tmp_path / "state" / "sandboxes" / "L"
        path, base = await workspace.create_sandbox("L", dest)
        SandboxOwners(dest.parent, own_uids=True).claim(dest)
        (dest / "new.txt").write_text("work\n")
        again, same = await workspace.create_sandbox("L", dest)
        assert (again, same) == (path, base)
        return base, await workspace.commit_sandbox("L", dest, "lane work")

    base, commit = asyncio.run(go())
    assert commit is not None and commit != base

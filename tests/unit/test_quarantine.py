"""A lane's commit that comes back from a host as a git bundle (`custodian.quarantine`,
invariant 16), against real git: landed when it is one checked commit on its base, refused
in one line, the workspace untouched and no quarantine ref left, when it is not."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from orchestra_sup.custodian.quarantine import MAX_BUNDLE_BYTES, QUARANTINE, land_bundle
from orchestra_sup.custodian.workspace import Workspace, open_workspace
from orchestra_sup.errors import WorkspaceError
from tests.unit.test_workspace import git, make_repo

LANE = "l-7f3a"
TRAILER = f"Orchestra-Lane: {LANE}"


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    repo = make_repo(tmp_path / "repo", {"a.txt": "one\n"})
    return asyncio.run(open_workspace(repo, tmp_path / "state"))


def host_clone(ws: Workspace, tmp_path: Path) -> Path:
    """What a host's mirror is, for these tests: a clone of the workspace somewhere else."""
    mirror = tmp_path / "host"
    subprocess.run(["git", "clone", "-q", str(ws.root), str(mirror)], check=True)
    return mirror


def bundle_of(mirror: Path, base: str, tmp_path: Path, head: str = "HEAD") -> bytes:
    path = tmp_path / "out.bundle"
    git(mirror, "bundle", "create", str(path), head, "--not", base)
    return path.read_bytes()


def commit(mirror: Path, files: dict[str, str], message: str = f"change\n\n{TRAILER}") -> str:
    for name, text in files.items():
        (mirror / name).write_text(text)
    git(mirror, "add", "-A")
    git(mirror, "commit", "-q", "-m", message)
    return git(mirror, "rev-parse", "HEAD")


def quarantined(ws: Workspace) -> str:
    return git(ws.root, "for-each-ref", QUARANTINE)


def test_one_commit_on_its_base_lands_once(ws: Workspace, tmp_path: Path) -> None:
    """The bundle's commit lands by fast-forward; no quarantine ref is left; a re-send after
    the answer was lost returns the same commit without reading the bundle."""
    base = asyncio.run(ws.head())
    mirror = host_clone(ws, tmp_path)
    sha = commit(mirror, {"b.txt": "bee\n"})
    data = bundle_of(mirror, base, tmp_path)
    head = asyncio.run(land_bundle(ws, LANE, data, base))
    assert head == sha == asyncio.run(ws.head())
    assert (ws.root / "b.txt").read_text() == "bee\n"
    assert quarantined(ws) == ""
    assert asyncio.run(land_bundle(ws, LANE, b"not even a bundle", base)) == sha


def test_a_branch_that_moved_on_gets_the_change_cherry_picked(
    ws: Workspace, tmp_path: Path
) -> None:
    base = asyncio.run(ws.head())
    mirror = host_clone(ws, tmp_path)
    commit(mirror, {"b.txt": "bee\n"})
    (ws.root / "c.txt").write_text("sea\n")
    git(ws.root, "add", "c.txt")
    git(ws.root, "commit", "-q", "-m", "the branch moved")
    head = asyncio.run(land_bundle(ws, LANE, bundle_of(mirror, base, tmp_path), base))
    assert git(ws.root, "rev-list", "--count", "HEAD") == "3"
    assert head == asyncio.run(ws.head())
    assert (ws.root / "b.txt").exists() and (ws.root / "c.txt").exists()


def refused(ws: Workspace, data: bytes, base: str, match: str) -> None:
    before = asyncio.run(ws.head())
    with pytest.raises(WorkspaceError, match=match):
        asyncio.run(land_bundle(ws, LANE, data, base))
    assert asyncio.run(ws.head()) == before
    assert quarantined(ws) == ""


def test_what_is_not_one_checked_commit_on_its_base_is_refused(
    ws: Workspace, tmp_path: Path
) -> None:
    base = asyncio.run(ws.head())
    mirror = host_clone(ws, tmp_path)
    refused(ws, b"x" * (MAX_BUNDLE_BYTES + 1), base, f"over {MAX_BUNDLE_BYTES:,}")
    refused(ws, b"# v2 git bundle\ngarbage", base, "not a git bundle of one head")
    commit(mirror, {"b.txt": "bee\n"}, message="no trailer")
    refused(ws, bundle_of(mirror, base, tmp_path), base, f"lacks '{TRAILER}'")
    commit(mirror, {"b.txt": "two\n"})  # two commits on the base
    refused(ws, bundle_of(mirror, base, tmp_path), base, "must hold one commit on")
    git(mirror, "reset", "-q", "--hard", base)
    commit(mirror, {"z.txt": "z\n"}, message="elsewhere")
    elsewhere = git(mirror, "rev-parse", "HEAD")
    commit(mirror, {"b.txt": "bee\n"})
    refused(ws, bundle_of(mirror, elsewhere, tmp_path), elsewhere, "does not have")
    refused(ws, bundle_of(mirror, elsewhere, tmp_path), base, "does not have")
    with pytest.raises(WorkspaceError, match="not a lane id"):
        asyncio.run(land_bundle(ws, "../x", b"", base))


def literal_commit(mirror: Path, base: str, tree_entries: bytes) -> str:
    """A commit on `base` whose tree is `tree_entries` written as they are (no fsck), as a
    hostile host can send them."""
    tree = (
        subprocess.run(
            ["git", "-C", str(mirror), "hash-object", "-t", "tree", "-w", "--literally", "--stdin"],
            input=tree_entries,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .strip()
    )
    return git(mirror, "commit-tree", tree, "-p", base, "-m", f"hostile\n\n{TRAILER}")


def blob(mirror: Path, text: bytes) -> bytes:
    sha = (
        subprocess.run(
            ["git", "-C", str(mirror), "hash-object", "-w", "--stdin"],
            input=text,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .strip()
    )
    return bytes.fromhex(sha)


def test_objects_that_fail_fsck_never_land(ws: Workspace, tmp_path: Path) -> None:
    """A tree with a duplicate entry, and one with a `.git` entry, written raw on the host:
    git's fsck refuses them before any object enters the workspace, and nothing lands (the
    mutation of skipping `_fsck` fetches the duplicate-entry tree, which git 2.39's fetch
    does not check, and this test fails)."""
    base = asyncio.run(ws.head())
    mirror = host_clone(ws, tmp_path)
    one = blob(mirror, b"one\n")
    duplicate = b"100644 a.txt\0" + one + b"100644 a.txt\0" + one
    hostile = literal_commit(mirror, base, duplicate)
    git(mirror, "update-ref", "refs/heads/lane", hostile)
    data = bundle_of(mirror, base, tmp_path, head="refs/heads/lane")
    refused(ws, data, base, "refused by git's fsck")
    dotgit = b"100644 .git\0" + one + b"100644 a.txt\0" + one
    git(mirror, "update-ref", "refs/heads/lane", literal_commit(mirror, base, dotgit))
    refused(ws, bundle_of(mirror, base, tmp_path, head="refs/heads/lane"), base, ".git")

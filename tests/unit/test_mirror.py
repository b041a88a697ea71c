"""A host's mirror against real git (`custodian.mirror`, ADR 0021 step 5): fed by the
custodian's bundles of only what it lacks, a sandbox cloned from it, and a lane's commit made in
it going back as a bundle the custodian's quarantine lands."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from orchestra_sup.custodian.mirror import Mirror, export
from orchestra_sup.custodian.quarantine import land_bundle
from orchestra_sup.custodian.workspace import Workspace, open_workspace, trailer
from orchestra_sup.errors import BundleRefused, RemoteError
from tests.unit.test_workspace import git, make_repo

LANE = "l-host-1"


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    repo = make_repo(tmp_path / "repo", {"a.txt": "one\n"})
    return asyncio.run(open_workspace(repo, tmp_path / "state"))


def bundled(ws: Workspace, rev: str | None, have: list[str], dest: Path) -> tuple[str, bytes]:
    """`export` of `rev` for a mirror that has `have`, at `dest`: (sha, the bundle's bytes)."""
    sha, size = asyncio.run(export(ws.root, rev, have, dest))
    assert size == (dest.stat().st_size if size else 0)
    return sha, dest.read_bytes() if size else b""


def fed(ws: Workspace, tmp_path: Path, rev: str | None = None) -> tuple[Mirror, str]:
    """A fresh mirror at `tmp_path/host/mirror`, fed the commit `rev` names."""

    async def go() -> tuple[Mirror, str]:
        mirror = Mirror(tmp_path / "host" / "mirror")
        await mirror.open()
        path = tmp_path / "fed.bundle"
        sha, size = await export(ws.root, rev, await mirror.heads(), path)
        await mirror.take(sha, path if size else None)
        return mirror, sha

    return asyncio.run(go())


def commit_in(ws: Workspace, name: str, text: str) -> str:
    (ws.root / name).write_text(text)
    git(ws.root, "add", "-A")
    git(ws.root, "commit", "-q", "-m", f"add {name}")
    return git(ws.root, "rev-parse", "HEAD")


def test_a_lanes_change_goes_from_a_mirror_sandbox_back_into_the_workspace(
    ws: Workspace, tmp_path: Path
) -> None:
    mirror, sha = fed(ws, tmp_path)
    assert sha == asyncio.run(ws.head()) and asyncio.run(mirror.heads()) == [sha]
    sandbox = tmp_path / "host" / "sandboxes" / LANE
    _path, base = asyncio.run(mirror.workspace().create_sandbox(LANE, sandbox, sha))
    assert base == sha and (sandbox / "a.txt").read_text() == "one\n"
    (sandbox / "b.txt").write_text("made on the host\n")
    made = asyncio.run(mirror.workspace().make_commit(LANE, sandbox, "host change"))
    assert made is not None and made[0] == base
    bundle = asyncio.run(mirror.bundle_commit(LANE, base, made[1]))
    head = asyncio.run(land_bundle(ws, LANE, bundle, base))
    assert head == asyncio.run(ws.head()) == made[1]
    assert (ws.root / "b.txt").read_text() == "made on the host\n"
    assert trailer(LANE) in git(ws.root, "log", "-1", "--format=%B")
    assert git(mirror.root, "for-each-ref") == f"{sha} commit\trefs/mirror/head"


def test_the_custodian_sends_only_what_the_mirror_lacks(ws: Workspace, tmp_path: Path) -> None:
    """After new commits, the bundle excludes what the mirror has: smaller than a full one, and
    taken; a commit the mirror already has costs no bundle; unknown shas in `have` are
    ignored."""
    mirror, first = fed(ws, tmp_path)
    (ws.root / "big.txt").write_text("".join(f"line {i}\n" for i in range(20_000)))
    commit_in(ws, "big.txt", (ws.root / "big.txt").read_text())
    full = bundled(ws, None, [], tmp_path / "full.bundle")[1]
    commit_in(ws, "c.txt", "sea\n")
    latest, partial = bundled(ws, None, [first], tmp_path / "partial.bundle")
    _sha, whole = bundled(ws, None, [], tmp_path / "whole.bundle")
    assert len(partial) < len(whole) and len(full) < len(whole)
    asyncio.run(mirror.take(latest, tmp_path / "partial.bundle"))
    assert asyncio.run(mirror.heads()) == [latest]
    assert bundled(ws, first, [latest], tmp_path / "none.bundle") == (first, b"")
    assert not (tmp_path / "none.bundle").exists()
    unknown = "0123456789abcdef0123456789abcdef01234567"
    assert bundled(ws, None, [unknown, "not-a-sha"], tmp_path / "again.bundle")[1] == whole


def test_what_the_mirror_is_given_is_checked(ws: Workspace, tmp_path: Path) -> None:
    mirror, sha = fed(ws, tmp_path)
    later = commit_in(ws, "d.txt", "dee\n")
    garbage = tmp_path / "garbage.bundle"
    garbage.write_bytes(b"# v2 git bundle\ngarbage")
    with pytest.raises(BundleRefused, match="cannot take the bundle of"):
        asyncio.run(mirror.take(later, garbage))
    with pytest.raises(BundleRefused, match="is not in the mirror after its bundle"):
        asyncio.run(mirror.take(later, None))
    assert asyncio.run(mirror.heads()) == [sha]
    with pytest.raises(RemoteError, match="unknown rev 'nope'"):
        asyncio.run(export(ws.root, "nope", [], tmp_path / "nope.bundle"))


def test_a_sandbox_without_a_change_commits_nothing(ws: Workspace, tmp_path: Path) -> None:
    mirror, sha = fed(ws, tmp_path)
    sandbox = tmp_path / "host" / "sandboxes" / LANE
    asyncio.run(mirror.workspace().create_sandbox(LANE, sandbox, sha))
    assert asyncio.run(mirror.workspace().make_commit(LANE, sandbox, "nothing")) is None

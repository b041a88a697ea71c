"""A sandbox made at a revision of the workspace (`SandboxCreate.rev`, issue 19): the custodian
resolves it with git when it makes the sandbox, refuses one that names no commit before making
anything, and a commit from it lands as one from a sandbox that fell behind. Real git
repositories in tmp_path, as in test_workspace.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from orchestra_sup.custodian.workspace import open_workspace
from orchestra_sup.errors import ErrorCode, RemoteError
from tests.unit.test_workspace import git, make_repo


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, list[str]]:
    """A repository with three commits of f.txt ("1", "2", "3"), and their shas, oldest first."""
    repo = make_repo(tmp_path / "repo", {"f.txt": "1\n"})
    for text in ("2\n", "3\n"):
        (repo / "f.txt").write_text(text)
        git(repo, "commit", "-q", "-am", text.strip())
    return repo, git(repo, "rev-list", "--reverse", "HEAD").split()


def test_a_sandbox_is_made_at_the_revision_asked_for(
    tmp_path: Path, history: tuple[Path, list[str]]
) -> None:
    repo, shas = history
    ws = asyncio.run(open_workspace(repo, tmp_path / "state"))
    git(repo, "branch", "old", shas[1])
    for n, (rev, want) in enumerate(
        [(shas[0], 0), (shas[0][:8], 0), ("old", 1), ("HEAD~2", 0), ("HEAD", 2)]
    ):
        dest = tmp_path / "sb" / f"l{n}"
        path, base = asyncio.run(ws.create_sandbox(f"l{n}", dest, rev))
        assert base == shas[want], rev
        assert git(dest, "rev-parse", "HEAD") == shas[want]
        assert (Path(path) / "f.txt").read_text() == f"{want + 1}\n"
    assert asyncio.run(ws.head()) == shas[2]  # the workspace never moved


@pytest.mark.parametrize(
    ("rev", "code", "message"),
    [
        ("nope", ErrorCode.NOT_FOUND, "unknown rev 'nope': no such commit"),
        ("HEAD~9", ErrorCode.NOT_FOUND, "unknown rev 'HEAD~9': no such commit"),
        ("HEAD:f.txt", ErrorCode.BAD_REQUEST, "rev 'HEAD:f.txt' is refused"),
        ("--all", ErrorCode.BAD_REQUEST, "rev '--all' is refused"),
        ("HEAD~1..HEAD", ErrorCode.BAD_REQUEST, "give one revision"),
    ],
)
def test_a_rev_that_names_no_commit_makes_nothing(
    tmp_path: Path, history: tuple[Path, list[str]], rev: str, code: ErrorCode, message: str
) -> None:
    repo, _ = history
    ws = asyncio.run(open_workspace(repo, tmp_path / "state"))
    dest = tmp_path / "sb" / "l"
    with pytest.raises(RemoteError) as info:
        asyncio.run(ws.create_sandbox("l", dest, rev))
    assert info.value.code is code and message in info.value.message
    assert not dest.exists() and not (dest.parent / ".l.partial").exists()


def test_a_commit_from_an_older_rev_is_picked_onto_the_head(
    tmp_path: Path, history: tuple[Path, list[str]]
) -> None:
    """What a sandbox that fell behind does: its change against its revision lands on the
    branch's head, whose own later commits stay."""
    repo, shas = history
    ws = asyncio.run(open_workspace(repo, tmp_path / "state"))
    path, base = asyncio.run(ws.create_sandbox("l", tmp_path / "sb" / "l", shas[0]))
    (Path(path) / "g.txt").write_text("new\n")
    landed = asyncio.run(ws.commit_sandbox("l", Path(path), "lane l"))
    assert landed == asyncio.run(ws.head()) and git(repo, "rev-parse", "HEAD~1") == shas[2]
    assert (repo / "f.txt").read_text() == "3\n" and (repo / "g.txt").read_text() == "new\n"
    assert base == shas[0]

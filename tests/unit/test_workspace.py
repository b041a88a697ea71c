"""The custodian's git workspace and lane sandboxes, against real git repositories in tmp_path."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestra_sup.custodian.workspace import Workspace, open_workspace
from orchestra_sup.errors import CommitConflict, GitError, WorkspaceError

_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}


def git(cwd: Path, *args: str) -> str:
    """Run a setup/inspection git command in `cwd` and return its stripped stdout."""
    res = subprocess.run(
        ["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
        env=_ENV,
    )
    return res.stdout.strip()


def make_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    """A non-bare repository at `path` with one commit holding `files`."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in (files or {"README": "hello\n"}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    repo = make_repo(tmp_path / "repo", {"a.txt": "one\ntwo\nthree\n", "b.txt": "bee\n"})
    return asyncio.run(open_workspace(repo, tmp_path / "state"))


def test_default_workspace_is_created_with_one_empty_commit(tmp_path: Path) -> None:
    """With no path, state_dir/workspace is a fresh repo on main with one empty commit."""
    state = tmp_path / "state"
    w = asyncio.run(open_workspace(None, state))
    assert w.root == Path(os.path.realpath(state / "workspace"))
    head = asyncio.run(w.head())
    assert len(head) == 40 and all(c in "0123456789abcdef" for c in head)
    assert git(w.root, "rev-list", "--count", "HEAD") == "1"
    assert git(w.root, "symbolic-ref", "--short", "HEAD") == "main"
    assert git(w.root, "ls-tree", "HEAD") == ""
    assert (
        git(w.root, "log", "-1", "--format=%an <%ae>") == "orchestra-sup <orchestra-sup@localhost>"
    )
    assert not (state / ".workspace.partial").exists()


def test_default_workspace_is_reused(tmp_path: Path) -> None:
    """A second open of the default workspace keeps its history instead of re-initialising."""
    state = tmp_path / "state"
    first = asyncio.run(open_workspace(None, state))
    (first.root / "f").write_text("x\n")
    git(first.root, "add", "f")
    git(first.root, "commit", "-q", "-m", "second")
    second = asyncio.run(open_workspace(None, state))
    assert second.root == first.root
    assert asyncio.run(second.head()) == git(first.root, "rev-parse", "HEAD")
    assert git(second.root, "rev-list", "--count", "HEAD") == "2"


def test_given_repository_is_opened_at_its_realpath(tmp_path: Path) -> None:
    """A user-given repo top level (here through a symlink) becomes the root as a realpath."""
    repo = make_repo(tmp_path / "repo")
    link = tmp_path / "link"
    link.symlink_to(repo)
    w = asyncio.run(open_workspace(link, tmp_path / "state"))
    assert w.root == Path(os.path.realpath(repo))
    assert asyncio.run(w.head()) == git(repo, "rev-parse", "HEAD")
    assert not (tmp_path / "state" / "workspace").exists()


def _missing(tmp_path: Path) -> Path:
    return tmp_path / "nope"


def _file(tmp_path: Path) -> Path:
    f = tmp_path / "file"
    f.write_text("x")
    return f


def _plain_dir(tmp_path: Path) -> Path:
    d = tmp_path / "plain"
    d.mkdir()
    return d


def _subdir(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "repo", {"sub/x": "x\n"})
    return repo / "sub"


def _no_commit(tmp_path: Path) -> Path:
    d = tmp_path / "empty"
    d.mkdir()
    git(d, "init", "-q", "-b", "main")
    return d


def _bare(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "repo")
    bare = tmp_path / "bare.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    return bare


@pytest.mark.parametrize(
    "make", [_missing, _file, _plain_dir, _subdir, _no_commit, _bare], ids=lambda f: f.__name__
)
def test_unusable_given_path_is_refused_naming_it(tmp_path: Path, make) -> None:
    """Missing, file, non-repo, repo subdir, commitless and bare paths raise WorkspaceError."""
    path = make(tmp_path)
    with pytest.raises(WorkspaceError) as info:
        asyncio.run(open_workspace(path, tmp_path / "state"))
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_non_repository_is_never_initialised(tmp_path: Path) -> None:
    """Refusing a plain directory leaves it without a .git (no git init on a user path)."""
    d = _plain_dir(tmp_path)
    with pytest.raises(WorkspaceError):
        asyncio.run(open_workspace(d, tmp_path / "state"))
    assert list(d.iterdir()) == []


def test_failing_git_command_raises_git_error(tmp_path: Path) -> None:
    """A git command that fails (HEAD of a non-repository) raises GitError with its exit code."""
    with pytest.raises(GitError) as info:
        asyncio.run(Workspace(_plain_dir(tmp_path)).head())
    assert info.value.returncode != 0


def test_sandbox_is_a_detached_clone_at_head(ws: Workspace, tmp_path: Path) -> None:
    """create_sandbox clones the workspace at HEAD, checked out, registering nothing in it."""
    dest = tmp_path / "sandboxes" / "deep" / "lane-a"
    path, rev = asyncio.run(ws.create_sandbox("a", dest))
    assert path == str(dest)
    assert rev == asyncio.run(ws.head())
    assert git(dest, "rev-parse", "HEAD") == rev
    assert (dest / "a.txt").read_text() == "one\ntwo\nthree\n"
    assert git(dest, "status", "--porcelain") == ""
    assert git(dest, "rev-parse", "--abbrev-ref", "HEAD") == "HEAD"  # detached
    assert len(git(ws.root, "worktree", "list").splitlines()) == 1
    assert git(ws.root, "status", "--porcelain") == ""
    assert not (dest.parent / ".lane-a.partial").exists()


def test_sandboxes_are_distinct_per_lane(ws: Workspace, tmp_path: Path) -> None:
    """Two lanes get separate checkouts at the same base; edits in one do not show in the other."""
    pa, ra = asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))
    pb, rb = asyncio.run(ws.create_sandbox("b", tmp_path / "sb" / "b"))
    assert pa != pb and ra == rb
    (Path(pa) / "a.txt").write_text("changed\n")
    assert (Path(pb) / "a.txt").read_text() == "one\ntwo\nthree\n"


def test_create_sandbox_is_idempotent(ws: Workspace, tmp_path: Path) -> None:
    """Re-asking for an existing sandbox returns it as is, edits kept, with its own HEAD."""
    dest = tmp_path / "sb" / "a"
    first = asyncio.run(ws.create_sandbox("a", dest))
    (dest / "a.txt").write_text("edited\n")
    git(ws.root, "commit", "-q", "--allow-empty", "-m", "moves head")
    again = asyncio.run(ws.create_sandbox("a", dest))
    assert again == first
    assert (dest / "a.txt").read_text() == "edited\n"


def test_sandbox_dest_that_is_not_a_checkout_is_refused(ws: Workspace, tmp_path: Path) -> None:
    """An existing non-git dest, or a dest inside the workspace, raises WorkspaceError."""
    junk = tmp_path / "junk"
    junk.mkdir()
    with pytest.raises(WorkspaceError, match="junk"):
        asyncio.run(ws.create_sandbox("a", junk))
    with pytest.raises(WorkspaceError, match="inside the workspace"):
        asyncio.run(ws.create_sandbox("a", ws.root / "sb"))


def test_commit_fast_forwards_into_workspace(ws: Workspace, tmp_path: Path) -> None:
    """A change (edit + new untracked file) lands by fast-forward in history and working tree."""
    base = asyncio.run(ws.head())
    path, _ = asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))
    sb = Path(path)
    (sb / "a.txt").write_text("ONE\ntwo\nthree\n")
    (sb / "new" / "dir").mkdir(parents=True)
    (sb / "new" / "dir" / "c.txt").write_text("sea\n")
    head = asyncio.run(ws.commit_sandbox("a", sb, "lane a: edit"))
    assert head == asyncio.run(ws.head())
    assert git(sb, "rev-parse", "HEAD") == base  # the sandbox is never modified
    assert git(ws.root, "rev-parse", "HEAD~1") == base
    assert (ws.root / "a.txt").read_text() == "ONE\ntwo\nthree\n"
    assert (ws.root / "new" / "dir" / "c.txt").read_text() == "sea\n"
    assert git(ws.root, "status", "--porcelain") == ""
    log = git(ws.root, "log", "-1", "--format=%an <%ae>|%cn <%ce>|%s")
    assert log == (
        "orchestra-sup <orchestra-sup@localhost>|orchestra-sup <orchestra-sup@localhost>|"
        "lane a: edit"
    )


def test_commit_without_change_returns_none(ws: Workspace, tmp_path: Path) -> None:
    """A sandbox with no change commits nothing and returns None; HEAD stays put."""
    base = asyncio.run(ws.head())
    path, _ = asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))
    assert asyncio.run(ws.commit_sandbox("a", Path(path), "nothing")) is None
    assert asyncio.run(ws.head()) == base
    assert git(Path(path), "rev-parse", "HEAD") == base


def test_two_lanes_editing_different_files_both_land(ws: Workspace, tmp_path: Path) -> None:
    """Second lane from the same base lands by cherry-pick on top of the first, author kept."""
    pa, _ = asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))
    pb, _ = asyncio.run(ws.create_sandbox("b", tmp_path / "sb" / "b"))
    (Path(pa) / "a.txt").write_text("one\ntwo\nthree\nfour\n")
    (Path(pb) / "b.txt").write_text("bee bee\n")
    first = asyncio.run(ws.commit_sandbox("a", Path(pa), "lane a"))
    second = asyncio.run(ws.commit_sandbox("b", Path(pb), "lane b"))
    assert second == asyncio.run(ws.head())
    assert git(ws.root, "rev-parse", "HEAD~1") == first
    assert second != git(Path(pb), "rev-parse", "HEAD")  # a cherry-picked copy
    assert (ws.root / "a.txt").read_text() == "one\ntwo\nthree\nfour\n"
    assert (ws.root / "b.txt").read_text() == "bee bee\n"
    assert git(ws.root, "log", "-1", "--format=%an|%s") == "orchestra-sup|lane b"
    assert git(ws.root, "status", "--porcelain") == ""


def test_same_line_edits_conflict_and_leave_workspace_untouched(
    ws: Workspace, tmp_path: Path
) -> None:
    """Same-line edits raise CommitConflict; workspace HEAD and status stay unchanged."""
    pa, _ = asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))
    pb, base = asyncio.run(ws.create_sandbox("b", tmp_path / "sb" / "b"))
    (Path(pa) / "a.txt").write_text("one\nTWO from a\nthree\n")
    (Path(pb) / "a.txt").write_text("one\nTWO from b\nthree\n")
    asyncio.run(ws.commit_sandbox("a", Path(pa), "lane a"))
    head_before = asyncio.run(ws.head())
    status_before = git(ws.root, "status", "--porcelain", "--untracked-files=all")
    with pytest.raises(CommitConflict) as info:
        asyncio.run(ws.commit_sandbox("b", Path(pb), "lane b"))
    assert info.value.lane == "b"
    assert "a.txt" in info.value.detail
    assert asyncio.run(ws.head()) == head_before
    assert git(ws.root, "status", "--porcelain", "--untracked-files=all") == status_before
    assert (ws.root / "a.txt").read_text() == "one\nTWO from a\nthree\n"
    assert not (ws.root / ".git" / "CHERRY_PICK_HEAD").exists()
    # The sandbox is back at its base with the lane's edit uncommitted, ready for a retry.
    assert git(Path(pb), "rev-parse", "HEAD") == base
    assert git(Path(pb), "status", "--porcelain") == "M a.txt"


def test_nested_repository_in_sandbox_is_refused(ws: Workspace, tmp_path: Path) -> None:
    """A sandbox adding a directory with its own .git is refused with WorkspaceError."""
    base = asyncio.run(ws.head())
    path, _ = asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))
    nested = make_repo(Path(path) / "vendor" / "lib")
    assert (nested / ".git").is_dir()
    with pytest.raises(WorkspaceError, match=r"\.git|nested"):
        asyncio.run(ws.commit_sandbox("a", Path(path), "sneaky"))
    assert asyncio.run(ws.head()) == base
    assert git(Path(path), "rev-parse", "HEAD") == base


def test_git_named_directory_in_sandbox_is_refused(ws: Workspace, tmp_path: Path) -> None:
    """A sandbox adding a path through a `.GIT` directory (git's case-folded .git) is refused."""
    base = asyncio.run(ws.head())
    path, _ = asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))
    hooks = Path(path) / "sub" / ".GIT" / "hooks"
    hooks.mkdir(parents=True)
    (hooks / "post-checkout").write_text("#!/bin/sh\necho pwned\n")
    (Path(path) / "a.txt").write_text("innocent edit\n")
    with pytest.raises(WorkspaceError, match=r"\.GIT"):
        asyncio.run(ws.commit_sandbox("a", Path(path), "sneaky"))
    assert asyncio.run(ws.head()) == base
    assert git(Path(path), "diff", "--cached", "--name-only") == ""


def test_commit_from_a_non_checkout_is_refused(ws: Workspace, tmp_path: Path) -> None:
    """commit_sandbox on a plain directory or on the workspace itself raises WorkspaceError."""
    plain = _plain_dir(tmp_path)
    with pytest.raises(WorkspaceError, match="not a git checkout"):
        asyncio.run(ws.commit_sandbox("a", plain, "m"))
    with pytest.raises(WorkspaceError, match="workspace itself"):
        asyncio.run(ws.commit_sandbox("a", ws.root, "m"))


def test_symlink_in_sandbox_is_committed_as_a_symlink(ws: Workspace, tmp_path: Path) -> None:
    """A symlink pointing out of the sandbox lands as a symlink; its target is never read."""
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret\n")
    path, _ = asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))
    (Path(path) / "link").symlink_to(secret)
    asyncio.run(ws.commit_sandbox("a", Path(path), "link"))
    assert (ws.root / "link").is_symlink()
    assert os.readlink(ws.root / "link") == str(secret)
    assert git(ws.root, "ls-tree", "HEAD", "link").startswith("120000 ")


def test_invalid_git_directory_never_lands(ws: Workspace, tmp_path: Path) -> None:
    """A `.git` dir that is no repository is skipped by git: it never reaches the workspace."""
    path, _ = asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))
    fake = Path(path) / "sub" / ".git"
    fake.mkdir(parents=True)
    (fake / "config").write_text("[core]\n\thooksPath = /tmp\n")
    (Path(path) / "b.txt").write_text("edited\n")
    asyncio.run(ws.commit_sandbox("a", Path(path), "edit"))
    assert git(ws.root, "ls-tree", "-r", "--name-only", "HEAD").splitlines() == ["a.txt", "b.txt"]
    assert not (ws.root / "sub").exists()


def test_hooks_never_run(ws: Workspace, tmp_path: Path) -> None:
    """Hooks in the sandbox and in the workspace do not run during create/commit."""
    marker = tmp_path / "hook-ran"
    hook = f"#!/bin/sh\ntouch {marker}\n"
    for name in ("post-checkout", "post-merge", "post-commit"):
        (ws.root / ".git" / "hooks" / name).write_text(hook)
        (ws.root / ".git" / "hooks" / name).chmod(0o755)
    path, _ = asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))
    for name in ("pre-commit", "post-commit", "commit-msg"):
        (Path(path) / ".git" / "hooks" / name).write_text(hook)
        (Path(path) / ".git" / "hooks" / name).chmod(0o755)
    (Path(path) / "a.txt").write_text("x\n")
    assert asyncio.run(ws.commit_sandbox("a", Path(path), "edit")) is not None
    assert not marker.exists()


def test_commit_retried_after_it_landed_returns_the_same_commit(
    ws: Workspace, tmp_path: Path
) -> None:
    """A second SandboxCommit for a lane (the shard re-sent it to a restarted custodian) lands
    nothing new and answers the commit that already landed."""
    sb, _ = asyncio.run(ws.create_sandbox("l1", tmp_path / "sb" / "l1"))
    (Path(sb) / "new.txt").write_text("new\n")
    first = asyncio.run(ws.commit_sandbox("l1", Path(sb), "add new"))
    again = asyncio.run(ws.commit_sandbox("l1", Path(sb), "add new"))
    assert first is not None and again == first
    assert git(ws.root, "rev-parse", "HEAD") == first
    assert git(ws.root, "rev-list", "--count", "HEAD") == "2"


def test_work_the_lane_committed_itself_lands_as_the_custodians_commit(
    ws: Workspace, tmp_path: Path
) -> None:
    """A lane that committed its work in its sandbox (its trailer forged, even) still has it
    landed, not answered "no change": its working tree differs from the base."""
    sb, _ = asyncio.run(ws.create_sandbox("l2", tmp_path / "sb" / "l2"))
    (Path(sb) / "work.txt").write_text("work\n")
    git(Path(sb), "add", "-A")
    git(Path(sb), "commit", "-q", "-m", "half done\n\nOrchestra-Lane: l2")
    landed = asyncio.run(ws.commit_sandbox("l2", Path(sb), "half done"))
    assert landed is not None
    assert (ws.root / "work.txt").read_text() == "work\n"


def test_lane_trailer_is_matched_exactly(ws: Workspace, tmp_path: Path) -> None:
    """Lane l1-0's landed commit is not mistaken for lane l1's (its id is a prefix)."""
    sb1, _ = asyncio.run(ws.create_sandbox("l1-0", tmp_path / "sb" / "l1-0"))
    (Path(sb1) / "one.txt").write_text("1\n")
    asyncio.run(ws.commit_sandbox("l1-0", Path(sb1), "one"))
    sb2, _ = asyncio.run(ws.create_sandbox("l1", tmp_path / "sb" / "l1"))
    assert asyncio.run(ws.commit_sandbox("l1", Path(sb2), "nothing")) is None


# --- a hostile sandbox (issue 9): its .git, its symlinks -----------------------------------------


def _tree(repo: Path) -> dict[str, str]:
    """path -> "mode type" of every entry of `repo`'s HEAD tree."""
    rows = git(repo, "ls-tree", "-r", "HEAD").splitlines()
    return {row.split("\t", 1)[1]: " ".join(row.split()[:2]) for row in rows}


def test_filter_driver_in_the_sandbox_config_never_runs(ws: Workspace, tmp_path: Path) -> None:
    """A clean filter the lane declares in its sandbox's `.git/config` (with a `.gitattributes`
    naming it) is never run by the custodian's commit: the content lands unfiltered."""
    marker = tmp_path / "filter-ran"
    sb = Path(asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))[0])
    with open(sb / ".git" / "config", "a") as config:
        config.write(f'[filter "evil"]\n\tclean = touch {marker} && tr a-z A-Z\n')
    (sb / ".gitattributes").write_text("* filter=evil\n")
    (sb / "a.txt").write_text("lower\n")
    asyncio.run(ws.commit_sandbox("a", sb, "edit"))
    assert not marker.exists()
    assert git(ws.root, "show", "HEAD:a.txt") == "lower"


def test_commits_the_lane_made_never_land(ws: Workspace, tmp_path: Path) -> None:
    """The lane's own commits (an author it chose, a forged trailer, a gitlink in its tree) never
    reach the workspace's history: one commit by orchestra-sup on the base lands, holding the
    lane's working tree, and the gitlink (not in the working tree) is not in it."""
    sb_path, base = asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))
    sb = Path(sb_path)
    (sb / "work.txt").write_text("work\n")
    git(sb, "add", "-A")
    git(sb, "update-index", "--add", "--cacheinfo", f"160000,{base},vendored")
    git(sb, "commit", "-q", "--author", "Mallory <m@evil>", "-m", "mine\n\nOrchestra-Lane: a")
    theirs = git(sb, "rev-parse", "HEAD")
    head = asyncio.run(ws.commit_sandbox("a", sb, "lane a"))
    assert git(ws.root, "rev-parse", "HEAD~1") == base
    ancestor = subprocess.run(
        ["git", "-C", str(ws.root), "merge-base", "--is-ancestor", theirs, "HEAD"]
    )
    assert ancestor.returncode != 0  # 1: not an ancestor; 128: not even in the object store
    assert git(ws.root, "log", "-1", "--format=%an|%s", head) == "orchestra-sup|lane a"
    assert _tree(ws.root) == {
        "a.txt": "100644 blob",
        "b.txt": "100644 blob",
        "work.txt": "100644 blob",
    }


def test_a_sandbox_whose_git_points_at_the_workspace_writes_nothing_through_it(
    ws: Workspace, tmp_path: Path
) -> None:
    """A lane that replaces its `.git` with a gitfile naming the workspace's repository gets
    its working tree landed like any other; the workspace's index and branch move only by the
    landing, and its working tree stays clean."""
    sb = Path(asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))[0])
    shutil.rmtree(sb / ".git")
    (sb / ".git").write_text(f"gitdir: {ws.root / '.git'}\n")
    (sb / "b.txt").write_text("edited\n")
    asyncio.run(ws.commit_sandbox("a", sb, "edit"))
    assert (ws.root / "b.txt").read_text() == "edited\n"
    assert git(ws.root, "status", "--porcelain", "--untracked-files=all") == ""
    assert git(ws.root, "rev-list", "--count", "HEAD") == "2"


@pytest.mark.parametrize("target", ["/etc/passwd", "PARENT"])
def test_a_symlink_replacing_a_tracked_file_lands_as_a_symlink(
    ws: Workspace, tmp_path: Path, target: str
) -> None:
    """A tracked file the lane replaced by a symlink out of the sandbox (to /etc/passwd, to a
    file beside the workspace) lands as that symlink: the target is never read or written."""
    if target == "PARENT":
        target = str(ws.root.parent / "secret.txt")
        Path(target).write_text("top secret\n")
    before = Path(target).read_bytes()
    sb = Path(asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))[0])
    (sb / "a.txt").unlink()
    (sb / "a.txt").symlink_to(target)
    asyncio.run(ws.commit_sandbox("a", sb, "link"))
    assert _tree(ws.root)["a.txt"] == "120000 blob"
    assert git(ws.root, "cat-file", "blob", "HEAD:a.txt") == target
    assert os.readlink(ws.root / "a.txt") == target
    assert Path(target).read_bytes() == before


def test_a_later_lane_never_writes_through_a_landed_directory_symlink(
    ws: Workspace, tmp_path: Path
) -> None:
    """Lane a lands `d` as a symlink to a directory outside; lane b, from the same base, adds
    `d/x`: landing it never writes into that directory (it is refused, the workspace as it was)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    sa = Path(asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))[0])
    sb = Path(asyncio.run(ws.create_sandbox("b", tmp_path / "sb" / "b"))[0])
    (sa / "d").symlink_to(outside)
    asyncio.run(ws.commit_sandbox("a", sa, "link"))
    (sb / "d").mkdir()
    (sb / "d" / "x").write_text("through the link\n")
    head = asyncio.run(ws.head())
    with pytest.raises((CommitConflict, GitError)):
        asyncio.run(ws.commit_sandbox("b", sb, "write through"))
    assert list(outside.iterdir()) == []
    assert asyncio.run(ws.head()) == head
    assert git(ws.root, "status", "--porcelain", "--untracked-files=all") == ""


def test_gitmodules_and_hooks_in_the_sandbox_never_run(ws: Workspace, tmp_path: Path) -> None:
    """A `.gitmodules` naming a command, hooks in the sandbox's `.git/hooks` and a `core.hooksPath`
    in its config: nothing runs; `.gitmodules` lands as a plain file, no hook reaches the
    workspace."""
    marker = tmp_path / "ran"
    workspace_hooks = sorted(os.listdir(ws.root / ".git" / "hooks"))
    sb = Path(asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))[0])
    (sb / ".gitmodules").write_text(
        f'[submodule "m"]\n\tpath = m\n\turl = ./m\n\tupdate = !touch {marker}\n'
    )
    hooks = sb / "my-hooks"
    hooks.mkdir()
    for where in (sb / ".git" / "hooks", hooks):
        for name in ("pre-commit", "post-commit", "post-checkout", "post-merge", "pre-auto-gc"):
            (where / name).write_text(f"#!/bin/sh\ntouch {marker}\n")
            (where / name).chmod(0o755)
    git(sb, "config", "core.hooksPath", str(hooks))
    asyncio.run(ws.commit_sandbox("a", sb, "modules"))
    assert not marker.exists()
    assert _tree(ws.root)[".gitmodules"] == "100644 blob"
    assert sorted(os.listdir(ws.root / ".git" / "hooks")) == workspace_hooks
    assert "my-hooks/pre-commit" in _tree(ws.root)  # the lane's files, as files


def test_a_sandbox_that_is_a_symlink_is_refused(ws: Workspace, tmp_path: Path) -> None:
    """A sandbox path that became a symlink (to another checkout) is refused: nothing lands."""
    real = Path(asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))[0])
    (real / "b.txt").write_text("edited\n")
    link = tmp_path / "sb" / "l"
    link.symlink_to(real)
    (tmp_path / "sb" / ".l.base").write_text(asyncio.run(ws.head()) + "\n")
    with pytest.raises(WorkspaceError, match="symlink"):
        asyncio.run(ws.commit_sandbox("l", link, "m"))


def test_a_sandbox_without_a_record_commits_on_its_head_only_if_the_workspace_made_it(
    ws: Workspace, tmp_path: Path
) -> None:
    """A sandbox made before base records were kept commits on its HEAD when that is a commit
    of the workspace's history, and is refused when its HEAD is one the lane made."""
    sb = Path(asyncio.run(ws.create_sandbox("a", tmp_path / "sb" / "a"))[0])
    (tmp_path / "sb" / ".a.base").unlink()
    (sb / "b.txt").write_text("edited\n")
    assert asyncio.run(ws.commit_sandbox("a", sb, "m")) == asyncio.run(ws.head())
    sc = Path(asyncio.run(ws.create_sandbox("c", tmp_path / "sb" / "c"))[0])
    (tmp_path / "sb" / ".c.base").unlink()
    git(sc, "commit", "-q", "--allow-empty", "-m", "the lane's own")
    with pytest.raises(WorkspaceError, match="not at a commit of the workspace"):
        asyncio.run(ws.commit_sandbox("c", sc, "m"))


def test_a_new_gitlink_in_the_staged_change_is_refused() -> None:
    """The second line behind the nested-repository check: a staged change that adds a gitlink
    is refused; one that changes a gitlink the base already had is not new."""
    with pytest.raises(WorkspaceError, match="vendored"):
        Workspace.refuse_new_gitlinks("a", "sandbox /sb", ":000000 160000 0000 9e1d A\0vendored\0")
    Workspace.refuse_new_gitlinks("a", "sandbox /sb", ":160000 160000 aaaa bbbb M\0kept\0")

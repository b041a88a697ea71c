"""The custodian's git workspace and the per-lane sandboxes cloned from it.

Every git command runs through `custodian.git` (no shell, never blocking the event loop, with
its hardened config and environment); a commit is written with the fixed identity
`orchestra-sup <orchestra-sup@localhost>`, so a machine with no git identity configured works.

Trust boundary: a lane owns its whole sandbox, its `.git` directory included (its commands may
run git there, or rewrite `.git/config`, `.git/HEAD` or the `.git` entry itself). So the custodian
never runs a writing git command with the sandbox's repository: a commit reads only the sandbox's
*working tree*, through the workspace's own repository (its config, hooks off) and a private index,
on top of the base the custodian recorded when it made the sandbox (`Workspace.commit_sandbox`).
Nothing in the sandbox can make it run a program the sandbox's config names (a filter driver, an
fsmonitor, a hook), land a commit the lane made itself, follow a symlink out of the sandbox (git
commits symlinks as symlinks), or land a `.git` path or a gitlink in the workspace.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from orchestra_sup.custodian import git, history
from orchestra_sup.errors import CommitConflict, GitError, WorkspaceError
from orchestra_sup.state.permissions import private_file

IDENTITY_NAME = "orchestra-sup"
IDENTITY_EMAIL = "orchestra-sup@localhost"

_AUTHOR_ENV = {"GIT_AUTHOR_NAME": IDENTITY_NAME, "GIT_AUTHOR_EMAIL": IDENTITY_EMAIL}
_COMMITTER_ENV = {"GIT_COMMITTER_NAME": IDENTITY_NAME, "GIT_COMMITTER_EMAIL": IDENTITY_EMAIL}


def _trusting(path: Path) -> tuple[str, str]:
    """Config that lets git read the repository at `path` though another uid owns it (a sandbox
    belongs to its lane's uid: `custodian.owners`), for read-only questions whose answer the
    custodian checks itself; git refuses such a repository otherwise ("dubious ownership")."""
    return ("-c", f"safe.directory={os.path.realpath(path)}")


async def _toplevel(path: Path) -> str | None:
    """The realpath of the working tree `path` belongs to, or None if it is in none."""
    res = await git.run(path, *_trusting(path), "rev-parse", "--show-toplevel", check=False)
    if res.returncode != 0 or not res.stdout.strip():
        return None
    return os.path.realpath(res.stdout.rstrip("\n"))


async def _is_checkout_root(path: Path) -> bool:
    """True when `path` is the top level of a git working tree (not merely inside one)."""
    top = await _toplevel(path)
    return top is not None and top == os.path.realpath(path)


async def _validate_repo(path: Path) -> Path:
    """Check that `path` is the top level of a non-bare git repository with at least one commit.

    Returns the realpath of the top level. Raises `WorkspaceError` (one line, naming `path`)
    otherwise. Never creates or modifies anything.
    """
    if not os.path.lexists(path) or not path.exists():
        raise WorkspaceError(f"workspace {path} does not exist")
    if not path.is_dir():
        raise WorkspaceError(f"workspace {path} is not a directory")
    kind = await git.run(
        path, "rev-parse", "--is-bare-repository", "--is-inside-git-dir", check=False
    )
    if kind.returncode != 0:
        raise WorkspaceError(f"workspace {path} is not a git repository")
    is_bare, inside_git_dir = [*kind.stdout.split(), "", ""][:2]
    if is_bare == "true":
        raise WorkspaceError(f"workspace {path} is a bare git repository; it needs a working tree")
    if inside_git_dir == "true":
        raise WorkspaceError(f"workspace {path} is a .git directory, not a working tree")
    top = await _toplevel(path)
    if top is None:
        raise WorkspaceError(f"workspace {path} is not a git repository")
    if top != os.path.realpath(path):
        raise WorkspaceError(
            f"workspace {path} is a subdirectory of the git repository {top}; give its top level"
        )
    head = await git.run(path, "rev-parse", "--verify", "--quiet", "HEAD^{commit}", check=False)
    if head.returncode != 0:
        raise WorkspaceError(f"workspace {path} has no commit yet; commit something first")
    return Path(top)


async def _remove_tree(path: Path) -> None:
    if os.path.lexists(path):
        await asyncio.to_thread(shutil.rmtree, path)


async def open_workspace(path: Path | None, state_dir: Path) -> Workspace:
    """Open the custodian's workspace.

    With `path` None the workspace is `state_dir / "workspace"`: created on first use as a fresh
    repository (`git init -q -b main` plus one empty commit by orchestra-sup; built in a sibling
    `.workspace.partial` directory and renamed into place, so a crash never leaves half a
    repository), and reused as it is on every later call.

    With `path` given, it must be the top level of an existing, non-bare git repository that has at
    least one commit; nothing is ever initialised there. The workspace root is the realpath of that
    top level.

    Raises `WorkspaceError` (a one-line message naming the path) when the path does not exist, is
    not a directory, is not in a git repository, is a subdirectory of one, is bare or a `.git`
    directory, or has no commit yet; `GitError` if creating the default workspace fails.
    """
    if path is not None:
        return Workspace(await _validate_repo(Path(path)))
    default = Path(state_dir) / "workspace"
    if not os.path.lexists(default):
        default.parent.mkdir(parents=True, exist_ok=True)
        partial = default.with_name(".workspace.partial")
        await _remove_tree(partial)
        partial.mkdir()
        await git.run(partial, "init", "-q", "-b", "main")
        await git.run(
            partial,
            "commit",
            "--quiet",
            "--allow-empty",
            "-m",
            "orchestra-sup: initial empty commit",
            env=_AUTHOR_ENV | _COMMITTER_ENV,
        )
        os.rename(partial, default)
    return Workspace(await _validate_repo(default))


def base_record(sandbox: Path) -> Path:
    """Where the custodian keeps the base commit of the sandbox at `sandbox`: a sibling file,
    outside what the lane owns."""
    return sandbox.with_name(f".{sandbox.name}.base")


def trailer(lane: str) -> str:
    """The line every lane commit carries: the lane id is the commit's idempotency key."""
    return f"Orchestra-Lane: {lane}"


def has_git_component(path: str) -> bool:
    """True if any component of the slash-separated `path` is `.git` (any case, as git compares)."""
    return any(part.lower() == ".git" for part in PurePosixPath(path).parts)


def _parse_status_z(out: str) -> list[tuple[str, str]]:
    """Parse `git status --porcelain=v1 -z` output into `(XY, path)` pairs.

    A rename or copy yields two pairs (the new path, then the original one), so a caller checking
    paths sees both.
    """
    entries: list[tuple[str, str]] = []
    fields = out.split("\0")
    i = 0
    while i < len(fields):
        field = fields[i]
        i += 1
        if len(field) < 4:
            continue
        xy, name = field[:2], field[3:]
        entries.append((xy, name))
        if "R" in xy or "C" in xy:
            if i < len(fields):
                entries.append((xy, fields[i]))
            i += 1
    return entries


class Workspace:
    """The custodian's git repository (`root`, a realpath) and the lane sandboxes cloned from it.

    A sandbox is a `git clone --shared --no-checkout` of the workspace at a directory of the
    caller's choosing, checked out detached at the workspace HEAD of that moment (or at the
    revision its lane asked for: `create_sandbox`'s `rev`). It lives outside
    the workspace's working tree and registers nothing in the workspace (no worktree entry, no
    ref); it borrows the workspace's object store through `objects/info/alternates`, so the
    workspace must not be garbage-collected with `--prune=now` while sandboxes based on commits
    that left its history are in use.

    Concurrency: this class does NOT serialise its callers. `create_sandbox` reads HEAD and
    `commit_sandbox` reads and moves it, so the caller (the custodian) must run every
    `create_sandbox` and `commit_sandbox` through one serial queue. `head` is safe at any time.

    Every git failure that is not described otherwise raises `GitError`.
    """

    def __init__(self, root: Path):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"Workspace(root={str(self.root)!r})"

    async def head(self) -> str:
        """The full (40 or 64 hex digit) sha of the workspace's HEAD commit.

        Raises `GitError` if HEAD does not name a commit.
        """
        res = await git.run(self.root, "rev-parse", "--verify", "HEAD^{commit}")
        return res.stdout.strip()

    async def create_sandbox(
        self, lane: str, dest: Path, rev: str | None = None
    ) -> tuple[str, str]:
        """Create lane `lane`'s sandbox at directory `dest`; return `(str(dest), base sha)`.

        `dest` must not exist yet (its parents are created) and must lie outside the workspace's
        working tree. The clone is built in the sibling `.<name>.partial` and renamed to `dest`
        once checked out, so `dest` either does not exist or is a complete sandbox. It is checked
        out detached at the workspace HEAD, or with `rev` at the commit `rev` names now
        (`history.resolve`: a sha, a short sha, a branch, `HEAD~3`); the base sha is that commit.

        The base sha is recorded beside `dest` (`.<name>.base`, outside the sandbox): a commit
        from the sandbox is made on it, whatever the lane does to the sandbox's own `.git`.

        Idempotent: if `dest` already is the top level of a git checkout it is returned as it is,
        with its base sha (a lane re-asking after a restart gets its sandbox back, edits
        included).

        Raises `WorkspaceError` if `dest` is inside the workspace, or exists and is not the top
        level of a git checkout; `RemoteError` for a `rev` that is not one revision
        (`bad_request`) or names no commit (`not_found`, "unknown rev 'X': no such commit"),
        before anything is made; `GitError` if cloning or checking out fails.
        """
        dest = Path(dest)
        real_dest = Path(os.path.realpath(dest))
        if real_dest.is_relative_to(os.path.realpath(self.root)):
            raise WorkspaceError(
                f"sandbox {dest} for lane {lane} is inside the workspace {self.root}"
            )
        if os.path.lexists(dest):
            if not await _is_checkout_root(dest):
                raise WorkspaceError(
                    f"sandbox {dest} for lane {lane} exists and is not a git checkout"
                )
            return str(dest), await self._base(lane, dest)
        base = await self.head() if rev is None else await history.resolve(self.root, rev)
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(f".{dest.name}.partial")
        await _remove_tree(partial)
        await git.run(
            dest.parent,
            "clone",
            "--quiet",
            "--shared",
            "--no-checkout",
            "--",
            str(self.root),
            str(partial.absolute()),
        )
        await git.run(partial, "checkout", "--quiet", "--detach", base)
        private_file(base_record(dest)).write_text(base + "\n")  # 0600: the custodian's
        os.rename(partial, dest)
        return str(dest), base

    async def commit_sandbox(self, lane: str, sandbox: Path, message: str) -> str | None:
        """Commit the working tree of `sandbox` and land it on the workspace's current branch.

        Only the sandbox's working tree is read, never its repository: git runs in the workspace
        (its config; hooks, fsmonitor and signing off) with `--work-tree=<sandbox>` and a private
        index started from the sandbox's recorded base. Steps: refuse `.git` paths (see below);
        `git add -A` (untracked files included, ignored ones not; a symlink as a symlink, never
        its target; git never reads a `.git` entry of a working tree); refuse a new gitlink;
        write the tree and commit it on the base as orchestra-sup with `message` (a blank message
        becomes `"lane <lane>"`) plus the lane's trailer, in the workspace's object store; then
        fast-forward (`merge --ff-only`) when the workspace HEAD is the base, else `cherry-pick`
        it (author kept; a change already present lands as an empty commit). A sandbox made at
        an older revision (`create_sandbox`'s `rev`) is one that fell behind from its start: its
        change (its working tree against that revision) is cherry-picked onto the branch's head
        the same way, never the revision's own tree. A successful call lands exactly one commit;
        commits the lane made in its sandbox never land (their changes do, as part of the working
        tree). The sandbox is never modified.

        Returns the new workspace HEAD sha, or None when the working tree does not differ from
        the base (nothing is committed anywhere).

        Raises:
          * `WorkspaceError` if `sandbox` is not a sandbox this workspace made (no recorded base
            and not a git checkout at a commit of the workspace's history), is a symlink, is the
            workspace itself, or would add a path with a component named `.git` (any case) or a
            nested repository (which git would record as a gitlink); nothing is committed.
          * `CommitConflict(lane, detail)` if the cherry-pick conflicts; `detail` names the
            conflicting files. The cherry-pick is aborted, so the workspace's HEAD, index and
            working tree are exactly as before.
          * `GitError` for any other git failure (for example, uncommitted changes in the
            workspace that the landing would overwrite; git refuses before touching anything).

        Idempotent per lane: every lane commit carries an `Orchestra-Lane: <lane>` trailer, and a
        call for a lane whose commit already landed returns that commit. So a shard re-sending
        `SandboxCommit` to a restarted custodian can neither lose the work nor land it twice.
        """
        sandbox = Path(os.path.abspath(sandbox))
        if os.path.realpath(sandbox) == os.path.realpath(self.root):
            raise WorkspaceError(f"sandbox {sandbox} for lane {lane} is the workspace itself")
        if os.path.islink(sandbox):
            raise WorkspaceError(f"sandbox {sandbox} for lane {lane} is a symlink")
        landed = await self.landed(lane)
        if landed is not None:
            await self._base(lane, sandbox)  # still only a sandbox this workspace made
            return landed  # a retry after the custodian died mid-commit: it is already there
        made = await self.make_commit(lane, sandbox, message)
        return None if made is None else await self.land(lane, made[1])

    async def make_commit(self, lane: str, sandbox: Path, message: str) -> tuple[str, str] | None:
        """Commit the working tree of `sandbox` in this repository's object store, on the base
        recorded when the sandbox was made, without landing it: `(base, commit)`, or None when
        the working tree does not differ from the base. The checks and the commit are
        `commit_sandbox`'s (which lands what this makes): only the working tree is read; a
        `.git` path, a nested repository or a new gitlink raises `WorkspaceError` before
        anything is written; the commit carries the lane's trailer. A host's mirror makes a
        lane's commit so and sends it to the custodian as a bundle (`custodian.hostmirror`).

        Raises `WorkspaceError` (`sandbox` is not one this repository made, or the checks
        above), `GitError` for any other git failure."""
        sandbox = Path(os.path.abspath(sandbox))
        if os.path.islink(sandbox):
            raise WorkspaceError(f"sandbox {sandbox} for lane {lane} is a symlink")
        base = await self._base(lane, sandbox)
        with tempfile.TemporaryDirectory(prefix="orchestra-sup-index-") as private:
            env = {"GIT_INDEX_FILE": os.path.join(private, "index")}
            tree = ("--work-tree", str(sandbox))
            await git.run(self.root, *tree, "read-tree", base, env=env)
            status = await git.run(
                self.root, *tree, "status", "--porcelain=v1", "-z", "--untracked-files=all", env=env
            )
            self._refuse_git_paths(lane, sandbox, _parse_status_z(status.stdout))
            await git.run(self.root, *tree, "add", "-A", env=env)
            raw = await git.run(
                self.root, "diff", "--cached", "--raw", "-z", "--no-renames", base, env=env
            )
            if not raw.stdout:
                return None
            self.refuse_new_gitlinks(lane, f"sandbox {sandbox}", raw.stdout)
            tree_sha = (await git.run(self.root, "write-tree", env=env)).stdout.strip()
        text = message if message.strip() else f"lane {lane}"
        commit = await git.run(
            self.root,
            "commit-tree",
            tree_sha,
            "-p",
            base,
            "-m",
            f"{text}\n\n{trailer(lane)}",
            env=_AUTHOR_ENV | _COMMITTER_ENV,
        )
        return base, commit.stdout.strip()

    async def _base(self, lane: str, sandbox: Path) -> str:
        """The commit `sandbox` was made at: its record, or for a sandbox made before records
        were kept, its HEAD if that is a commit of the workspace's history (so nothing the lane
        committed becomes a parent). Raises `WorkspaceError` otherwise."""
        with contextlib.suppress(FileNotFoundError):
            return base_record(sandbox).read_text().strip()
        if await _is_checkout_root(sandbox):
            head = await git.run(
                sandbox, *_trusting(sandbox), "rev-parse", "--verify", "HEAD^{commit}", check=False
            )
            sha = head.stdout.strip()
            known = await git.run(
                self.root, "merge-base", "--is-ancestor", sha, "HEAD", check=False
            )
            if head.returncode == 0 and known.returncode == 0:
                return sha
            raise WorkspaceError(
                f"sandbox {sandbox} for lane {lane} is not at a commit of the workspace"
            )
        raise WorkspaceError(f"sandbox {sandbox} for lane {lane} is not a git checkout")

    async def landed(self, lane: str) -> str | None:
        """The workspace commit that carries `lane`'s trailer, if one has landed."""
        out = await git.run(
            self.root,
            "log",
            "--fixed-strings",
            f"--grep={trailer(lane)}",
            "--format=%H%x00%B%x00",
        )
        fields = out.stdout.split("\0")
        for sha, body in zip(fields[0::2], fields[1::2], strict=False):
            if trailer(lane) in body.splitlines():
                return sha.strip()
        return None

    @staticmethod
    def _refuse_git_paths(lane: str, sandbox: Path, entries: list[tuple[str, str]]) -> None:
        """Raise `WorkspaceError` for a `.git` path or an untracked nested repository."""
        for xy, name in entries:
            if has_git_component(name):
                raise WorkspaceError(
                    f"lane {lane} tries to commit the .git path {name!r} from sandbox {sandbox}"
                )
            # With --untracked-files=all git lists single files; only a nested repository is
            # reported as a directory (trailing slash), and `add` would record it as a gitlink.
            if xy == "??" and name.endswith("/"):
                raise WorkspaceError(
                    f"lane {lane} tries to commit the nested git repository {name!r} "
                    f"from sandbox {sandbox}"
                )

    @staticmethod
    def refuse_new_gitlinks(lane: str, source: str, raw: str) -> None:
        """Raise `WorkspaceError` if `raw` (`git diff --raw -z --no-renames` output) adds a gitlink
        (mode 160000); `source` says where the change came from ("sandbox /x")."""
        fields = raw.split("\0")
        for meta, name in zip(fields[0::2], fields[1::2], strict=False):
            modes = meta.lstrip(":").split()
            if len(modes) >= 2 and modes[1] == "160000" and modes[0] != "160000":
                raise WorkspaceError(
                    f"lane {lane} tries to commit the nested git repository {name!r} from {source}"
                )

    async def land(self, lane: str, fetched: str) -> str:
        """Bring commit `fetched` (in the workspace's object store) onto the workspace's branch:
        a fast-forward when HEAD is its ancestor, else a cherry-pick; return the new HEAD.
        Raises `CommitConflict` (the cherry-pick aborted, the workspace as it was) or
        `GitError`."""
        ancestor = await git.run(
            self.root, "merge-base", "--is-ancestor", "HEAD", fetched, check=False
        )
        if ancestor.returncode == 0:
            await git.run(self.root, "merge", "--quiet", "--ff-only", fetched)
            return await self.head()
        if ancestor.returncode != 1:
            raise GitError(["merge-base", "--is-ancestor"], ancestor.returncode, ancestor.stderr)

        pick = await git.run(
            self.root,
            "cherry-pick",
            "--keep-redundant-commits",
            fetched,
            check=False,
            env=_COMMITTER_ENV,
        )
        if pick.returncode == 0:
            return await self.head()
        in_progress = await git.run(
            self.root, "rev-parse", "--quiet", "--verify", "CHERRY_PICK_HEAD", check=False
        )
        if in_progress.returncode != 0:
            # git refused before starting (e.g. local changes would be overwritten).
            raise GitError(["cherry-pick", fetched], pick.returncode, pick.stderr)
        unmerged = await git.run(self.root, "diff", "--name-only", "--diff-filter=U", "-z")
        files = sorted({f for f in unmerged.stdout.split("\0") if f})
        await git.run(self.root, "cherry-pick", "--abort")
        if not files:
            raise GitError(["cherry-pick", fetched], pick.returncode, pick.stderr)
        raise CommitConflict(lane, "conflicting files: " + ", ".join(files))

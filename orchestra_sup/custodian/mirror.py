"""The git of a host's mirror: what the custodian sends it, what it keeps, and the bundle a
lane's commit goes back in (ADR 0021, step 5).

A host's lanes work in sandboxes cloned from a mirror of the workspace's history on the host,
never from the workspace. git's own machinery feeds it: the custodian `export`s the commit a
sandbox is asked at as a `git bundle` of what the mirror lacks (everything reachable from it,
less what is reachable from the commits the mirror says it has), sent in parts when it is
larger than one frame (`custodian.exports`), and the mirror `take`s it. A
lane's commit, made in the mirror (`Workspace.make_commit`), goes back as a bundle of that one
commit on its base (`Mirror.bundle_commit`), which `quarantine.land_bundle` checks before it
lands.

The mirror is a bare repository: the sandboxes are `git clone --shared` of it, and a commit is
made in it with the sandbox as the work tree, as the custodian does in the workspace. It keeps
one ref, `MIRROR_REF`, at the last commit it took, so `heads` is one commit and what it has is
everything reachable from it (each commit taken is a descendant of or beside the last, and an
older one stays in its object store, reachable or not: `take` of a commit already present needs
no bundle).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from orchestra_sup.custodian import git, history
from orchestra_sup.custodian.quarantine import first_line
from orchestra_sup.custodian.workspace import Workspace
from orchestra_sup.errors import BundleRefused

MIRROR_REF = "refs/mirror/head"
"""The mirror's one ref: the last commit it took."""
EXPORT_REF = "refs/mirror-export/head"
"""Where the custodian points the commit it bundles for the moment it takes (git bundles name
their heads by ref)."""
LANE_REF = "refs/lanes/"
"""Where a mirror points a lane's commit while it bundles it."""


async def export(root: Path, rev: str | None, have: list[str], dest: Path) -> tuple[str, int]:
    """The commit `rev` names in the repository at `root` (None: HEAD), as `(sha, size)`: the
    full sha, and the size in bytes of the `git bundle` written at `dest` whose one head is it,
    less everything reachable from the commits of `have` the repository holds (others are
    ignored: a host may name commits this workspace never had). `size` is 0, and nothing is
    written, when `sha` is reachable from one of them.

    Raises `RemoteError` for a `rev` that is not one revision (`bad_request`) or names no
    commit (`not_found`), as `history.resolve` does; `GitError` for any other git failure."""
    sha = await history.resolve(root, rev or "HEAD")
    known = [h for h in have if await _is_commit(root, h)]
    for commit in known:
        reached = await git.run(root, "merge-base", "--is-ancestor", sha, commit, check=False)
        if reached.returncode == 0:
            return sha, 0
    await git.run(root, "update-ref", EXPORT_REF, sha)
    try:
        await git.run(
            root, "bundle", "create", "--quiet", str(dest), EXPORT_REF, *(f"^{c}" for c in known)
        )
    finally:
        await git.run(root, "update-ref", "-d", EXPORT_REF, check=False)
    return sha, dest.stat().st_size


async def _is_commit(root: Path, sha: str) -> bool:
    if not sha or len(sha) > 64 or not all(c in "0123456789abcdef" for c in sha):
        return False
    found = await git.run(root, "cat-file", "-e", f"{sha}^{{commit}}", check=False)
    return found.returncode == 0


class Mirror:
    """A host's mirror of the workspace's history, a bare repository at `root` (module
    docstring). Every git failure not described otherwise raises `GitError`."""

    def __init__(self, root: Path):
        self.root = Path(root)

    async def open(self) -> None:
        """Make the bare repository if it is not there yet; idempotent."""
        if not (self.root / "HEAD").exists():
            self.root.mkdir(parents=True, exist_ok=True)
            await git.run(self.root, "init", "--quiet", "--bare")

    def workspace(self) -> Workspace:
        """The mirror as a `Workspace`: `create_sandbox` clones from it, `make_commit` commits
        in it (never `land`: the root's custodian lands)."""
        return Workspace(self.root)

    async def heads(self) -> list[str]:
        """The commits the mirror says it has: `MIRROR_REF`'s, or none before its first take."""
        found = await git.run(
            self.root, "rev-parse", "--verify", "--quiet", MIRROR_REF, check=False
        )
        return [found.stdout.strip()] if found.returncode == 0 else []

    async def take(self, sha: str, bundle: Path | None) -> None:
        """Take the bundle at path `bundle` (an `export`'s; None: nothing) so that commit `sha`
        is in the mirror, and point `MIRROR_REF` at it. Raises `BundleRefused` when `bundle`
        is not a git bundle this mirror can take, or `sha` is still not a commit here after
        it."""
        if bundle is not None:
            verified = await git.run(
                self.root, "bundle", "verify", "--quiet", str(bundle), check=False
            )
            if verified.returncode != 0:
                raise BundleRefused(
                    f"the mirror cannot take the bundle of {sha[:12]}: "
                    f"{first_line(verified.stderr) or 'not a git bundle'}"
                )
            fetched = await git.run(
                self.root, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head",
                str(bundle), f"+{EXPORT_REF}:{MIRROR_REF}", check=False,
            )  # fmt: skip
            if fetched.returncode != 0:  # `verify` passes a bundle of no head at all
                raise BundleRefused(
                    f"the mirror cannot take the bundle of {sha[:12]}: "
                    f"{first_line(fetched.stderr) or 'git fetch failed'}"
                )
        if not await _is_commit(self.root, sha):
            raise BundleRefused(f"commit {sha[:12]} is not in the mirror after its bundle")
        await git.run(self.root, "update-ref", MIRROR_REF, sha)

    async def bundle_commit(self, lane: str, base: str, commit: str) -> bytes:
        """The bytes of a `git bundle` of exactly `commit`, on prerequisite `base`, its one head
        `refs/lanes/<lane>`: what `quarantine.land_bundle` takes."""
        ref = f"{LANE_REF}{lane}"
        with tempfile.TemporaryDirectory(prefix="orchestra-sup-lane-") as private:
            path = Path(private) / "lane.bundle"
            await git.run(self.root, "update-ref", ref, commit)
            try:
                await git.run(self.root, "bundle", "create", "--quiet", str(path), ref, f"^{base}")
            finally:
                await git.run(self.root, "update-ref", "-d", ref, check=False)
            return path.read_bytes()

"""A lane's commit that comes back from a host as a git bundle: taken into a quarantine ref,
checked, and only then landed (ARCHITECTURE.md §12, invariant 16; ADR 0021, step 5).

A host's lane works in a sandbox made from the host's mirror of the workspace, so its commit is
made there and comes back as bytes: a `git bundle` holding one commit on the base the custodian
gave the lane. The custodian never opens the host's repository, nor the lane's: it has the
bundle's bytes only. `land_bundle`:

1. refuses a bundle over `MAX_BUNDLE_BYTES` before git reads it;
2. writes it to a private temporary file; `git bundle list-heads` must name exactly one head,
   and `git bundle verify` must find every prerequisite in the workspace;
3. checks every object the bundle brings, before any enters the workspace: its pack is
   unpacked with `git unpack-objects --strict` (git's fsck of each object) into a throwaway
   object directory, the workspace's objects its alternate (for the deltas on the base). git
   2.39 does not fsck what `fetch` takes from a bundle, whatever `transfer.fsckObjects` says
   (git 2.46 does). Then it fetches that head into `refs/quarantine/<lane>`;
4. checks the commit it fetched: exactly one parent, the base the custodian gave the lane; the
   lane's trailer (`Orchestra-Lane: <lane>`), its idempotency key; no path with a `.git`
   component and no new gitlink in its change (the checks `Workspace.commit_sandbox` makes of a
   local sandbox's working tree);
5. lands it with the workspace's own fast-forward or cherry-pick (`Workspace.land`), and
   deletes the quarantine ref, whatever happened.

A lane whose commit already landed is answered with that commit, the bundle unread, so a host
re-sending it after a lost answer cannot land it twice. Objects that a refused bundle brought
into the object store stay unreferenced, and `git gc` prunes them in time.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from orchestra_sup.custodian import git
from orchestra_sup.custodian.workspace import Workspace, has_git_component, trailer
from orchestra_sup.errors import BundleRefused, WorkspaceError
from orchestra_sup.protocol.codec import MAX_FRAME_BYTES

MAX_BUNDLE_BYTES = MAX_FRAME_BYTES - 64 * 1024
"""The largest bundle a lane's commit may come in (bytes): what one `SandboxLand` frame holds
with its envelope."""
QUARANTINE = "refs/quarantine/"
"""Where a bundle's commit waits while it is checked."""
_FSCK = ("-c", "transfer.fsckObjects=true", "-c", "fetch.fsckObjects=true")
_LANE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


async def land_bundle(ws: Workspace, lane: str, bundle: bytes, base: str) -> str:
    """Land lane `lane`'s commit from `bundle` (the bytes of a `git bundle`), made on commit
    `base`, in workspace `ws`; return the workspace's new HEAD (module docstring).

    Raises `BundleRefused` (a `WorkspaceError`, answered `bad_request`) naming the lane when
    the bundle is refused: over
    `MAX_BUNDLE_BYTES`, not a bundle, not exactly one head, a prerequisite the workspace does
    not have, an object that fails git's fsck, a commit that is not one commit on `base`, no
    lane trailer, a `.git` path or a new gitlink, or a lane id that cannot name a ref. Raises
    `CommitConflict` when its change conflicts with the branch (the workspace as it was), and
    `GitError` for any other git failure. The caller runs it in the custodian's serial queue,
    as it does `commit_sandbox`."""
    if not _LANE.fullmatch(lane):
        raise BundleRefused(f"lane {lane!r}: not a lane id a bundle can be taken for")
    if len(bundle) > MAX_BUNDLE_BYTES:
        raise BundleRefused(
            f"lane {lane}: its bundle is {len(bundle):,} bytes, over {MAX_BUNDLE_BYTES:,}"
        )
    landed = await ws.landed(lane)
    if landed is not None:
        return landed
    ref = f"{QUARANTINE}{lane}"
    try:
        with tempfile.TemporaryDirectory(prefix="orchestra-sup-bundle-") as private:
            path = Path(private) / "lane.bundle"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(bundle)
            head = await _one_head(ws, lane, path)
            await _fsck(ws, lane, bundle, Path(private) / "objects")
            await _fetch(ws, lane, path, head, ref)
        sha = await _checked(ws, lane, ref, base)
        return await ws.land(lane, sha)
    finally:
        await git.run(ws.root, "update-ref", "-d", ref, check=False)


async def _one_head(ws: Workspace, lane: str, path: Path) -> str:
    """The bundle's one head ref, once `git bundle verify` finds its prerequisites."""
    listed = await git.run(ws.root, "bundle", "list-heads", str(path), check=False)
    heads = [line.split(" ", 1) for line in listed.stdout.splitlines() if line.strip()]
    if listed.returncode != 0 or len(heads) != 1 or len(heads[0]) != 2:
        raise BundleRefused(
            f"lane {lane}: its bundle is not a git bundle of one head "
            f"({first_line(listed.stderr) or f'{len(heads)} heads'})"
        )
    verified = await git.run(ws.root, "bundle", "verify", "--quiet", str(path), check=False)
    if verified.returncode != 0:
        raise BundleRefused(
            f"lane {lane}: its bundle needs commits the workspace does not have "
            f"({first_line(verified.stderr)})"
        )
    return heads[0][1]


async def _fsck(ws: Workspace, lane: str, bundle: bytes, scratch: Path) -> None:
    """Unpack the bundle's pack with `--strict` into `scratch`, an object directory of its
    own: git's fsck of every object, none written into the workspace."""
    end = bundle.find(b"\n\n")  # the header ends with an empty line; the pack follows
    if end < 0:
        raise BundleRefused(f"lane {lane}: its bundle has no pack")
    git_dir = (await git.run(ws.root, "rev-parse", "--absolute-git-dir")).stdout.strip()
    scratch.mkdir(mode=0o700)
    env = {
        "GIT_OBJECT_DIRECTORY": str(scratch),
        "GIT_ALTERNATE_OBJECT_DIRECTORIES": os.path.join(git_dir, "objects"),
    }
    unpacked = await git.run(
        ws.root, "unpack-objects", "--strict", "-q", env=env, stdin=bundle[end + 2 :], check=False
    )
    if unpacked.returncode != 0:
        raise BundleRefused(
            f"lane {lane}: its bundle is refused by git's fsck ({first_line(unpacked.stderr)})"
        )


async def _fetch(ws: Workspace, lane: str, path: Path, head: str, ref: str) -> None:
    """Bring the bundle's objects in (checked by `_fsck`), its head at `ref`."""
    fetched = await git.run(
        ws.root,
        *_FSCK,
        "fetch",
        "--quiet",
        "--no-tags",
        "--no-write-fetch-head",
        str(path),
        f"+{head}:{ref}",
        check=False,
    )
    if fetched.returncode != 0:
        raise BundleRefused(
            f"lane {lane}: its bundle cannot be fetched ({first_line(fetched.stderr)})"
        )


async def _checked(ws: Workspace, lane: str, ref: str, base: str) -> str:
    """The quarantined commit's sha, once it is one commit on `base` that carries the lane's
    trailer and adds no `.git` path and no gitlink."""
    listed = await git.run(
        ws.root, "rev-list", "--parents", "-n", "1", f"{ref}^{{commit}}", check=False
    )
    if listed.returncode != 0:
        raise BundleRefused(f"lane {lane}: its bundle's head is not a commit")
    sha, *parents = listed.stdout.split()
    if parents != [base]:
        raise BundleRefused(
            f"lane {lane}: its bundle must hold one commit on {base[:12]}, its base; "
            f"{sha[:12]} has parents {', '.join(p[:12] for p in parents) or 'none'}"
        )
    body = await git.run(ws.root, "log", "-1", "--format=%B", sha)
    if trailer(lane) not in body.stdout.splitlines():
        raise BundleRefused(f"lane {lane}: its commit {sha[:12]} lacks '{trailer(lane)}'")
    raw = await git.run(ws.root, "diff-tree", "-r", "--raw", "-z", "--no-renames", base, sha)
    names = raw.stdout.split("\0")[1::2]
    for name in names:
        if has_git_component(name):
            raise BundleRefused(f"lane {lane} tries to commit the .git path {name!r} by bundle")
    try:
        ws.refuse_new_gitlinks(lane, "its bundle", raw.stdout)
    except WorkspaceError as exc:
        raise BundleRefused(str(exc)) from None
    return sha


def first_line(text: str) -> str:
    """git's first non-blank line of `text` (its stderr), at most 200 characters: the reason
    a one-line refusal gives."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:200]

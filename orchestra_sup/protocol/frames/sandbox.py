"""The sandbox channel: shard -> custodian (`Sandbox`): a checkout for a lane, and the commit
of its changes."""

from __future__ import annotations

from orchestra_sup.protocol.frames.frame import Frame


class SandboxCreate(Frame, tag="sandbox_create"):
    """Ask the custodian for a checkout of the workspace for `lane`: at its current head, or at
    `rev` (one revision as git names it: a sha, a short sha, a branch, `HEAD~3`), resolved when
    the sandbox is made. Answered `SandboxReady`; a `rev` that names no commit is
    `Error(not_found)` ("unknown rev 'X': no such commit"), one that is not a single revision
    `Error(bad_request)`."""

    lane: str
    rev: str | None = None


class SandboxReady(Frame, tag="sandbox_ready"):
    """A sandbox exists at `path`, checked out (detached) at `rev`, a full sha."""

    lane: str
    path: str
    rev: str


class SandboxCommit(Frame, tag="sandbox_commit"):
    """Commit the lane's sandbox changes into the workspace's current branch."""

    lane: str
    message: str


class CommitDone(Frame, tag="commit_done"):
    """`commit` is the new workspace commit, or None when the sandbox had no change."""

    lane: str
    commit: str | None


class SandboxLand(Frame, tag="sandbox_land"):
    """Land the lane's commit that comes as `bundle`, the bytes of a `git bundle` of one commit
    on `base` (a host's lane, whose sandbox the custodian never sees: `custodian.quarantine`).
    Answered `CommitDone`."""

    lane: str
    base: str
    bundle: bytes


Sandbox = SandboxCreate | SandboxReady | SandboxCommit | SandboxLand | CommitDone

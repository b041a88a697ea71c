"""The sandbox channel: shard -> custodian (`Sandbox`): a checkout for a lane, and the commit
of its changes."""

from __future__ import annotations

from orchestra_sup.protocol.frames.frame import Frame


class SandboxCreate(Frame, tag="sandbox_create"):
    """Ask the custodian for a checkout of the workspace's current head for `lane`."""

    lane: str


class SandboxReady(Frame, tag="sandbox_ready"):
    """A sandbox exists at `path`, checked out at `rev`."""

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


Sandbox = SandboxCreate | SandboxReady | SandboxCommit | CommitDone

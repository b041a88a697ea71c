"""The sandbox channel: shard -> custodian (`Sandbox`): a checkout for a lane, and the commit
of its changes. On a host, shard -> the host's mirror, which asks the root's custodian for the
commits it lacks (`SandboxFetch`) and lands a lane's commit as a bundle (`SandboxLand`)."""

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
    """Commit the lane's sandbox changes into the workspace's current branch. `fence` is the
    lane's `LaneStart.fence` (0: a lane of the root's own shards); a host's mirror passes it
    on in its `SandboxLand`."""

    lane: str
    message: str
    fence: int = 0


class SandboxDone(Frame, tag="sandbox_done"):
    """A shard to its sandboxes' maker: lane `lane` ended, its result on its way. The sandbox
    is kept `[retention] sandboxes_s` from now, then removed (`custodian.sandboxes`).
    Answered `Ack`."""

    lane: str


class CommitDone(Frame, tag="commit_done"):
    """`commit` is the new workspace commit, or None when the sandbox had no change."""

    lane: str
    commit: str | None


class SandboxLand(Frame, tag="sandbox_land"):
    """Land the lane's commit that comes as `bundle`, the bytes of a `git bundle` of one commit
    on `base` (a host's lane, whose sandbox the custodian never sees: `custodian.quarantine`).
    Answered `CommitDone`; `Error(fenced)` when `fence` is not the token etcd holds for the
    lane under the sending host's lease (`cluster.fences`): the attempt was fenced, and its
    commit never lands."""

    lane: str
    base: str
    bundle: bytes
    fence: int = 0


class SandboxFetch(Frame, tag="sandbox_fetch"):
    """A host's mirror asks for the commit `rev` names now (None: the workspace's head; `rev` as
    `SandboxCreate` takes it), as a bundle of what the mirror lacks: `have` are the commits it
    holds (at most `HAVE_MAX`; ones the workspace never had are ignored). Answered
    `SandboxBundle`; a `rev` that names no commit is `Error(not_found)`, one that is not one
    revision `Error(bad_request)`."""

    rev: str | None = None
    have: list[str] = []


class SandboxBundle(Frame, tag="sandbox_bundle"):
    """The commit asked for, `rev` (a full sha), and `bundle`: a `git bundle` whose one head is
    it, holding what the mirror lacked (b"": it lacked nothing), or a part of one.

    `size` is the whole bundle's, in bytes (0: `bundle` is all of it). A bundle larger than
    one part comes in parts (`custodian.exports`): this one holds bytes `offset` to `offset +
    len(bundle)`, and the next is asked with `SandboxFetchPart(export, offset + len(bundle))`
    until `size` bytes came."""

    rev: str
    bundle: bytes
    size: int = 0
    offset: int = 0
    export: str = ""


class SandboxFetchPart(Frame, tag="sandbox_fetch_part"):
    """The part at `offset` (bytes) of the bundle a `SandboxBundle` named `export`. Answered
    `SandboxBundle`; `Error(not_found)` when the custodian no longer keeps it (it was read to
    its end, left unread too long, or the custodian restarted: fetch again), `Error(
    bad_request)` for an offset outside it."""

    export: str
    offset: int


HAVE_MAX = 64
"""The most commits a `SandboxFetch` may say the mirror has."""


Sandbox = (
    SandboxCreate
    | SandboxReady
    | SandboxCommit
    | SandboxLand
    | CommitDone
    | SandboxFetch
    | SandboxBundle
    | SandboxFetchPart
    | SandboxDone
)

"""The error taxonomy of orchestra-sup.

A shallow hierarchy: every error the product raises on purpose is an `OrchestraError`, and each
family below it draws one line (see the class docstrings). Messages are built by the classes from
structured arguments, so the CLI can print `str(exc)` as the one line a user sees. An exception
that is one module's own concept stays in that module (`gate.Busy`, `rollover.RolloverFailed`,
`program.ProgramError`, ...) but derives from one of these too, so `except OrchestraError` and
`protocol.endpoint.unexpected` tell an error raised on purpose from a bug by its class alone
(`tests/unit/test_error_taxonomy.py` holds every exception class to that).

On the wire an error is never free text alone: `protocol.frames.Error` carries an `ErrorCode`
plus the message, and `RemoteError.from_frame` turns it back into an exception on the caller's side.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Callable, Iterable


class ErrorCode(enum.StrEnum):
    """Stable codes for errors that cross a process boundary (the `Error` frame's `code`)."""

    BAD_FRAME = "bad_frame"
    UNEXPECTED = "unexpected"
    STALE_GENERATION = "stale_generation"
    VERSION_SKEW = "version_skew"
    BAD_REQUEST = "bad_request"
    NOT_FOUND = "not_found"
    PEER_DOWN = "peer_down"
    TIMEOUT = "timeout"
    SHARD_FULL = "shard_full"
    STATE_DEGRADED = "state_degraded"
    FORBIDDEN = "forbidden"
    PATH_ESCAPE = "path_escape"
    GIT = "git"
    CONFLICT = "conflict"
    BUSY = "busy"
    INTERNAL = "internal"
    TOO_LARGE = "too_large"
    FENCED = "fenced"
    """A host's lane's commit or result, from an attempt that no longer owns the lane (its key
    in etcd is gone or is another attempt's: ADR 0021). Final: the sender drops it."""


class OrchestraError(Exception):
    """Base of every error orchestra-sup raises on purpose; `str()` is one line for a user."""


class ConfigError(OrchestraError):
    """A config file, CLI option or plan is invalid; raised before anything starts."""


class PlanError(ConfigError):
    """A plan is refused before any task runs: unknown key, duplicate id, missing dependency,
    cycle, or a value of the wrong type. `task` names the task when the problem is in one."""

    def __init__(self, problem: str, *, task: str | None = None, source: str | None = None):
        self.problem = problem
        self.task = task
        self.source = source
        where = f"{source}: " if source else ""
        who = f"task {task!r}: " if task else ""
        super().__init__(f"{where}{who}{problem}")


class ProtocolError(OrchestraError):
    """A frame could not be decoded or does not belong on the channel it arrived on.

    Raised by `protocol.codec.Codec.decode`; receivers answer it with an `Error` frame where a reply
    is possible and never let it stop their loop. `msg_id` is the refused frame's message id when
    it could still be read (all but a frame nested too deeply), so the answer can be correlated
    with the request; None otherwise. `Codec.encode` raises it too, code
    `too_large`, for a frame it will not send.
    """

    def __init__(self, code: ErrorCode, detail: str, *, msg_id: str | None = None):
        self.code = code
        self.detail = detail
        self.msg_id = msg_id
        super().__init__(f"{code}: {detail}")


class SupervisionError(OrchestraError):
    """The supervisor could not start, identify, stop or move a child (its fork template gone,
    a rollover step failed), or its run directory is taken."""


class DirBusy(SupervisionError):
    """Another live tree holds the lock of a run or state directory (`start` refuses to share
    either); `what` is "run directory" or "state directory"."""

    def __init__(self, what: str, directory: str, pid: int | None):
        self.directory = directory
        self.pid = pid
        owner = f" (supervisor pid {pid})" if pid else ""
        super().__init__(f"{what} {directory} is owned by a live tree{owner}")


class ChildStartError(SupervisionError):
    """A child exited or missed its handshake deadline while starting."""

    def __init__(self, name: str, reason: str):
        self.name = name
        self.reason = reason
        super().__init__(f"child {name} failed to start: {reason}")


class ReleaseError(SupervisionError):
    """A release cannot be used: not an executable, its probe failed, or its protocol range does
    not overlap the tree's (`orchestra_sup.release`). Nothing was moved onto it."""

    code = ErrorCode.VERSION_SKEW


class TreeUnreachable(OrchestraError):
    """`ctl` found no tree at the run directory, or the tree did not answer within the timeout."""


class TreeBusy(OrchestraError):
    """The tree is up but takes no new ctl connection now: its supervisor is near its
    open-file limit and has shut `ctl.ipc` to newcomers (`protocol.connections`). Unlike
    `TreeUnreachable`, trying again shortly is the answer."""

    code = ErrorCode.BUSY


class RemoteError(OrchestraError):
    """A peer answered a request with an `Error` frame; `code` says which kind."""

    def __init__(self, code: ErrorCode, message: str):
        self.code = code
        self.message = message
        super().__init__(message)


class RelayError(OrchestraError):
    """A relayed call did not complete.

    `PeerDown` means the call was never delivered (safe to retry); `CallTimeout` means the outcome
    is unknown (the peer may have acted).
    """


class PeerDown(RelayError):
    """The peer is not connected (down or restarting); the call was not delivered."""

    def __init__(self, peer: str):
        self.peer = peer
        super().__init__(f"{peer} is down; the call was not delivered")


class CallTimeout(RelayError):
    """No reply before the deadline: the outcome is unknown, the peer may have acted."""

    def __init__(self, peer: str, what: str, timeout_s: float):
        self.peer = peer
        super().__init__(
            f"{what} to {peer} got no reply within {timeout_s:g} s; the outcome is unknown"
        )


class WaitTimeout(CallTimeout):
    """A wait for a plan to end reached its own deadline (`Client.wait`): the plan has not
    ended and runs on; nothing is unknown about it."""

    def __init__(self, plan: str, timeout_s: float):
        self.peer = "the coordinator"
        RelayError.__init__(self, f"plan {plan} has not ended after {timeout_s:g} s; it runs on")


class StateError(OrchestraError):
    """The state plane could not open or write its LMDB environment."""


class WorkspaceError(OrchestraError):
    """The workspace is not usable: missing, not a directory, not a git repository, or no commit."""


class BundleRefused(WorkspaceError):
    """A host's lane's commit, come as a git bundle, is refused before it lands (not a bundle,
    a missing base, an object git's fsck refuses, more than one commit, no lane trailer, a `.git`
    path): bad input from the host, answered `bad_request` (`custodian.quarantine`)."""

    code = ErrorCode.BAD_REQUEST


class PathEscape(OrchestraError):
    """A read tool's path would leave the workspace (`..`, an absolute path, a symlink whose
    target resolves outside it) or reach into its `.git`."""

    code = ErrorCode.PATH_ESCAPE

    def __init__(self, path: str):
        self.path = path
        where = "reaches into .git" if ".git" in path.lower().split("/") else "leaves the workspace"
        super().__init__(f"path {path!r} {where}")


class CommitConflict(OrchestraError):
    """A sandbox's change does not apply on the workspace's current head (something that landed
    since the sandbox was made touches the same lines); nothing was written."""

    code = ErrorCode.CONFLICT

    def __init__(self, lane: str, detail: str):
        self.lane = lane
        self.detail = detail
        super().__init__(f"commit from lane {lane} conflicts with the workspace head: {detail}")


class GitError(OrchestraError):
    """A git command failed; the message names the command and git's own last line."""

    code = ErrorCode.GIT

    def __init__(self, args: list[str], returncode: int, stderr: str):
        self.args_ = args
        self.returncode = returncode
        lines = stderr.strip().splitlines()
        # git's own diagnosis is its first fatal/error line; hints and "Aborting" come after
        cause = next((ln for ln in lines if ln.startswith(("fatal:", "error:"))), None)
        detail = cause or (lines[-1] if lines else f"exit {returncode}")
        super().__init__(f"git {' '.join(args[:2])} failed: {detail}")


# --- the near name, for an error that refuses a mistyped one ------------------------------------

SUGGEST_CUTOFF = 0.6
"""How alike (difflib's ratio, 0 to 1) a name must be to be offered: 0.6 takes a dropped or
added letter or two (`need`, `watchdog`, `timeout`) and leaves unrelated words alone."""


def did_you_mean(name: object, names: Iterable[str], shown: Callable[[str], str] = repr) -> str:
    """`: did you mean 'needs'?` for the one of `names` closest to `name` (difflib's
    `get_close_matches`, at least `SUGGEST_CUTOFF` alike), else the first that `name` begins,
    or begins with, as whole `_`-separated words (`lanes` -> `lanes_per_shard`), written with
    `shown` (default `repr`); "" when none is near or `name` is not a string (a TOML key always
    is; a value that should have been one may not be)."""
    if not isinstance(name, str) or not name:
        return ""
    choices = list(names)
    near = difflib.get_close_matches(name, choices, n=1, cutoff=SUGGEST_CUTOFF)
    near = near or [c for c in choices if c.startswith(f"{name}_") or name.startswith(f"{c}_")]
    return f": did you mean {shown(near[0])}?" if near else ""

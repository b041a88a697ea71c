"""The custodian's history tools, `diff` and `log`: what changed in the workspace, read through
git (`custodian.git`, with the read-only config below) as an async subprocess the custodian awaits;
and `resolve`, the commit a revision names (where a sandbox is made: `SandboxCreate.rev`).

Paths are taken as the other read tools take them (`readtools.resolve`: workspace-relative,
refused by `PathEscape` if they would leave the root or enter `.git`), and then literally (no
pathspec magic); a rev is one revision or `A..B`, checked before git sees it. A refused rev or
limit raises `RemoteError(BAD_REQUEST, ...)`, an unknown rev `RemoteError(NOT_FOUND, ...)`.
Neither tool writes anything, the index included.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from orchestra_sup.custodian import git, readtools
from orchestra_sup.errors import ErrorCode, GitError, RemoteError
from orchestra_sup.protocol.names import wire

DIFF_MAX_BYTES = 8 * 1024 * 1024
"""`diff` output past this (8 MiB) is cut and reported `truncated`."""
LOG_DEFAULT_LIMIT = 50
"""Commits `log` returns by default."""
LOG_MAX_LIMIT = 1000
"""The largest `limit` `log` accepts."""
LOG_MAX_BYTES = 8 * 1024 * 1024
"""`log` output past this (8 MiB) is cut to whole commits and reported `truncated`."""
MAX_REV_LENGTH = 256

# One side of a rev: a ref name, a sha, with `~N`, `^N`, `^{...}` or `@{...}` suffixes. It cannot
# start with `-` (an option), and holds no whitespace, `:` (blob or message-search syntax), `*`,
# `?`, `[`, `\` or control characters.
_REV_SIDE = re.compile(r"[A-Za-z0-9_@][A-Za-z0-9_@./+^~{}-]*")

# Readers only: no optional index refresh (`git diff` would otherwise rewrite .git/index when
# file stat data changed, racing the custodian's own commits for index.lock), literal pathspecs
# (no `:(glob)`, `:/` or `*` magic: a name is only ever itself, and it always comes after `--`,
# so it is never an option either), and names in diff headers C-quoted whatever the user's
# config says (`core.quotePath`: a name that is not UTF-8 stays exact in the text).
_READ_ENV = {"GIT_OPTIONAL_LOCKS": "0", "GIT_LITERAL_PATHSPECS": "1"}
_READ_CONFIG = (
    "-c",
    "diff.autoRefreshIndex=false",
    "-c",
    "core.quotePath=true",
    "--literal-pathspecs",
)


def _rev_sides(rev: str) -> list[str]:
    """The revisions named by `rev` (one, or the non-empty sides of `A..B`).

    Raises `RemoteError(BAD_REQUEST)` unless `rev` is one revision or `A..B` (either side may be
    empty, meaning HEAD, not both) whose sides match `_REV_SIDE`.
    """
    refused = readtools.bad_request(
        f"rev {rev!r} is refused: give a revision (HEAD, HEAD~3, a sha, a branch name) or A..B"
    )
    if not rev or len(rev) > MAX_REV_LENGTH or "..." in rev:
        raise refused
    sides = rev.split("..")
    if len(sides) > 2 or not any(sides):
        raise refused
    if len(sides) == 1 and not sides[0]:
        raise refused
    for side in sides:
        if side and _REV_SIDE.fullmatch(side) is None:
            raise refused
    return [side for side in sides if side]


async def _commit_of(root: Path, side: str) -> str | None:
    """The full sha of the commit one checked revision `side` names, or None when it names
    none."""
    res = await git.run(
        root,
        "rev-parse",
        "--verify",
        "--quiet",
        "--end-of-options",
        side + "^{commit}",
        check=False,
        env=_READ_ENV,
    )
    return res.stdout.strip() if res.returncode == 0 else None


async def _verify_rev(root: Path, rev: str) -> None:
    """Check `rev` (see `_rev_sides`) and that each revision it names is a commit."""
    for side in _rev_sides(rev):
        if await _commit_of(root, side) is None:
            what = f"rev {rev!r}" if side == rev else f"rev {side!r} (in {rev!r})"
            raise RemoteError(ErrorCode.NOT_FOUND, f"unknown {what}: no such commit")


async def resolve(root: Path, rev: str) -> str:
    """The full sha of the commit `rev` names in the repository at `root`: one revision (a
    sha, a short sha, a branch, `HEAD~3`), as a sandbox is made at (`SandboxCreate.rev`).

    Raises `RemoteError(BAD_REQUEST)` when `rev` is not one revision (`A..B` included) or is
    longer than `MAX_REV_LENGTH`, `RemoteError(NOT_FOUND)` ("unknown rev 'X': no such commit")
    when it names no commit."""
    if ".." in rev or not rev or len(rev) > MAX_REV_LENGTH or _REV_SIDE.fullmatch(rev) is None:
        raise readtools.bad_request(
            f"rev {rev!r} is refused: give one revision (HEAD~3, a sha, a branch name)"
        )
    sha = await _commit_of(root, rev)
    if sha is None:
        raise RemoteError(ErrorCode.NOT_FOUND, f"unknown rev {rev!r}: no such commit")
    return sha


async def _read_git(
    root: Path, command: list[str], path: str, rev: str, max_bytes: int
) -> tuple[PurePosixPath, git.CappedResult]:
    """Run read-only git `command` (its options) on `rev`, restricted to workspace-relative
    `path` taken literally, with the read tools' config and its output capped at `max_bytes`;
    the normalised path and git's result. Raises `PathEscape` for a path `resolve` refuses,
    `RemoteError` for a refused or unknown `rev` (`_verify_rev`), `GitError` when git fails
    (a cut-off output is not a failure)."""
    pure = readtools.normalize(path)
    readtools.resolve(root, path)
    await _verify_rev(root, rev)
    args = [*command, "--end-of-options", rev, "--", *([pure.as_posix()] if pure.parts else [])]
    res = await git.run_capped(root, *_READ_CONFIG, *args, max_bytes=max_bytes, env=_READ_ENV)
    if not res.truncated and res.returncode != 0:
        raise GitError(args, res.returncode, res.stderr)
    return pure, res


async def diff(root: Path, path: str = "", rev: str = "HEAD") -> dict:
    """`git diff` of the workspace as unified diff text.

    With one revision, the working tree (tracked files; untracked ones never show) against it;
    with `A..B`, commit A against commit B. Restricted to workspace-relative `path` (a file or a
    directory, which need not exist any more; `""` is the whole tree), taken literally. External
    diff drivers, textconv filters and colour are off; the index is never refreshed or written.

    Returns `{"path": str, "rev": str, "diff": str, "truncated": bool}`: `diff` is the output
    decoded as UTF-8 (invalid bytes replaced), cut to its first 8 MiB when `truncated`; names in
    its headers are git's C-quoted form for anything but printable ASCII (`"caf\\351.txt"`),
    so they are exact. A `path` that is not UTF-8 comes with `path_b64`.

    Raises `PathEscape` for a path `resolve` refuses, `RemoteError(BAD_REQUEST)` for a refused
    `rev` (see `_rev_sides`), `RemoteError(NOT_FOUND)` when it names no commit, `GitError` if git
    fails otherwise.
    """
    command = ["diff", "--no-color", "--no-ext-diff", "--no-textconv"]
    pure, res = await _read_git(root, command, path, rev, DIFF_MAX_BYTES)
    return {
        **wire("path", readtools.display_path(pure.parts)),
        "rev": rev,
        "diff": readtools.decode(res.stdout, cut=res.truncated),
        "truncated": res.truncated,
    }


async def log(
    root: Path, path: str = "", rev: str = "HEAD", limit: int = LOG_DEFAULT_LIMIT
) -> dict:
    """`git log` from `rev` (one revision, or `A..B`: commits reachable from B and not from A),
    newest first, restricted to workspace-relative `path` (`""` is the whole tree), taken
    literally, at most `limit` commits (1..1000).

    Returns `{"path": str, "rev": str, "commits": [{"sha": str, "author": str, "date": str,
    "subject": str}], "truncated": bool}`: `sha` is the full sha, `author` the author's name,
    `date` the author date in strict ISO 8601, `subject` the first line of the message (UTF-8,
    invalid bytes replaced). `truncated` is true only when git's output ran past 8 MiB (huge
    subjects); the commits returned are then the whole ones read before the cut.

    Raises as `diff` does, and `RemoteError(BAD_REQUEST)` for a `limit` out of range.
    """
    readtools.check_limit(limit, LOG_MAX_LIMIT)
    command = [
        "log",
        "--no-color",
        "--no-show-signature",
        "--encoding=UTF-8",
        "-z",
        "--format=%H%x00%an%x00%aI%x00%s",
        f"--max-count={limit}",
    ]
    pure, res = await _read_git(root, command, path, rev, LOG_MAX_BYTES)
    fields = res.stdout.split(b"\0")
    # Every commit is four NUL-terminated fields; whatever follows the last complete one is an
    # empty string, or a partial commit when the output was cut.
    whole = (len(fields) - 1) // 4
    commits = [
        {
            "sha": fields[i].decode("ascii", errors="replace"),
            "author": fields[i + 1].decode("utf-8", errors="replace"),
            "date": fields[i + 2].decode("ascii", errors="replace"),
            "subject": fields[i + 3].decode("utf-8", errors="replace"),
        }
        for i in range(0, whole * 4, 4)
    ]
    return {
        **wire("path", readtools.display_path(pure.parts)),
        "rev": rev,
        "commits": commits,
        "truncated": res.truncated,
    }

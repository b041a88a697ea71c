"""Read-only tools the custodian serves to the coordinator over the workspace's working tree.

`read_file`, `list_dir`, `stat` and `search` are plain synchronous functions; the custodian runs
the first three on its front thread (`custodian/role.py`) and `search` in a child process. `diff`
and `log` are coroutines that run git as an async subprocess (through `custodian.git`); the
custodian awaits them. Every `path` argument is relative to the workspace
root, slash-separated, a str as `os.fsdecode` makes it (any name the file system allows;
`path_param` reads it from a request), and goes through `resolve`, which refuses anything that
would leave the root or enter a `.git` directory by raising `PathEscape`. Every name in an
answer is in the wire form of `protocol.names`. Bad parameters (a bad regex, a refused rev, a
limit out of range) raise `RemoteError(BAD_REQUEST, ...)`, an
unknown rev `RemoteError(NOT_FOUND, ...)`. None of the tools writes anything.

The check and the later open are two steps, so a symlink swapped in between could still be
followed; the workspace's working tree is written only by the custodian itself (lanes work in
their own sandboxes), which makes that window unusable in practice.
"""

from __future__ import annotations

import codecs
import errno
import os
import re
import stat as statmod
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath

from orchestra_sup.custodian import git
from orchestra_sup.errors import ErrorCode, GitError, PathEscape, RemoteError
from orchestra_sup.protocol.names import from_wire, wire

DEFAULT_MAX_BYTES = 8 * 1024 * 1024
"""Default cap of `read_file`, in bytes (8 MiB)."""


def _is_git_name(name: str) -> bool:
    # git itself treats `.git` case-insensitively when checking paths, so do we.
    return name.lower() == ".git"


def _parts(path: str) -> tuple[str, ...]:
    """The components of relative `path` (what `PurePosixPath(path).parts` gives, without the
    cost of building one); raises `PathEscape` for the shapes `resolve` refuses."""
    if "\0" in path or path.startswith("/"):
        raise PathEscape(path)
    parts = tuple(part for part in path.split("/") if part and part != ".")
    if any(part == ".." or _is_git_name(part) for part in parts):
        raise PathEscape(path)
    return parts


def _normalize(path: str) -> PurePosixPath:
    """`path` as a relative PurePosixPath; raises `PathEscape` for the shapes `resolve` refuses."""
    return PurePosixPath(*_parts(path))


def _display(parts: tuple[str, ...]) -> str:
    return "/".join(parts) or "."


def resolve(root: Path, path: str) -> Path:
    """Map a workspace-relative `path` to a filesystem path inside `root`.

    `""` and `"."` mean the root itself. Returns the realpath of `root` joined with the normalised
    `path`; its last component is not resolved, so a caller can still `lstat` a symlink.

    Raises `PathEscape(path)` when `path`
      * is absolute, or contains a NUL byte;
      * has any `..` component (even one that would stay inside);
      * has a component named `.git` (any case);
      * resolves, with every symlink followed, to a location outside the realpath of `root`, or
        inside one of its `.git` directories.
    The target need not exist (a missing file is the caller's `FileNotFoundError` to raise).
    """
    return Path(_resolve(root, path, _parts(path)))


def _resolve(root: Path, path: str, parts: tuple[str, ...]) -> str:
    # The realpath of the candidate is the candidate itself unless one of the components below
    # the (real) root is a symlink: `parts` has no `..` and no `.git`, and a component that does
    # not exist ends the walk, as it ends os.path.realpath's (nothing below it exists either).
    # So walk with one lstat per component, and only a symlink pays for the full realpath check.
    # This is the reads' hot path: realpath on root and candidate cost ~20 us of a ~100 us trip.
    real_root = os.path.realpath(root)
    candidate = os.path.join(real_root, *parts)
    walked = real_root
    for part in parts:
        walked = os.path.join(walked, part)
        try:
            mode = os.lstat(walked).st_mode
        except OSError:
            return candidate
        if statmod.S_ISLNK(mode):
            return _checked(real_root, candidate, path)
    return candidate


def _checked(real_root: str, candidate: str, path: str) -> str:
    """`candidate` if it resolves, with every symlink followed, inside `real_root` and outside
    its `.git` directories; raises `PathEscape(path)` otherwise."""
    target = PurePosixPath(os.path.realpath(candidate))
    if not target.is_relative_to(real_root):
        raise PathEscape(path)
    if any(_is_git_name(part) for part in target.relative_to(real_root).parts):
        raise PathEscape(path)
    return candidate


def _kind(mode: int) -> str:
    if statmod.S_ISLNK(mode):
        return "symlink"
    if statmod.S_ISDIR(mode):
        return "dir"
    if statmod.S_ISREG(mode):
        return "file"
    return "other"


def _size(mode: int, size: int) -> int:
    return 0 if statmod.S_ISDIR(mode) else size


def read_file(root: Path, path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> dict:
    """Read the regular file at workspace-relative `path` (symlinks inside the root followed).

    Returns `{"path": str, "size": int, "truncated": bool, "text": str}`:
      * `path`: the normalised relative path (slash-separated; with `path_b64` when it is not
        UTF-8, `protocol.names`);
      * `size`: the file's full size in bytes;
      * `truncated`: true when the file holds more than `max_bytes` bytes;
      * `text`: at most the first `max_bytes` bytes decoded as UTF-8, invalid bytes replaced by
        U+FFFD; a multi-byte character cut by the cap is dropped rather than replaced.

    Raises:
      * `PathEscape` for a path `resolve` refuses;
      * `FileNotFoundError` if nothing is there (or a dangling symlink);
      * `IsADirectoryError` if it is a directory;
      * `OSError(EINVAL)` for anything else that is not a regular file (FIFO, socket, device;
        opened non-blocking, so a FIFO never hangs the call);
      * `ValueError` if `max_bytes` is negative.
    """
    if max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
    parts = _parts(path)
    target = _resolve(root, path, parts)
    fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if statmod.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not statmod.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        # Read what fstat saw, never a `max_bytes` buffer: allocating 8 MiB for a 200-byte
        # file cost a fifth of a read's round trip.
        data = _read_upto(fd, min(max_bytes, st.st_size))
        truncated = len(data) == max_bytes and os.read(fd, 1) != b""
    finally:
        os.close(fd)
    text = _decode(data, cut=truncated)
    return {
        **wire("path", _display(parts)),
        "size": st.st_size,
        "truncated": truncated,
        "text": text,
    }


def list_dir(root: Path, path: str = "") -> dict:
    """List the directory at workspace-relative `path` (default: the root).

    Returns `{"path": str, "entries": [{"name": str, "type": str, "size": int}, ...]}` with
    entries sorted by name (their bytes) and any entry named `.git` (any case) left out; a name
    that is not UTF-8 comes with `path_b64` or `name_b64` (`protocol.names`). `type` is
    `"file"`, `"dir"`, `"symlink"` or `"other"`, from `lstat` (a symlink is reported as such,
    never followed). `size` is the `lstat` size in bytes: a file's length, a symlink's
    target-path length, 0 for a directory. An entry that vanishes while listing is skipped.

    Raises `PathEscape` for a path `resolve` refuses, `FileNotFoundError` if nothing is there,
    `NotADirectoryError` if it is not a directory.
    """
    parts = _parts(path)
    target = _resolve(root, path, parts)
    entries = []
    with os.scandir(target) as it:
        for entry in it:
            if _is_git_name(entry.name):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            entries.append((os.fsencode(entry.name), entry.name, st))
    entries.sort(key=lambda e: e[0])
    return {
        **wire("path", _display(parts)),
        "entries": [
            {
                **wire("name", name),
                "type": _kind(st.st_mode),
                "size": _size(st.st_mode, st.st_size),
            }
            for _raw, name, st in entries
        ],
    }


def stat(root: Path, path: str) -> dict:
    """Describe the entry at workspace-relative `path` without following a final symlink.

    Returns `{"path": str, "type": str, "size": int, "mtime": float}`: `path` (and `path_b64`)
    and `type` and `size` as in `list_dir`; `mtime` is the modification time in seconds since
    the Unix epoch.

    Raises `PathEscape` for a path `resolve` refuses (including a symlink whose target is outside
    the root) and `FileNotFoundError` if nothing is there.
    """
    parts = _parts(path)
    st = os.lstat(_resolve(root, path, parts))
    return {
        **wire("path", _display(parts)),
        "type": _kind(st.st_mode),
        "size": _size(st.st_mode, st.st_size),
        "mtime": st.st_mtime,
    }


# --- parameters ----------------------------------------------------------------------------------


def _bad_request(message: str) -> RemoteError:
    return RemoteError(ErrorCode.BAD_REQUEST, message)


def _check_limit(limit: int, maximum: int) -> None:
    if not 1 <= limit <= maximum:
        raise _bad_request(f"limit must be between 1 and {maximum}, got {limit}")


def path_param(params: Mapping[str, str], *, required: bool = False) -> str:
    """The request's path: `path_b64=` (its bytes in base64) or else `path=` (text), in the form
    `os.fsdecode` gives (`protocol.names.from_wire`); `""` (the root) when neither is given.

    Raises `RemoteError(BAD_REQUEST)` when `path_b64` is not base64, or `required` and neither
    is given.
    """
    path = from_wire(params, "path")
    if path is None:
        if required:
            raise _bad_request("missing parameter 'path' (or 'path_b64')")
        return ""
    return path


def required_param(params: Mapping[str, str], name: str) -> str:
    """`params[name]`; raises `RemoteError(BAD_REQUEST)` when it is missing."""
    value = params.get(name)
    if value is None:
        raise _bad_request(f"missing parameter {name!r}")
    return value


def limit_param(params: Mapping[str, str], default: int, maximum: int) -> int:
    """The integer `limit` parameter (`default` when missing or empty), between 1 and `maximum`.

    Raises `RemoteError(BAD_REQUEST)` for a non-integer or an out-of-range value.
    """
    raw = params.get("limit", "").strip()
    if not raw:
        return default
    try:
        limit = int(raw, 10)
    except ValueError:
        raise _bad_request(f"limit must be an integer, got {raw!r}") from None
    _check_limit(limit, maximum)
    return limit


# --- search --------------------------------------------------------------------------------------

SEARCH_DEFAULT_LIMIT = 200
"""Matches `search` returns by default."""
SEARCH_MAX_LIMIT = 10_000
"""The largest `limit` `search` accepts."""
SEARCH_MAX_FILE_BYTES = 4 * 1024 * 1024
"""Files larger than this (4 MiB) are skipped by `search`."""
SEARCH_MAX_TOTAL_BYTES = 64 * 1024 * 1024
"""`search` stops (and reports `truncated`) before reading more than this (64 MiB) in total."""
SEARCH_BINARY_PROBE = 8 * 1024
"""A file with a NUL byte in its first 8 KiB is binary and skipped by `search`."""
SEARCH_MAX_TEXT = 500
"""A match's `text` is cut to this many characters."""


def _sorted_entries(path: str) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: os.fsencode(e.name))
    except OSError:  # vanished, unreadable: nothing to search there
        entries = []
    return iter(entries)


def _walk_files(top: str, display: PurePosixPath) -> Iterator[tuple[str, PurePosixPath]]:
    """`(filesystem path, display path)` of every regular file under `top`, depth first in name
    order; `.git` entries (any case), symlinks and anything that is not a file or directory are
    skipped, so the walk never leaves `top`."""
    stack = [(_sorted_entries(top), display)]
    while stack:
        entries, base = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        if _is_git_name(entry.name):
            continue
        try:
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                stack.append((_sorted_entries(entry.path), base / entry.name))
            elif entry.is_file(follow_symlinks=False):
                yield entry.path, base / entry.name
        except OSError:
            continue


class _Scan:
    def __init__(self, rx: re.Pattern[str], limit: int, max_total_bytes: int) -> None:
        self.rx = rx
        self.limit = limit
        self.budget = max_total_bytes
        self.read = 0
        self.matches: list[dict] = []
        self.truncated = False

    def file(self, fs_path: str, display: PurePosixPath, *, follow: bool) -> None:
        """Search one file; sets `truncated` when a bound stops the scan."""
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        if not follow:
            flags |= getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(fs_path, flags)
        except OSError:
            return
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not statmod.S_ISREG(st.st_mode) or st.st_size > SEARCH_MAX_FILE_BYTES:
                return
            if self.read + st.st_size > self.budget:
                self.truncated = True
                return
            try:
                head = f.read(SEARCH_BINARY_PROBE)
                self.read += len(head)
                if b"\0" in head:
                    return
                rest = f.read(SEARCH_MAX_FILE_BYTES + 1 - len(head))
                self.read += len(rest)
            except OSError:
                return
        data = head + rest
        if len(data) > SEARCH_MAX_FILE_BYTES:  # grew since fstat
            return
        shown = wire("path", display.as_posix())
        lines = data.decode("utf-8", errors="replace").split("\n")
        if lines[-1] == "":
            lines.pop()
        for number, line in enumerate(lines, 1):
            text = line[:-1] if line.endswith("\r") else line
            if self.rx.search(text) is None:
                continue
            if len(self.matches) >= self.limit:
                self.truncated = True
                return
            self.matches.append({**shown, "line": number, "text": text[:SEARCH_MAX_TEXT]})


def search(
    root: Path,
    path: str,
    pattern: str,
    limit: int = SEARCH_DEFAULT_LIMIT,
    *,
    max_total_bytes: int = SEARCH_MAX_TOTAL_BYTES,
) -> dict:
    """Search the text files under workspace-relative `path` for the Python regex `pattern`.

    `path` is a directory (walked depth first in name order) or a file; `""` is the root. Each line
    (split on `\\n`, a trailing `\\r` dropped, decoded as UTF-8 with invalid bytes replaced) is
    matched with `re.search`. Skipped: any `.git` entry (any case), every symlink met while walking
    (a `path` that is itself a symlink inside the root is followed, as in `read_file`), binary files
    (a NUL byte in the first 8 KiB), files over 4 MiB, and anything unreadable.

    Returns `{"path": str, "pattern": str, "matches": [{"path": str, "line": int, "text": str}],
    "truncated": bool}`: match paths are workspace-relative, lines count from 1, `text` is the line
    cut to 500 characters. `truncated` is true when more than `limit` matches exist (the first
    `limit` are returned) or when the next file would take the bytes read past `max_total_bytes`
    (64 MiB; the scan stops there). A `path` that is not UTF-8 comes with `path_b64`.

    Raises `PathEscape` for a path `resolve` refuses, `FileNotFoundError` if nothing is there,
    `RemoteError(BAD_REQUEST)` for an invalid `pattern` or a `limit` outside 1..10_000.
    """
    _check_limit(limit, SEARCH_MAX_LIMIT)
    try:
        rx = re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        raise _bad_request(f"bad pattern {pattern!r}: {exc}") from None
    pure = _normalize(path)
    target = resolve(root, path)
    st = os.stat(target)
    scan = _Scan(rx, limit, max_total_bytes)
    if statmod.S_ISDIR(st.st_mode):
        for fs_path, display in _walk_files(str(target), pure):
            scan.file(fs_path, display, follow=False)
            if scan.truncated:
                break
    elif statmod.S_ISREG(st.st_mode):
        scan.file(str(target), pure, follow=True)
    return {
        **wire("path", _display(pure.parts)),
        "pattern": pattern,
        "matches": scan.matches,
        "truncated": scan.truncated,
    }


# --- git: diff and log ---------------------------------------------------------------------------

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
    refused = _bad_request(
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


async def _verify_rev(root: Path, rev: str) -> None:
    """Check `rev` (see `_rev_sides`) and that each revision it names is a commit."""
    for side in _rev_sides(rev):
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
        if res.returncode != 0:
            what = f"rev {rev!r}" if side == rev else f"rev {side!r} (in {rev!r})"
            raise RemoteError(ErrorCode.NOT_FOUND, f"unknown {what}: no such commit")


def _pathspec(root: Path, path: str) -> tuple[PurePosixPath, list[str]]:
    pure = _normalize(path)
    resolve(root, path)
    return pure, ([pure.as_posix()] if pure.parts else [])


def _read_upto(fd: int, size: int) -> bytes:
    """At most `size` bytes from `fd`, fewer only at end of file."""
    data = os.read(fd, size)
    if len(data) == size or not data:
        return data
    buf = bytearray(data)
    while len(buf) < size and (chunk := os.read(fd, size - len(buf))):
        buf += chunk
    return bytes(buf)


def _decode(data: bytes, *, cut: bool) -> str:
    if not cut:
        return data.decode("utf-8", errors="replace")
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return decoder.decode(data, final=not cut)


async def _read_git(root: Path, args: list[str], max_bytes: int) -> git.CappedResult:
    """A read-only git command with the read tools' config, its output capped at `max_bytes`.
    Raises `GitError` when git fails (a cut-off output is not a failure)."""
    res = await git.run_capped(root, *_READ_CONFIG, *args, max_bytes=max_bytes, env=_READ_ENV)
    if not res.truncated and res.returncode != 0:
        raise GitError(args, res.returncode, res.stderr)
    return res


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
    pure, spec = _pathspec(root, path)
    await _verify_rev(root, rev)
    args = [
        "diff",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "--end-of-options",
        rev,
        "--",
        *spec,
    ]
    res = await _read_git(root, args, DIFF_MAX_BYTES)
    return {
        **wire("path", _display(pure.parts)),
        "rev": rev,
        "diff": _decode(res.stdout, cut=res.truncated),
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
    _check_limit(limit, LOG_MAX_LIMIT)
    pure, spec = _pathspec(root, path)
    await _verify_rev(root, rev)
    args = [
        "log",
        "--no-color",
        "--no-show-signature",
        "--encoding=UTF-8",
        "-z",
        "--format=%H%x00%an%x00%aI%x00%s",
        f"--max-count={limit}",
        "--end-of-options",
        rev,
        "--",
        *spec,
    ]
    res = await _read_git(root, args, LOG_MAX_BYTES)
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
        **wire("path", _display(pure.parts)),
        "rev": rev,
        "commits": commits,
        "truncated": res.truncated,
    }

"""Read-only tools the custodian serves to the coordinator over the workspace's working tree.

`read_file`, `list_dir`, `stat` and `search` are plain synchronous functions; the custodian runs
the first three on its front thread (`custodian/role.py`) and `search` in a child process (the
history tools, `diff` and `log`, are in `custodian.history`). Every `path` argument is relative
to the workspace root, slash-separated, a str as `os.fsdecode` makes it (any name the file system
allows; `path_param` reads it from a request), and goes through `resolve`, which refuses anything
that would leave the root or enter a `.git` directory by raising `PathEscape`. Every `root`
argument is the root's realpath, as the custodian's `Workspace.root` is (`open_workspace`
resolves it once): it is not resolved again per call, which cost a read's round trip a lstat
per component of the root's own path. Every name in an
answer is in the wire form of `protocol.names` (`display_path` names the path). Bad parameters
(a bad regex, a limit out of range) raise `RemoteError(BAD_REQUEST, ...)` (`bad_request`). None
of the tools writes anything.

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

from orchestra_sup.errors import ErrorCode, PathEscape, RemoteError
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


def normalize(path: str) -> PurePosixPath:
    """`path` as a relative PurePosixPath; raises `PathEscape` for the shapes `resolve` refuses."""
    return PurePosixPath(*_parts(path))


def display_path(parts: tuple[str, ...]) -> str:
    """How an answer names the path made of `parts`: slash-joined, `"."` for the root."""
    return "/".join(parts) or "."


def resolve(root: Path, path: str) -> Path:
    """Map a workspace-relative `path` to a filesystem path inside `root`.

    `""` and `"."` mean the root itself. Returns `root` (a realpath: module docstring) joined
    with the normalised `path`; its last component is not resolved, so a caller can still
    `lstat` a symlink. Given a `root` that is not a realpath, the check still fails closed: a
    symlink below it resolves outside it, so it is refused.

    Raises `PathEscape(path)` when `path`
      * is absolute, or contains a NUL byte;
      * has any `..` component (even one that would stay inside);
      * has a component named `.git` (any case);
      * resolves, with every symlink followed, to a location outside `root`, or inside one of
        its `.git` directories.
    The target need not exist (a missing file is the caller's `FileNotFoundError` to raise).
    """
    return Path(_resolve(root, path, _parts(path)))


def _resolve(root: Path, path: str, parts: tuple[str, ...]) -> str:
    # The realpath of the candidate is the candidate itself unless one of the components below
    # the (real) root is a symlink: `parts` has no `..` and no `.git`, and a component that does
    # not exist ends the walk, as it ends os.path.realpath's (nothing below it exists either).
    # So walk with one lstat per component, and only a symlink pays for the full realpath check.
    # This is the reads' hot path: realpath on root and candidate cost ~20 us of a ~100 us trip.
    real_root = os.fspath(root)
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
    text = decode(data, cut=truncated)
    return {
        **wire("path", display_path(parts)),
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
        **wire("path", display_path(parts)),
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
        **wire("path", display_path(parts)),
        "type": _kind(st.st_mode),
        "size": _size(st.st_mode, st.st_size),
        "mtime": st.st_mtime,
    }


def _read_upto(fd: int, size: int) -> bytes:
    """At most `size` bytes from `fd`, fewer only at end of file."""
    data = os.read(fd, size)
    if len(data) == size or not data:
        return data
    buf = bytearray(data)
    while len(buf) < size and (chunk := os.read(fd, size - len(buf))):
        buf += chunk
    return bytes(buf)


def decode(data: bytes, *, cut: bool) -> str:
    """`data` as UTF-8 text, invalid bytes replaced; `cut` (the data was cut off at a size
    cap) leaves a sequence cut in half at its end out instead of replacing it."""
    if not cut:
        return data.decode("utf-8", errors="replace")
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return decoder.decode(data, final=not cut)


# --- parameters ----------------------------------------------------------------------------------


def bad_request(message: str) -> RemoteError:
    """The `RemoteError(BAD_REQUEST)` refusing a parameter, `message` its one line."""
    return RemoteError(ErrorCode.BAD_REQUEST, message)


def check_limit(limit: int, maximum: int) -> None:
    """Raise `bad_request` unless 1 <= `limit` <= `maximum`."""
    if not 1 <= limit <= maximum:
        raise bad_request(f"limit must be between 1 and {maximum}, got {limit}")


def path_param(params: Mapping[str, str], *, required: bool = False) -> str:
    """The request's path: `path_b64=` (its bytes in base64) or else `path=` (text), in the form
    `os.fsdecode` gives (`protocol.names.from_wire`); `""` (the root) when neither is given.

    Raises `RemoteError(BAD_REQUEST)` when `path_b64` is not base64, or `required` and neither
    is given.
    """
    path = from_wire(params, "path")
    if path is None:
        if required:
            raise bad_request("missing parameter 'path' (or 'path_b64')")
        return ""
    return path


def required_param(params: Mapping[str, str], name: str) -> str:
    """`params[name]`; raises `RemoteError(BAD_REQUEST)` when it is missing."""
    value = params.get(name)
    if value is None:
        raise bad_request(f"missing parameter {name!r}")
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
        raise bad_request(f"limit must be an integer, got {raw!r}") from None
    check_limit(limit, maximum)
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
    check_limit(limit, SEARCH_MAX_LIMIT)
    try:
        rx = re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        raise bad_request(f"bad pattern {pattern!r}: {exc}") from None
    pure = normalize(path)
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
        **wire("path", display_path(pure.parts)),
        "pattern": pattern,
        "matches": scan.matches,
        "truncated": scan.truncated,
    }

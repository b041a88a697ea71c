"""Read-only tools the custodian serves to the coordinator over the workspace's working tree.

`read_file`, `list_dir`, `stat` and `search` are plain synchronous functions; the custodian runs
them with `asyncio.to_thread`. `diff` and `log` are coroutines that run git as an async subprocess
(with the hardening of `workspace._git`); the custodian awaits them. Every `path` argument is
relative to the workspace root, slash-separated, and goes through `resolve`, which refuses anything
that would leave the root or enter a `.git` directory by raising `PathEscape`. Bad parameters
(a bad regex, a refused rev, a limit out of range) raise `RemoteError(BAD_REQUEST, ...)`, an
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

from orchestra_sup.custodian.workspace import _git, _git_capped
from orchestra_sup.errors import ErrorCode, GitError, PathEscape, RemoteError

DEFAULT_MAX_BYTES = 8 * 1024 * 1024
"""Default cap of `read_file`, in bytes (8 MiB)."""


def _is_git_name(name: str) -> bool:
    # git itself treats `.git` case-insensitively when checking paths, so do we.
    return name.lower() == ".git"


def _normalize(path: str) -> PurePosixPath:
    """`path` as a relative PurePosixPath; raises `PathEscape` for the shapes `resolve` refuses."""
    if "\0" in path:
        raise PathEscape(path)
    pure = PurePosixPath(path)
    if pure.is_absolute() or os.path.isabs(path):
        raise PathEscape(path)
    if any(part == ".." or _is_git_name(part) for part in pure.parts):
        raise PathEscape(path)
    return pure


def _display(pure: PurePosixPath) -> str:
    return pure.as_posix()


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
    pure = _normalize(path)
    real_root = Path(os.path.realpath(root))
    candidate = real_root.joinpath(*pure.parts)
    target = Path(os.path.realpath(candidate))
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
      * `path`: the normalised relative path (slash-separated);
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
    pure = _normalize(path)
    target = resolve(root, path)
    fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if statmod.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not statmod.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        data = f.read(max_bytes)
        truncated = len(data) == max_bytes and f.read(1) != b""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(data, final=not truncated)
    return {
        "path": _display(pure),
        "size": st.st_size,
        "truncated": truncated,
        "text": text,
    }


def list_dir(root: Path, path: str = "") -> dict:
    """List the directory at workspace-relative `path` (default: the root).

    Returns `{"path": str, "entries": [{"name": str, "type": str, "size": int}, ...]}` with
    entries sorted by name and any entry named `.git` (any case) left out. `type` is `"file"`,
    `"dir"`, `"symlink"` or `"other"`, from `lstat` (a symlink is reported as such, never
    followed). `size` is the `lstat` size in bytes: a file's length, a symlink's target-path
    length, 0 for a directory. An entry that vanishes while listing is skipped.

    Raises `PathEscape` for a path `resolve` refuses, `FileNotFoundError` if nothing is there,
    `NotADirectoryError` if it is not a directory.
    """
    pure = _normalize(path)
    target = resolve(root, path)
    entries = []
    with os.scandir(target) as it:
        for entry in it:
            if _is_git_name(entry.name):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            entries.append(
                {
                    "name": entry.name,
                    "type": _kind(st.st_mode),
                    "size": _size(st.st_mode, st.st_size),
                }
            )
    entries.sort(key=lambda e: e["name"])
    return {"path": _display(pure), "entries": entries}


def stat(root: Path, path: str) -> dict:
    """Describe the entry at workspace-relative `path` without following a final symlink.

    Returns `{"path": str, "type": str, "size": int, "mtime": float}`: `type` and `size` as in
    `list_dir`; `mtime` is the modification time in seconds since the Unix epoch.

    Raises `PathEscape` for a path `resolve` refuses (including a symlink whose target is outside
    the root) and `FileNotFoundError` if nothing is there.
    """
    pure = _normalize(path)
    st = os.lstat(resolve(root, path))
    return {
        "path": _display(pure),
        "type": _kind(st.st_mode),
        "size": _size(st.st_mode, st.st_size),
        "mtime": st.st_mtime,
    }

"""Running git for the custodian: the one seam every git command of the workspace, its sandboxes
and the read tools goes through.

Everything goes through the `git` CLI started with `asyncio.create_subprocess_exec` (no shell), so
no call blocks the event loop. Every git command runs with

* `-c core.hooksPath=/dev/null`: no repository hook (of the workspace or of a sandbox) ever runs
  inside the custodian;
* `-c core.fsmonitor=false`: a sandbox's config cannot name an fsmonitor program for us to run;
* `-c commit.gpgSign=false`: commits never wait on a signing agent;
* an environment without the variables that would point git at another repository (`GIT_DIR`,
  `GIT_WORK_TREE`, `GIT_INDEX_FILE`, ...) or set an identity, without a terminal prompt, and with
  the caller's `env` on top (the workspace's fixed identity wherever it writes a commit).

`run` is for any command and lets a running one finish when its caller is cancelled;
`run_capped` is for read-only commands whose output must be capped, and kills git instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from orchestra_sup.errors import GitError

_GIT_CONFIG = (
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "commit.gpgSign=false",
)

# Variables that would make git act on another repository or inject config; never inherited.
_ENV_DROP = frozenset(
    {
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
        "GIT_PREFIX",
        "GIT_CONFIG",
        "GIT_CONFIG_PARAMETERS",
        "GIT_CONFIG_COUNT",
        "GIT_AUTHOR_NAME",
        "GIT_AUTHOR_EMAIL",
        "GIT_AUTHOR_DATE",
        "GIT_COMMITTER_NAME",
        "GIT_COMMITTER_EMAIL",
        "GIT_COMMITTER_DATE",
    }
)


@dataclass(frozen=True)
class Result:
    """What `run` gives back: git's exit code, its stdout (`os.fsdecode`d) and stderr (UTF-8,
    invalid bytes replaced)."""

    returncode: int
    stdout: str
    stderr: str


def _git_env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _ENV_DROP and not k.startswith(("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_"))
    }
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["GIT_EDITOR"] = ":"
    if extra:
        env.update(extra)
    return env


async def _start_git(
    cwd: Path, args: tuple[str, ...], env: dict[str, str] | None, stdin: bool = False
) -> asyncio.subprocess.Process:
    """`git -C cwd <hardening config> args...` started with piped output, and a piped stdin
    when `stdin` (else none)."""
    return await asyncio.create_subprocess_exec(
        "git",
        "-C",
        str(cwd),
        *_GIT_CONFIG,
        *args,
        stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_git_env(env),
    )


async def run(
    cwd: Path,
    *args: str,
    check: bool = True,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
) -> Result:
    """Run `git -C cwd <hardening config> args...`, `stdin` (None: nothing) on its standard
    input, and return its exit code and output.

    Raises `GitError(list(args), returncode, stderr)` when `check` is true and git exits non-zero.
    Cancelling the caller lets the running git command finish (its output is still drained) before
    the cancellation propagates, so no single git command is ever killed half-way.
    """
    proc = await _start_git(cwd, args, env, stdin=stdin is not None)
    communicate = asyncio.ensure_future(proc.communicate(stdin))
    try:
        out, err = await asyncio.shield(communicate)
    except asyncio.CancelledError:
        await communicate
        raise
    assert proc.returncode is not None
    result = Result(proc.returncode, os.fsdecode(out), err.decode("utf-8", errors="replace"))
    if check and result.returncode != 0:
        raise GitError(list(args), result.returncode, result.stderr)
    return result


_CHUNK = 64 * 1024
_STDERR_KEEP = 64 * 1024


@dataclass(frozen=True)
class CappedResult:
    """What `run_capped` gives back: git's exit code (meaningless when `truncated`), at most
    `max_bytes` of its stdout as bytes, the first 64 KiB of its stderr (UTF-8, invalid bytes
    replaced), and whether stdout was cut."""

    returncode: int
    stdout: bytes
    stderr: str
    truncated: bool


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


async def _read_head(stream: asyncio.StreamReader, keep: int) -> bytes:
    """Read `stream` to its end, keeping only its first `keep` bytes."""
    buf = bytearray()
    while chunk := await stream.read(_CHUNK):
        if len(buf) < keep:
            buf += chunk[: keep - len(buf)]
    return bytes(buf)


async def run_capped(
    cwd: Path,
    *args: str,
    max_bytes: int,
    env: dict[str, str] | None = None,
) -> CappedResult:
    """Run a READ-ONLY git command like `run` (same config and environment), keeping at most
    `max_bytes` of its standard output as bytes.

    When the output runs past `max_bytes`, git is killed and the result has `truncated=True` (its
    `returncode` is then meaningless). Standard error keeps its first 64 KiB. Cancelling the caller
    kills git and reaps it before the cancellation propagates, which is why this is for commands
    that write nothing. Never raises `GitError`: the caller judges `returncode`.
    """
    proc = await _start_git(cwd, args, env)
    assert proc.stdout is not None and proc.stderr is not None
    errors = asyncio.ensure_future(_read_head(proc.stderr, _STDERR_KEEP))
    out = bytearray()
    truncated = False
    try:
        while chunk := await proc.stdout.read(_CHUNK):
            out += chunk
            if len(out) > max_bytes:
                truncated = True
                del out[max_bytes:]
                _kill(proc)
                break
    except BaseException:
        _kill(proc)
        raise
    finally:
        # Drain what is left so the pipes close and the process can be reaped.
        while await proc.stdout.read(_CHUNK):
            pass
        err = await errors
        returncode = await proc.wait()
    return CappedResult(returncode, bytes(out), err.decode("utf-8", errors="replace"), truncated)

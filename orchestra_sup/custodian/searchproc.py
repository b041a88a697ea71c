"""`search` in a child process, so a pathological pattern costs a killable process, not the
custodian.

Python's `re` holds the GIL for the whole of a match, so a catastrophic pattern (`(a+)+$` on a
long line of `a`) run in a worker thread still freezes the custodian's event loop: its heartbeats
stop and the watchdog kills it. Here the search runs in `python -m orchestra_sup.custodian.
searchproc`, arguments as JSON on stdin, the result as JSON on stdout, under `SEARCH_TIMEOUT_S`;
past it the child is killed and the caller gets a typed `timeout` error naming the pattern.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import msgspec

from orchestra_sup.custodian import readtools
from orchestra_sup.errors import ErrorCode, PathEscape, RemoteError

SEARCH_TIMEOUT_S = 10.0


class _Request(msgspec.Struct):
    root: bytes  # bytes, as the file system has them: a name need not be UTF-8
    path: bytes
    pattern: str
    limit: int


class _Reply(msgspec.Struct):
    value: Any = None
    code: str | None = None
    message: str | None = None


async def search(
    root: Path, path: str, pattern: str, limit: int, *, timeout_s: float = SEARCH_TIMEOUT_S
) -> Any:
    """`readtools.search` in a child process; the same result and errors, plus
    `RemoteError(timeout)` when it runs past `timeout_s` seconds (the child is killed)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "orchestra_sup.custodian.searchproc",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    request = msgspec.json.encode(_Request(os.fsencode(root), os.fsencode(path), pattern, limit))
    try:
        async with asyncio.timeout(timeout_s):
            out, _ = await proc.communicate(request)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RemoteError(
            ErrorCode.TIMEOUT,
            f"search for {pattern!r} ran past {timeout_s:g} s and was stopped "
            "(a pattern that backtracks catastrophically?)",
        ) from None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    try:
        reply = msgspec.json.decode(out, type=_Reply)
    except msgspec.DecodeError as exc:
        raise RemoteError(ErrorCode.INTERNAL, f"search process failed: {exc}") from exc
    if reply.code is not None:
        if reply.code == "path_escape":
            raise PathEscape(path)
        if reply.code == "not_found":
            raise FileNotFoundError(path)
        raise RemoteError(ErrorCode(reply.code), reply.message or "search failed")
    return reply.value


def main() -> None:
    req = msgspec.json.decode(sys.stdin.buffer.read(), type=_Request)
    root, path = Path(os.fsdecode(req.root)), os.fsdecode(req.path)
    try:
        reply = _Reply(value=readtools.search(root, path, req.pattern, req.limit))
    except PathEscape:
        reply = _Reply(code="path_escape")  # the caller raises its own, naming the path
    except FileNotFoundError:
        reply = _Reply(code="not_found")
    except RemoteError as exc:
        reply = _Reply(code=str(exc.code), message=exc.message)
    sys.stdout.buffer.write(msgspec.json.encode(reply))


if __name__ == "__main__":
    main()

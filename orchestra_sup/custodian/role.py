"""The tree custodian: the one writer of the workspace and the maker of every sandbox.

Ordered work (creating a sandbox, committing one) runs one at a time through a FIFO lock, because
both read and move the workspace's HEAD. Reads are independent: `read_file`, `list_dir`, `stat`
run in a worker thread, `search` in a child process with a time budget (Python's `re` holds the
GIL), `diff` and `log` are git subprocesses awaited off the loop,
each as soon as it arrives, at most `READ_CONCURRENCY` at once. Nothing runs git or the
filesystem on the receive loop (ARCHITECTURE.md §11.1).

The coordinator can never hold a sandbox: a `SandboxCreate` from it is refused with `forbidden`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from orchestra_sup.custodian import readtools, searchproc
from orchestra_sup.custodian.workspace import Workspace, open_workspace
from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.node.runtime import Node
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.endpoint import Endpoint

log = logging.getLogger(__name__)

READ_CONCURRENCY = 8
"""Read tools served at once; more wait their turn (a coordinator cannot fan out unbounded IO)."""


class Custodian:
    """The `custodian` role. See the module docstring."""

    def __init__(self) -> None:
        self.node: Node | None = None
        self.workspace: Workspace | None = None
        self.sandboxes: Path = Path()
        self._ordered = asyncio.Lock()
        self._reads = asyncio.Semaphore(READ_CONCURRENCY)
        self._busy = 0

    async def open(self, node: Node) -> None:
        self.node = node
        self.workspace = await open_workspace(node.paths.workspace, node.paths.state_dir)
        self.sandboxes = node.paths.state_dir / "sandboxes"
        self.sandboxes.mkdir(parents=True, exist_ok=True)
        log.info("custodian: workspace %s", self.workspace.root)

    def load(self) -> int:
        return self._busy

    def on_roster(self, changed: list[f.PeerState]) -> None:
        pass

    async def close(self) -> None:
        async with self._ordered:  # let a commit in flight land before the process goes
            pass

    def handle(self, ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
        assert self.node is not None
        body = env.body
        match body:
            case f.SandboxCreate() if peer is not None and peer.startswith(b"coordinator."):
                ep.reply(
                    env,
                    peer,
                    f.Error(
                        code=ErrorCode.FORBIDDEN,
                        message="the coordinator never holds a sandbox",
                    ),
                )
            case f.SandboxCreate():
                self.node.answer(ep, peer, env, self._create(body))
            case f.SandboxCommit():
                self.node.answer(ep, peer, env, self._commit(body))
            case f.ToolCall():
                self.node.answer(ep, peer, env, self._tool(body))
            case _:
                ep.reply(
                    env,
                    peer,
                    f.Error(
                        code=ErrorCode.UNEXPECTED,
                        message=f"the custodian does not serve {type(body).__name__}",
                    ),
                )

    def _sandbox_path(self, lane: str) -> Path:
        if not lane or "/" in lane or lane.startswith("."):
            raise RemoteError(ErrorCode.BAD_REQUEST, f"bad lane id {lane!r}")
        return self.sandboxes / lane

    async def _create(self, req: f.SandboxCreate) -> f.Body:
        assert self.workspace is not None
        dest = self._sandbox_path(req.lane)
        async with self._ordered:
            self._busy += 1
            try:
                path, rev = await self.workspace.create_sandbox(req.lane, dest)
            finally:
                self._busy -= 1
        return f.SandboxReady(lane=req.lane, path=path, rev=rev)

    async def _commit(self, req: f.SandboxCommit) -> f.Body:
        assert self.workspace is not None
        sandbox = self._sandbox_path(req.lane)
        async with self._ordered:
            self._busy += 1
            try:
                commit = await self.workspace.commit_sandbox(req.lane, sandbox, req.message)
            finally:
                self._busy -= 1
        return f.CommitDone(lane=req.lane, commit=commit)

    async def _tool(self, call: f.ToolCall) -> f.Body:
        assert self.workspace is not None
        root = self.workspace.root
        params = call.params
        path = params.get("path", "")
        # Filesystem reads run in a worker thread; git reads are coroutines (async subprocesses).
        threaded: dict[str, Callable[[], Any]] = {
            "read_file": lambda: readtools.read_file(
                root, readtools.required_param(params, "path")
            ),
            "list_dir": lambda: readtools.list_dir(root, path),
            "stat": lambda: readtools.stat(root, readtools.required_param(params, "path")),
        }
        awaited: dict[str, Callable[[], Awaitable[Any]]] = {
            # a child process: a catastrophic regex must not freeze this loop (searchproc.py)
            "search": lambda: searchproc.search(
                root,
                path,
                readtools.required_param(params, "pattern"),
                readtools.limit_param(
                    params, readtools.SEARCH_DEFAULT_LIMIT, readtools.SEARCH_MAX_LIMIT
                ),
            ),
            "diff": lambda: readtools.diff(root, path, params.get("rev") or "HEAD"),
            "log": lambda: readtools.log(
                root,
                path,
                params.get("rev") or "HEAD",
                readtools.limit_param(params, readtools.LOG_DEFAULT_LIMIT, readtools.LOG_MAX_LIMIT),
            ),
        }
        if call.tool not in threaded and call.tool not in awaited:
            raise RemoteError(
                ErrorCode.BAD_REQUEST,
                f"unknown read tool {call.tool!r} (known: {', '.join(sorted(threaded | awaited))})",
            )
        async with self._reads:
            try:
                if call.tool in awaited:
                    value = await awaited[call.tool]()
                else:
                    value = await asyncio.to_thread(threaded[call.tool])
            except FileNotFoundError as exc:
                raise RemoteError(ErrorCode.NOT_FOUND, f"{path!r} does not exist") from exc
            except (IsADirectoryError, NotADirectoryError) as exc:
                raise RemoteError(ErrorCode.BAD_REQUEST, f"{path!r}: {exc.strerror}") from exc
        return f.ToolResult(value=value)

"""The tree custodian: the one writer of the workspace and the maker of every sandbox.

Ordered work (creating a sandbox, committing one) runs one at a time through a FIFO lock, because
both read and move the workspace's HEAD. Reads are independent of it. The cheap ones
(`INLINE_TOOLS`: `read_file`, `list_dir`, `stat`, a few syscalls each, `read_file` capped at
8 MiB) are answered on the node's front thread the moment they arrive (`runtime/front.py`), one at a
time, concurrently with everything on the loop; that thread owns the custodian's ROUTER and is
not the loop. The slow ones go to the loop and are started as soon as they arrive, at most
`READ_CONCURRENCY` at once: `search` in a child process with a time budget (Python's `re` holds
the GIL), `diff` and `log` as git subprocesses awaited off the loop. Nothing runs git or the
filesystem on the receive loop (ARCHITECTURE.md §11.1).

The coordinator can never hold a sandbox: a `SandboxCreate` from it is refused with `forbidden`.
Each sandbox it hands out belongs to the uid its lane runs as (`custodian.owners`, `laneuser`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import typing
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, assert_never

from orchestra_sup.cluster.settings import connect
from orchestra_sup.custodian import history, readtools, sandboxes, searchproc
from orchestra_sup.custodian.exports import Exports
from orchestra_sup.custodian.owners import SandboxOwners
from orchestra_sup.custodian.quarantine import land_bundle
from orchestra_sup.custodian.workspace import Workspace, open_workspace
from orchestra_sup.errors import ErrorCode, GitError, OrchestraError, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol import tools
from orchestra_sup.protocol.channel import NO_SANDBOX, Channel
from orchestra_sup.protocol.endpoint import Endpoint
from orchestra_sup.runtime.node import Node
from orchestra_sup.runtime.remote import host_of
from orchestra_sup.state.permissions import PASSAGE, PRIVATE_DIR, private_dir
from orchestra_sup.system.laneuser import decide, lane_needs
from orchestra_sup.system.reserve import DiskReserve

if TYPE_CHECKING:  # aiohttp is imported by a custodian whose tree has hosts, not by every one
    from orchestra_sup.cluster.fences import Fences

log = logging.getLogger(__name__)

READ_CONCURRENCY = 8
"""Slow read tools (`search`, `diff`, `log`) served at once; more wait their turn (a coordinator
cannot fan out unbounded IO)."""

INLINE_TOOLS: dict[str, Callable[[Path, str], Any]] = {
    "read_file": readtools.read_file,
    "list_dir": readtools.list_dir,
    "stat": readtools.stat,
}
"""Read tools answered on the front thread (`protocol.tools.INLINE_TOOLS`): bounded filesystem
work, no subprocess. Each takes the workspace root and the request's path
(`readtools.path_param`; `list_dir`'s may be empty)."""

Serves = (
    f.SandboxCreate
    | f.SandboxCommit
    | f.SandboxLand
    | f.SandboxFetch
    | f.SandboxFetchPart
    | f.SandboxDone
    | f.ToolCall
    | f.Quiesce
    | f.Resume
)
"""What the custodian's `handle` takes: sandbox requests from shards and hosts' mirrors, the
coordinator's read tools, and a rollover's quiet point from the supervisor."""
SERVES = Channel[Serves](Serves, "the custodian does not serve {}")


class Custodian:
    """The `custodian` role. See the module docstring."""

    serves = SERVES
    from_hosts: tuple[type, ...] = (f.SandboxFetch, f.SandboxFetchPart, f.SandboxLand, f.ToolCall)
    """A host's mirror's fetches and landings, and its lanes' reads: never a sandbox here."""

    def __init__(self) -> None:
        self.node: Node | None = None
        self.workspace: Workspace | None = None
        self.sandboxes: Path = Path()
        self.owners = SandboxOwners(Path(), own_uids=False)
        self._ordered = asyncio.Lock()
        self._reads = asyncio.Semaphore(READ_CONCURRENCY)
        self._exporting = asyncio.Lock()
        """One host's fetch at a time (`_fetch`): its own queue, not the writes'."""
        self.exports: Exports | None = None
        """The bundles hosts' mirrors are reading in parts."""
        self._busy = 0
        self._held = False
        """A rollover's quiet point holds the ordered lock: writes queue behind it."""
        self._stack = contextlib.AsyncExitStack()
        self.fences: Fences | None = None
        """The lanes' fences, in a tree hosts join (`ChildArgs.fences`): a host's commit lands
        only while its attempt owns its lane."""

    async def open(self, node: Node) -> None:
        self.node = node
        if node.args.fences.etcd:
            from orchestra_sup.cluster.fences import Fences  # aiohttp: only with hosts

            etcd = await self._stack.enter_async_context(connect(node.args.fences))
            self.fences = Fences(etcd, node.args.fences.prefix)
        self.workspace = await open_workspace(node.paths.workspace, node.paths.state_dir)
        self.exports = Exports(node.paths.state_dir / "exports")
        await asyncio.to_thread(self.exports.open)
        await self.open_sandboxes(node, self.workspace.root)
        node.serve_through(self.serve_inline)
        log.info("custodian: workspace %s", self.workspace.root)

    async def open_sandboxes(self, node: Node, root: Path) -> None:
        """Make the sandboxes' directory, and decide whose uid each sandbox and its lane get,
        for sandboxes cloned from the repository at `root`."""
        self.sandboxes = node.paths.state_dir / "sandboxes"
        isolation = node.args.isolation
        needs = lane_needs(node.paths.state_dir, root)
        decision = await asyncio.to_thread(decide, isolation.lane_user, needs)
        # Lanes of their own uid walk to their sandboxes by name on the host only in mode none
        # (under bubblewrap the path to a sandbox is the tmpfs's): else nobody passes.
        passage = decision.own_uids and isolation.mode == "none"
        mode = PASSAGE if passage else PRIVATE_DIR
        await asyncio.to_thread(private_dir, node.paths.state_dir, mode)
        await asyncio.to_thread(private_dir, self.sandboxes, mode)
        self.owners = SandboxOwners(self.sandboxes, decision.own_uids)
        kept = node.args.retention
        self.reserve = DiskReserve(self.sandboxes, node.args.min_free)
        short = self.reserve.is_short
        node.spawn(sandboxes.run(self.sandboxes, kept.sandboxes_s, kept.every_s, short))
        own = "a uid of its own" if decision.own_uids else "the tree's uid"
        log.info("custodian: each sandbox and its lane get %s (%s)", own, decision.reason)

    def serve_inline(self, env: f.Envelope) -> f.Body | None:
        """On the front thread: the answer to a read in `INLINE_TOOLS`, None for anything else
        (the loop's). Errors are raised typed, as `_tool` raises them (the front maps them to
        the same `Error` frames)."""
        body = env.body
        if not isinstance(body, f.ToolCall) or body.tool not in INLINE_TOOLS:
            return None
        assert self.workspace is not None
        path = readtools.path_param(body.params, required=body.tool != "list_dir")
        with _typed_errors(path):
            return f.ToolResult(value=INLINE_TOOLS[body.tool](self.workspace.root, path))

    def load(self) -> int:
        return self._busy

    def lanes_by_state(self) -> dict[str, int]:
        return {}

    def inbox_depth(self) -> int | None:
        return None

    def outbox_depth(self) -> int:
        return 0  # it sends the coordinator nothing unasked

    def persistence(self) -> None:
        return None  # the workspace is git's, not a write-behind store

    def on_roster(self, changed: list[f.PeerState]) -> None:
        pass

    async def close(self) -> None:
        if not self._held:  # at a quiet point no write is in flight; the queued ones never ran
            async with self._ordered:  # let a commit in flight land before the process goes
                pass
        await self._stack.aclose()

    def handle(self, ep: Endpoint, peer: bytes | None, env: f.Envelope[Serves]) -> None:
        assert self.node is not None
        body = env.body
        match body:
            case f.SandboxCreate() if peer is not None and peer.startswith(b"coordinator."):
                ep.reply(env, peer, NO_SANDBOX)
            case f.SandboxCreate():
                self.node.answer(ep, peer, env, self._create(body))
            case f.SandboxCommit():
                self.node.answer(ep, peer, env, self._commit(body))
            case f.SandboxLand() if peer is not None and peer.startswith(b"coordinator."):
                ep.reply(env, peer, NO_SANDBOX)
            case f.SandboxLand():
                self.node.answer(ep, peer, env, self._land(body, host_of(env.sender)))
            case f.SandboxFetch():
                self.node.answer(ep, peer, env, self._fetch(body))
            case f.SandboxFetchPart():
                self.node.answer(ep, peer, env, self._fetch_part(body))
            case f.SandboxDone() if peer is not None and peer.startswith(b"coordinator."):
                ep.reply(env, peer, NO_SANDBOX)
            case f.SandboxDone():
                self.node.answer(ep, peer, env, self._done(body))
            case f.ToolCall():
                self.node.answer(ep, peer, env, self._tool(body))
            case f.Quiesce():
                self.node.answer(ep, peer, env, self._quiesce(body.timeout_s))
            case f.Resume():
                if self._held:
                    self._held = False
                    self._ordered.release()
                ep.reply(env, peer, f.Ack())
            case _:
                assert_never(body)

    async def _quiesce(self, timeout_s: float) -> f.Body:
        """The single-writer hand-off's quiet point (ARCHITECTURE.md §9): take the ordered lock,
        so the write in flight (if any) lands first and every later one waits, never to run in
        this generation: stopped, its requester sees `peer_down` and asks the next generation.
        Reads go on. Answers `Quiesced`; raises `RemoteError(timeout)` when the write in flight
        has not landed within `timeout_s` seconds (nothing is then held)."""
        if not self._held:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._ordered.acquire()
            except TimeoutError:
                raise RemoteError(
                    ErrorCode.TIMEOUT, f"a workspace write still in flight after {timeout_s:g} s"
                ) from None
            self._held = True
        return f.Quiesced(held="workspace writes held; reads go on")

    @contextlib.asynccontextmanager
    async def _writing(self) -> AsyncIterator[None]:
        """One workspace write (a sandbox made, a commit): in order, behind the ordered lock a
        quiet point holds, and counted in `load` while it runs."""
        async with self._ordered:
            self._busy += 1
            try:
                yield
            finally:
                self._busy -= 1

    def _sandbox_path(self, lane: str) -> Path:
        if not lane or "/" in lane or "\0" in lane or lane.startswith(".") or len(lane) > 200:
            raise RemoteError(ErrorCode.BAD_REQUEST, f"bad lane id {lane!r}")
        return self.sandboxes / lane

    async def _create(self, req: f.SandboxCreate) -> f.Body:
        """Lane `req.lane`'s sandbox, at the workspace's head or at `req.rev` (resolved in
        order with the commits, so `HEAD~3` means the head as it is now). Answers
        `SandboxReady` with the full sha it was made at; raises `RemoteError` for a bad lane
        id, or a rev that is not one revision (`bad_request`) or names no commit
        (`not_found`), what `Workspace.create_sandbox` says, and `state_degraded` when the
        clone failed for want of space (the disk is short of `[state] min_free`, or git said
        so): the shard asks again once there is room."""
        assert self.workspace is not None
        dest = self._sandbox_path(req.lane)
        async with self._writing():
            try:
                path, rev = await self.workspace.create_sandbox(req.lane, dest, req.rev)
            except (GitError, OSError) as exc:
                space = await asyncio.to_thread(self.reserve.space)
                if not space.short and "No space left on device" not in str(exc):
                    raise
                raise RemoteError(  # the tree's want, not the lane's: its shard waits
                    ErrorCode.STATE_DEGRADED,
                    f"no room for lane {req.lane}'s sandbox: {space.text()} at {self.sandboxes}",
                ) from exc
            await asyncio.to_thread(self.owners.claim, Path(path))
        return f.SandboxReady(lane=req.lane, path=path, rev=rev)

    async def _done(self, req: f.SandboxDone) -> f.Body:
        """Lane `req.lane` ended: its sandbox is removed `[retention] sandboxes_s` from now
        (`custodian.sandboxes`). Raises `RemoteError(bad_request)` for a bad lane id."""
        self._sandbox_path(req.lane)  # checks the id
        await asyncio.to_thread(sandboxes.mark_ended, self.sandboxes, req.lane)
        return f.Ack()

    async def _commit(self, req: f.SandboxCommit) -> f.Body:
        assert self.workspace is not None
        sandbox = self._sandbox_path(req.lane)
        async with self._writing():
            commit = await self.workspace.commit_sandbox(req.lane, sandbox, req.message)
        return f.CommitDone(lane=req.lane, commit=commit)

    async def _land(self, req: f.SandboxLand, host: str = "") -> f.Body:
        """A host's lane's commit, from its bundle (`quarantine.land_bundle`), in order with
        every other write; from `host`'s mirror, only while the lane's attempt owns it
        (`_check_fence`). Raises `BundleRefused` when the bundle is refused (answered
        `bad_request`), `CommitConflict` when its change conflicts."""
        assert self.workspace is not None
        async with self._writing():
            if host:
                await self._check_fence(req, host)
            commit = await land_bundle(self.workspace, req.lane, req.bundle, req.base)
        return f.CommitDone(lane=req.lane, commit=commit)

    async def _check_fence(self, req: f.SandboxLand, host: str) -> None:
        """Raises `RemoteError(fenced)`, counted, unless etcd holds lane `req.lane`'s key for
        `host` at token `req.fence` now (`Fences.holds`; ADR 0021), and `RemoteError(peer_down)`
        when etcd cannot say: a commit no one can vouch for does not land."""
        assert self.node is not None
        if self.fences is None:
            raise RemoteError(ErrorCode.FORBIDDEN, "this tree keeps no fences: no host may land")
        try:
            held = await self.fences.holds(req.lane, host, req.fence)
        except OrchestraError as exc:
            raise RemoteError(ErrorCode.PEER_DOWN, f"lane {req.lane}'s fence: {exc}") from None
        if not held:
            self.node.fenced += 1
            log.warning("custodian: lane %s's commit from %s refused: fenced", req.lane, host)
            raise RemoteError(
                ErrorCode.FENCED, f"lane {req.lane}'s attempt with fence {req.fence} was fenced"
            )

    async def _fetch(self, req: f.SandboxFetch) -> f.Body:
        """A host's mirror's fetch (`custodian.mirror.export`): the commit `req.rev` names now,
        as a bundle of what the mirror lacks, or its first part (`custodian.exports`).
        Fetches wait in a queue of their own, one at a time, beside the writes: hosts' first
        fetches of a large history (or a host asking and asking) make one bundle at once and
        never delay a sandbox or a commit of the root's own lanes. A commit a lane landed
        before its result is in `HEAD` for every fetch its dependants' sandboxes make, which
        come after. Raises
        `RemoteError(bad_request)` for more than `HAVE_MAX` commits in `have`, and what
        `export` raises."""
        assert self.workspace is not None
        if len(req.have) > f.HAVE_MAX:
            raise RemoteError(
                ErrorCode.BAD_REQUEST, f"{len(req.have)} commits in have: at most {f.HAVE_MAX}"
            )
        assert self.exports is not None
        async with self._exporting:
            return await self.exports.make(self.workspace.root, req.rev, req.have)

    async def _fetch_part(self, req: f.SandboxFetchPart) -> f.Body:
        """The next part of a bundle `_fetch` answered in parts; raises what
        `Exports.part` raises."""
        assert self.exports is not None
        return await self.exports.part(req)

    async def _tool(self, call: f.ToolCall) -> f.Body:
        """A read tool not answered on the front thread: `search`, `diff`, `log`, and any
        from a host's lane (its mirror's frames come through the hosts' port, on the loop: an
        `INLINE_TOOLS` one then runs in a thread). Raises `RemoteError(bad_request)` for a bad
        path or parameter, or a tool that is not a read tool, and what `_typed_errors` says of
        the path."""
        assert self.workspace is not None
        if call.tool in INLINE_TOOLS:
            path = readtools.path_param(call.params, required=call.tool != "list_dir")
            with _typed_errors(path):
                inline = INLINE_TOOLS[call.tool]
                value = await asyncio.to_thread(inline, self.workspace.root, path)
            return f.ToolResult(value=value)
        path = readtools.path_param(call.params)
        spec = tools.TOOLS.get(call.tool)
        if spec is None or spec.answered_by != "custodian" or spec.inline:
            known = ", ".join(sorted(tools.READ_TOOLS))
            raise RemoteError(
                ErrorCode.BAD_REQUEST, f"unknown read tool {call.tool!r} (known: {known})"
            )
        read = typing.cast(tools.AwaitedRead, spec.parse(call.params))
        async with self._reads:
            with _typed_errors(path):
                value = await self._read(read, path, call.params)
        return f.ToolResult(value=value)

    async def _read(self, read: tools.AwaitedRead, path: str, params: dict[str, str]) -> Any:
        """The value of read tool `read` at `path` (`params` as the request had them)."""
        assert self.workspace is not None
        root = self.workspace.root
        match read:
            case tools.Search():  # a child process: a catastrophic regex must not freeze this loop
                return await searchproc.search(
                    root,
                    path,
                    readtools.required_param(params, "pattern"),
                    readtools.limit_param(
                        params, readtools.SEARCH_DEFAULT_LIMIT, readtools.SEARCH_MAX_LIMIT
                    ),
                )
            case tools.Diff(rev=rev):
                return await history.diff(root, path, rev or "HEAD")
            case tools.Log(rev=rev):
                limit = readtools.limit_param(
                    params, history.LOG_DEFAULT_LIMIT, history.LOG_MAX_LIMIT
                )
                return await history.log(root, path, rev or "HEAD", limit)
            case _:
                assert_never(read)


@contextlib.contextmanager
def _typed_errors(path: str) -> Iterator[None]:
    """Raise a missing path as `not_found`, and as `bad_request` a file/directory mix-up, a
    symlink loop (ELOOP), a name too long for the file system (ENAMETOOLONG) or a file that is
    not a regular one (EINVAL from `read_file`): what the path names, never a fault of the
    custodian's (`internal`), and said without the workspace's own path."""
    try:
        yield
    except FileNotFoundError as exc:
        raise RemoteError(ErrorCode.NOT_FOUND, f"{path!r} does not exist") from exc
    except (IsADirectoryError, NotADirectoryError) as exc:
        raise RemoteError(ErrorCode.BAD_REQUEST, f"{path!r}: {exc.strerror}") from exc
    except OSError as exc:
        if exc.errno not in _PATH_ERRNOS:
            raise
        raise RemoteError(ErrorCode.BAD_REQUEST, f"{path!r}: {exc.strerror}") from exc


_PATH_ERRNOS = frozenset({errno.ELOOP, errno.ENAMETOOLONG, errno.EINVAL})
"""OSError numbers that say what a read tool's path names, answered `bad_request`."""

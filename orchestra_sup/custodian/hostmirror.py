"""A host's mirror: the custodian of a host's sandboxes, fed from the root's custodian by git's
own bundles (ADR 0021, step 5; issue 21: "a remote host never sees the custodian's files").

A host's agent runs it as its child `mirror` (role "mirror"), and the host's shards ask it for
their sandboxes as a root's shards ask the custodian (`ChildArgs.sandboxes`). It keeps a
mirror of the workspace's history in its state directory (`custodian.mirror.Mirror`) and is
the one writer of it:

- `SandboxCreate(lane, rev)`: it asks the root's custodian for the commit `rev` names now
  (`SandboxFetch`, saying which commits it already holds), takes the bundle of what it lacked
  (streamed into a private file part by part when it is larger than a part,
  `custodian.exports`; fetched again when the custodian no longer keeps it), and clones the
  lane's sandbox from the mirror at that commit, owned as a root's sandbox is
  (`custodian.owners`).
- `SandboxCommit(lane, message)`: it makes the lane's commit in the mirror with the very checks
  the custodian makes of a sandbox (`Workspace.make_commit`: only the working tree is read, no
  `.git` path, no new gitlink, the lane's trailer), and sends it to the root's custodian as a
  bundle of that one commit on its base (`SandboxLand`, with the lane's fencing token), which
  checks it again and lands it while the lane's attempt still owns it (`cluster.fences`).
  The answer is the custodian's `CommitDone`. The mirror lands nothing itself.
- A read tool (`ToolCall`) is the root custodian's to answer: it is passed on.

Each request to the root's custodian is asked again while it is down or restarting
(`_upstream`), so a custodian SIGKILLed and restarted on the root fails no host's lane.

Everything else (the one serial queue of writes, the quiet point of a rollover) is the
custodian's, whose role this one extends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from pathlib import Path

from orchestra_sup.custodian.mirror import Mirror
from orchestra_sup.custodian.quarantine import MAX_BUNDLE_BYTES
from orchestra_sup.custodian.role import Custodian
from orchestra_sup.errors import ErrorCode, OrchestraError, PeerDown, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.runtime.node import Node

log = logging.getLogger(__name__)

UPSTREAM = "custodian"
"""The root's custodian, as the host's roster names it."""
UPSTREAM_TIMEOUT_S = 120.0
"""Seconds a fetch or a landing waits for the root's custodian (a bundle may be large)."""
UPSTREAM_WAIT_S = 45.0
"""Seconds a request waits, asked again, while the root's custodian is down or restarting, as
a root's shard waits for its custodian; less than the shard's own call to the mirror waits
(`shards.role.CALL_TIMEOUT_S`), so the shard hears why."""
FETCH_ATTEMPTS = 3
"""Fetches of one sandbox's commit, at most, while the custodian drops the bundle it was
sending in parts (it restarted, or kept it too long unread)."""
RETRY_S = 0.2
"""Seconds between two tries while the host's roster still names the custodian's previous
generation (the root's next `RootPeers` brings the new one, within a second)."""


class _ExportGone(OrchestraError):
    """The custodian no longer keeps the bundle a fetch was reading in parts."""


class HostMirror(Custodian):
    """The `mirror` role. See the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.mirror: Mirror | None = None
        self._upstream_up = asyncio.Event()
        """Set while the host's roster says the root's custodian is up."""

    async def open(self, node: Node) -> None:
        self.node = node
        self.mirror = Mirror(node.paths.state_dir / "mirror")
        await self.mirror.open()
        self.workspace = self.mirror.workspace()
        await self.open_sandboxes(node, self.mirror.root)
        log.info("mirror: the workspace's history kept at %s", self.mirror.root)

    def on_roster(self, changed: list[f.PeerState]) -> None:
        assert self.node is not None
        (self._upstream_up.set if self.node.peer_up(UPSTREAM) else self._upstream_up.clear)()

    async def _upstream(self, body: f.Body) -> f.Body:
        """The root's custodian's answer to `body`. While it is down (`PeerDown`: not
        delivered, or lost with it) or restarting (`stale_generation`: sent to the generation
        before), `body` is asked again, for up to `UPSTREAM_WAIT_S` seconds: each request is
        safe to repeat (a fetch and a read change nothing, and a landing of a lane that landed
        is answered with its commit, `quarantine.land_bundle`). Raises the last error then,
        and any other `RemoteError` at once."""
        assert self.node is not None
        deadline = time.monotonic() + UPSTREAM_WAIT_S
        while True:
            try:
                return await self.node.call(UPSTREAM, body, timeout_s=UPSTREAM_TIMEOUT_S)
            except (PeerDown, RemoteError) as exc:
                restarting = isinstance(exc, RemoteError) and exc.code is ErrorCode.STALE_GENERATION
                if not (restarting or isinstance(exc, PeerDown)):
                    raise
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
                if restarting or self.node.peer_up(UPSTREAM):
                    await asyncio.sleep(min(RETRY_S, remaining))
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await self._upstream_up.wait()

    async def _create(self, req: f.SandboxCreate) -> f.Body:
        """The lane's sandbox, from the mirror, at the commit `req.rev` names on the root now
        (its head for None). Raises what the root's custodian answers (`not_found` for a rev
        that names no commit), `PeerDown` while it is down (the shard waits and asks again)."""
        assert self.mirror is not None and self.workspace is not None
        dest = self._sandbox_path(req.lane)
        async with self._writing():
            sha = await self._take(req.rev)
            path, rev = await self.workspace.create_sandbox(req.lane, dest, sha)
            await asyncio.to_thread(self.owners.claim, Path(path))
        return f.SandboxReady(lane=req.lane, path=path, rev=rev)

    async def _take(self, rev: str | None) -> str:
        """Fetch the commit `rev` names on the root and take it into the mirror; its sha.
        Raises what the root's custodian answers, and `BundleRefused` for a bundle the mirror
        cannot take."""
        assert self.mirror is not None
        for attempt in range(1, FETCH_ATTEMPTS + 1):
            with tempfile.TemporaryDirectory(dir=self.mirror.root.parent) as private:
                path = Path(private) / "take.bundle"
                try:
                    fetched = await self._receive(
                        f.SandboxFetch(rev=rev, have=await self.mirror.heads()), path
                    )
                except _ExportGone as exc:
                    if attempt == FETCH_ATTEMPTS:
                        raise RemoteError(ErrorCode.BUSY, str(exc)) from None
                    log.warning("mirror: %s (attempt %d of %d)", exc, attempt, FETCH_ATTEMPTS)
                    continue
                await self.mirror.take(fetched.rev, path if fetched.bundle else None)
                return fetched.rev
        raise AssertionError("unreachable: the last attempt raises")

    async def _receive(self, fetch: f.SandboxFetch, path: Path) -> f.SandboxBundle:
        """The answer to `fetch`, its bundle written at `path` (created 0600), every part of
        it asked for in turn. Raises `RemoteError` as `_upstream` does,
        `RemoteError(bad_request)` for parts that do not follow one another, and `_ExportGone`
        when the custodian no longer keeps the rest."""
        fetched = await self._upstream(fetch)
        assert isinstance(fetched, f.SandboxBundle)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            part, got = fetched, 0
            while True:
                if part.offset != got or part.rev != fetched.rev:
                    raise RemoteError(ErrorCode.BAD_REQUEST, "a bundle's parts out of order")
                await asyncio.to_thread(out.write, part.bundle)
                got += len(part.bundle)
                if got >= fetched.size or not part.bundle:
                    return fetched
                ask = f.SandboxFetchPart(export=fetched.export, offset=got)
                try:
                    part = await self._upstream(ask)
                except RemoteError as exc:
                    if exc.code is ErrorCode.NOT_FOUND:
                        raise _ExportGone(exc.message) from None
                    raise
                assert isinstance(part, f.SandboxBundle)

    async def _commit(self, req: f.SandboxCommit) -> f.Body:
        """The lane's change, committed in the mirror and landed by the root's custodian
        (module docstring). Raises what `make_commit` raises, `RemoteError(bad_request)` for a
        commit whose bundle is over `MAX_BUNDLE_BYTES`, and what the custodian answers
        (`bad_request` for a refused bundle, `conflict`)."""
        assert self.mirror is not None and self.workspace is not None
        sandbox = self._sandbox_path(req.lane)
        async with self._writing():
            made = await self.workspace.make_commit(req.lane, sandbox, req.message)
            if made is None:
                return f.CommitDone(lane=req.lane, commit=None)
            base, commit = made
            bundle = await self.mirror.bundle_commit(req.lane, base, commit)
        if len(bundle) > MAX_BUNDLE_BYTES:  # one frame takes it to the root, or nothing does
            raise RemoteError(
                ErrorCode.BAD_REQUEST,
                f"lane {req.lane}'s commit bundles to {len(bundle):,} bytes, over the "
                f"{MAX_BUNDLE_BYTES:,} a host's commit may be (one frame): nothing landed",
            )
        land = f.SandboxLand(lane=req.lane, base=base, bundle=bundle, fence=req.fence)
        return await self._upstream(land)

    async def _land(self, req: f.SandboxLand, host: str = "") -> f.Body:
        raise RemoteError(ErrorCode.FORBIDDEN, "a host's mirror lands nothing: its root does")

    async def _fetch(self, req: f.SandboxFetch) -> f.Body:
        raise RemoteError(ErrorCode.FORBIDDEN, "a host's mirror feeds no other mirror")

    async def _fetch_part(self, req: f.SandboxFetchPart) -> f.Body:
        raise RemoteError(ErrorCode.FORBIDDEN, "a host's mirror feeds no other mirror")

    async def _tool(self, call: f.ToolCall) -> f.Body:
        return await self._upstream(call)

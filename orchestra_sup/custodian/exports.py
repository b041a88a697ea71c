"""The bundles a custodian makes for hosts' mirrors, kept while they are read part by part
(issue 21: a host's mirror fed by git's own bundles, whatever the size of the workspace).

A mirror's first fetch of a real workspace is its whole history, often more than one frame
holds (`codec.MAX_FRAME_BYTES`, 16 MiB). `Exports.make` has `mirror.export` write the bundle
into the custodian's own directory for them, and answers its first `part_bytes` with its
`size` and a name (`SandboxBundle.export`); the mirror asks for each next part
(`SandboxFetchPart`), streaming them into a file it then takes. A bundle of one part is
answered whole and not kept.

What is kept stays bounded: an export goes once its last part was read, when no part of it was
asked for `KEEP_S` seconds, or when it would be the `MAX_KEPT + 1`-th (the one least recently
read goes). The directory is emptied when the custodian opens it, since a restarted custodian
serves none of its predecessor's. A mirror asking for a part of an export that went is
answered `not_found` and fetches again (`custodian.hostmirror`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from orchestra_sup.custodian.mirror import export
from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.state.permissions import private_dir

log = logging.getLogger(__name__)

PART_BYTES = 8 * 1024 * 1024
"""Bytes of a bundle per `SandboxBundle` (8 MiB: half a frame, whatever its envelope)."""
KEEP_S = 120.0
"""Seconds an export no part was asked of is kept."""
MAX_KEPT = 8
"""Exports kept at once, at most: one per host fetching, and some."""


@dataclass
class _Kept:
    rev: str
    path: Path
    size: int
    used: float
    """When a part of it was last asked for (monotonic seconds)."""


class Exports:
    """The exports under `directory` (made private and emptied by `open`), each answered in
    parts of `part_bytes` bytes (default `PART_BYTES`)."""

    def __init__(self, directory: Path, part_bytes: int = PART_BYTES) -> None:
        self.directory = directory
        self.part_bytes = part_bytes
        self._kept: dict[str, _Kept] = {}

    def open(self) -> None:
        """Make the directory, private, with nothing left in it. Raises `OSError` when it
        cannot be."""
        shutil.rmtree(self.directory, ignore_errors=True)
        private_dir(self.directory)

    async def make(self, root: Path, rev: str | None, have: list[str]) -> f.SandboxBundle:
        """The commit `rev` names in the repository at `root` as `mirror.export` bundles it for
        a mirror that has `have`: the whole bundle, or its first part, the rest kept. Raises
        what `export` raises."""
        self._sweep()
        name = secrets.token_hex(8)
        path = self.directory / f"{name}.bundle"
        try:
            sha, size = await export(root, rev, have, path)
            if size <= self.part_bytes:
                data = await asyncio.to_thread(path.read_bytes) if size else b""
                path.unlink(missing_ok=True)
                return f.SandboxBundle(rev=sha, bundle=data)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        while len(self._kept) >= MAX_KEPT:
            oldest = min(self._kept, key=lambda k: self._kept[k].used)
            log.warning("custodian: export %s of a mirror dropped unread (too many)", oldest)
            self._drop(oldest)
        self._kept[name] = _Kept(rev=sha, path=path, size=size, used=time.monotonic())
        log.info("custodian: a %s-byte bundle of %s for a mirror, in parts", f"{size:,}", sha[:12])
        return await self.part(f.SandboxFetchPart(export=name, offset=0))

    async def part(self, req: f.SandboxFetchPart) -> f.SandboxBundle:
        """The part of export `req.export` at `req.offset`; once it is the last, the export
        goes. Raises `RemoteError`: `not_found` for an export not kept (any more),
        `bad_request` for an offset outside it."""
        self._sweep()
        kept = self._kept.get(req.export)
        if kept is None:
            raise RemoteError(
                ErrorCode.NOT_FOUND, f"no export {req.export[:32]!r} kept: fetch it again"
            )
        if not 0 <= req.offset < kept.size:
            raise RemoteError(
                ErrorCode.BAD_REQUEST,
                f"offset {req.offset} is outside export {req.export}'s {kept.size:,} bytes",
            )
        kept.used = time.monotonic()
        data = await asyncio.to_thread(_read, kept.path, req.offset, self.part_bytes)
        if req.offset + len(data) >= kept.size:
            self._drop(req.export)
        return f.SandboxBundle(
            rev=kept.rev, bundle=data, size=kept.size, offset=req.offset, export=req.export
        )

    def kept(self) -> int:
        """Exports kept now."""
        return len(self._kept)

    def _sweep(self) -> None:
        now = time.monotonic()
        for name in [k for k, v in self._kept.items() if now - v.used > KEEP_S]:
            self._drop(name)

    def _drop(self, name: str) -> None:
        kept = self._kept.pop(name, None)  # a last part asked twice at once drops it once
        if kept is not None:
            kept.path.unlink(missing_ok=True)


def _read(path: Path, offset: int, length: int) -> bytes:
    with open(path, "rb") as source:
        source.seek(offset)
        return source.read(length)

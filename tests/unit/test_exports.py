"""The custodian's bundles for hosts' mirrors, in parts (`custodian.exports`), against real git:
a bundle larger than a part is read part by part into a bundle the mirror takes, and what is
kept stays bounded (read to its end, left unread, too many, a restart)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from orchestra_sup.custodian import exports
from orchestra_sup.custodian.exports import Exports
from orchestra_sup.custodian.mirror import Mirror
from orchestra_sup.custodian.workspace import Workspace, open_workspace
from orchestra_sup.errors import RemoteError
from orchestra_sup.protocol import frames as f
from tests.unit.test_workspace import git, make_repo

PART = 4096


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    repo = make_repo(tmp_path / "repo", {"a.txt": "one\n"})
    (repo / "noise.bin").write_bytes(os.urandom(5 * PART))  # does not compress: 6 parts or so
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "noise")
    return asyncio.run(open_workspace(repo, tmp_path / "state"))


def made(tmp_path: Path) -> Exports:
    kept = Exports(tmp_path / "exports", part_bytes=PART)
    kept.open()
    return kept


def read_all(kept: Exports, ws: Workspace, dest: Path) -> f.SandboxBundle:
    """Fetch HEAD for an empty mirror, every part into `dest`; the first answer."""

    async def go() -> f.SandboxBundle:
        first = await kept.make(ws.root, None, [])
        part, chunks = first, [first.bundle]
        while part.offset + len(part.bundle) < first.size:
            part = await kept.part(
                f.SandboxFetchPart(export=first.export, offset=part.offset + len(part.bundle))
            )
            chunks.append(part.bundle)
        dest.write_bytes(b"".join(chunks))
        return first

    return asyncio.run(go())


def test_a_bundle_larger_than_a_part_comes_in_parts_the_mirror_takes(
    ws: Workspace, tmp_path: Path
) -> None:
    kept = made(tmp_path)
    dest = tmp_path / "took.bundle"
    first = read_all(kept, ws, dest)
    assert first.size > 4 * PART and len(first.bundle) == PART and first.export
    assert dest.stat().st_size == first.size
    assert kept.kept() == 0 and list((tmp_path / "exports").iterdir()) == []  # read: gone
    mirror = Mirror(tmp_path / "host" / "mirror")
    asyncio.run(mirror.open())
    asyncio.run(mirror.take(first.rev, dest))
    assert asyncio.run(mirror.heads()) == [asyncio.run(ws.head())]
    with pytest.raises(RemoteError, match="no export") as gone:
        asyncio.run(kept.part(f.SandboxFetchPart(export=first.export, offset=PART)))
    assert gone.value.code == "not_found"


def test_a_small_bundle_is_answered_whole_and_not_kept(ws: Workspace, tmp_path: Path) -> None:
    kept = Exports(tmp_path / "exports")  # 8 MiB parts
    kept.open()
    whole = asyncio.run(kept.make(ws.root, None, []))
    assert whole.size == 0 and whole.export == "" and whole.bundle.startswith(b"# v2 git bundle")
    assert kept.kept() == 0 and list((tmp_path / "exports").iterdir()) == []
    nothing = asyncio.run(kept.make(ws.root, None, [whole.rev]))
    assert nothing.bundle == b"" and nothing.rev == whole.rev


def test_what_is_kept_stays_bounded(
    ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An offset outside is refused; more than `MAX_KEPT` unread drops the least recently
    read; one left unread past `KEEP_S` goes; `open` empties what a predecessor left."""
    kept = made(tmp_path)
    first = asyncio.run(kept.make(ws.root, None, []))
    with pytest.raises(RemoteError, match="outside export") as outside:
        asyncio.run(kept.part(f.SandboxFetchPart(export=first.export, offset=first.size)))
    assert outside.value.code == "bad_request"
    monkeypatch.setattr(exports, "MAX_KEPT", 3)
    names = [asyncio.run(kept.make(ws.root, None, [])).export for _ in range(3)]
    assert kept.kept() == 3 and first.export not in {*names}
    with pytest.raises(RemoteError, match="no export"):
        asyncio.run(kept.part(f.SandboxFetchPart(export=first.export, offset=PART)))
    assert len(list((tmp_path / "exports").iterdir())) == 3
    monkeypatch.setattr(exports, "KEEP_S", -1.0)  # every one is now older than that
    with pytest.raises(RemoteError, match="no export"):
        asyncio.run(kept.part(f.SandboxFetchPart(export=names[-1], offset=PART)))
    assert kept.kept() == 0 and list((tmp_path / "exports").iterdir()) == []

    monkeypatch.setattr(exports, "KEEP_S", 120.0)
    asyncio.run(kept.make(ws.root, None, []))
    assert len(list((tmp_path / "exports").iterdir())) == 1
    made(tmp_path)  # the custodian restarted
    assert list((tmp_path / "exports").iterdir()) == []
    assert oct((tmp_path / "exports").stat().st_mode & 0o777) == "0o700"

"""`SandboxLand` to a real tree's custodian (issue 21, ADR 0021 step 5): a host's lane's
commit, as the bytes of a git bundle, lands in the workspace through the custodian's serial
queue; a hostile bundle is answered with one refusal and changes nothing."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.version import PROTOCOL_VERSION
from tests.integration.harness import Tree
from tests.unit.test_quarantine import blob, literal_commit
from tests.unit.test_workspace import git

pytestmark = pytest.mark.integration

LANE = "l-host-1"


def ask_custodian(tree: Tree, body: f.Body, as_peer: str = "shard-0.1") -> f.Body:
    """`body` to the custodian's ipc socket with routing id `as_peer`; its answer."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.setsockopt(zmq.IDENTITY, as_peer.encode())
    try:
        sock.connect(f"ipc://{tree.run_dir / 'custodian.ipc'}")
        env = f.Envelope(
            v=PROTOCOL_VERSION, id="t.1", corr=None, sender=as_peer.split(".")[0], gen=1,
            ttl_s=30.0, dest_gen=None, body=body,
        )  # fmt: skip
        sock.send(Codec().encode(env))
        assert sock.poll(30_000), "the custodian did not answer"
        return Codec().decode(sock.recv()).body
    finally:
        sock.close(linger=0)
        ctx.term()


def test_a_bundle_lands_through_the_custodian_and_a_hostile_one_does_not(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    tree = tree_factory(workspace=repo, shards=1)
    base = git(repo, "rev-parse", "HEAD")
    host = tmp_path / "host"
    subprocess.run(["git", "clone", "-q", str(repo), str(host)], check=True)
    one = blob(host, b"one\n")
    hostile = literal_commit(host, base, b"100644 x\0" + one + b"100644 x\0" + one)
    git(host, "update-ref", "refs/heads/lane", hostile)
    git(host, "bundle", "create", str(tmp_path / "bad.bundle"), "refs/heads/lane", "--not", base)
    bad = (tmp_path / "bad.bundle").read_bytes()
    answer = ask_custodian(tree, f.SandboxLand(lane=LANE, base=base, bundle=bad))
    assert isinstance(answer, f.Error) and "refused by git's fsck" in answer.message, answer
    assert git(repo, "rev-parse", "HEAD") == base
    assert git(repo, "for-each-ref", "refs/quarantine/") == ""

    (host / "from-host.txt").write_text("made on host-a\n")
    git(host, "add", "from-host.txt")
    git(host, "commit", "-q", "-m", f"host work\n\nOrchestra-Lane: {LANE}")
    git(host, "bundle", "create", str(tmp_path / "ok.bundle"), "HEAD", "--not", base)
    good = f.SandboxLand(lane=LANE, base=base, bundle=(tmp_path / "ok.bundle").read_bytes())
    refused = ask_custodian(tree, good, as_peer="coordinator.1")
    assert isinstance(refused, f.Error) and refused.code == "forbidden", refused
    done = ask_custodian(tree, good)
    assert isinstance(done, f.CommitDone), done
    assert done.commit == git(repo, "rev-parse", "HEAD") == git(host, "rev-parse", "HEAD")
    assert (repo / "from-host.txt").read_text() == "made on host-a\n"

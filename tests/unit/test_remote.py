"""`runtime.remote`: the names, routing ids and keys of a node's links to other machines, and who
may speak on the root's hosts' ports (ADR 0021, step 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestra_sup.errors import ConfigError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.endpoint import KeyIdentity, PeerCredentials
from orchestra_sup.protocol.keys import init_keys, load_client_keys, load_server_keys
from orchestra_sup.protocol.version import PROTOCOL_VERSION
from orchestra_sup.runtime.remote import (
    RemoteLinks,
    admitted_from_host,
    host_of,
    is_remote,
    local_name,
)


def envelope(sender: str) -> f.Envelope:
    return f.Envelope(
        v=PROTOCOL_VERSION, id="x.1", corr=None, sender=sender, gen=1, ttl_s=None,
        dest_gen=None, body=f.Ack(),
    )  # fmt: skip


def test_names_and_routing_ids_on_each_side() -> None:
    root = RemoteLinks("/k", "")
    assert root.sender("coordinator") == "coordinator"
    assert root.identity("coordinator", 3, "host-a/shard-0") == b"coordinator.3>shard-0"
    host = RemoteLinks("/k", "host-a")
    assert host.sender("shard-0") == "host-a/shard-0"
    assert host.identity("shard-0", 2, "coordinator") == b"host-a/shard-0.2"
    assert (host_of("host-a/shard-0"), local_name("host-a/shard-0")) == ("host-a", "shard-0")
    assert (host_of("shard-0"), local_name("shard-0")) == ("", "shard-0")
    assert is_remote("tcp://10.0.0.3:7460") and not is_remote("ipc:///run/x/shard-0.ipc")


def test_each_side_links_with_the_keys_the_other_already_has(tmp_path: Path) -> None:
    init_keys(tmp_path, ["host-a"], host=True)
    init_keys(tmp_path, ["operator"])
    server, host_a = load_server_keys(tmp_path), load_client_keys(tmp_path, "host-a")
    to_host = RemoteLinks(str(tmp_path), "").keys("host-a/shard-0")
    assert (to_host.client, to_host.server_public) == (server.server, host_a.client.public)
    to_root = RemoteLinks(str(tmp_path), "host-a").keys("coordinator")
    assert (to_root.client, to_root.server_public) == (host_a.client, server.server.public)
    with pytest.raises(ConfigError, match=r"operator\.public is not a host's key"):
        RemoteLinks(str(tmp_path), "").keys("operator/shard-0")
    with pytest.raises(ConfigError, match=r"no key file .*host-b\.public"):
        RemoteLinks(str(tmp_path), "").keys("host-b/shard-0")
    with pytest.raises(ConfigError, match="this process has no keys"):
        RemoteLinks(None, "").keys("host-a/shard-0")


@pytest.mark.parametrize(
    ("caller", "peer", "sender", "refused"),
    [
        (KeyIdentity("host-a"), b"host-a/shard-0.1", "host-a/shard-0", None),
        (KeyIdentity("host-a"), b"shard-0.1", "shard-0", "not as 'shard-0'"),
        (KeyIdentity("host-a"), b"host-b/shard-0.1", "host-b/shard-0", "not as 'host-b/shard-0'"),
        (KeyIdentity("host-a"), b"coordinator.1", "host-a/shard-0", "its own processes only"),
        (KeyIdentity("host-a"), b"host-a/shard-0.1", "host-ab/shard-0", "its own processes"),
        (KeyIdentity("host-a"), None, "host-a/shard-0", "its own processes only"),
        (None, b"host-a/shard-0.1", "host-a/shard-0", "hosts' keys only"),
        (PeerCredentials(0, 0, 1), b"host-a/shard-0.1", "host-a/shard-0", "hosts' keys only"),
    ],
)
def test_a_host_speaks_only_for_its_own_processes(
    caller: KeyIdentity | PeerCredentials | None, peer: bytes | None, sender: str, refused: str
) -> None:
    answer = admitted_from_host(caller, peer, envelope(sender))
    if refused is None:
        assert answer is None
    else:
        assert answer is not None and refused in answer

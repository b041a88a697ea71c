"""The root's cluster endpoint on a real tree (issue 21, ADR 0022): hosts' agents join over
`tcp://` with CURVE only, each with the key allowed under its own name; a host's key steers
nothing on ctl's endpoint, and an operator's joins nothing on the hosts'."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
import zmq

from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.curve import connect
from orchestra_sup.protocol.keys import load_client_keys
from orchestra_sup.protocol.version import PROTOCOL_VERSION
from orchestra_sup.release import describe
from tests.integration.etcd_cluster import EtcdCluster, needs_etcd
from tests.integration.harness import Tree, wait_until
from tests.integration.test_ctl_access import cli, free_port

pytestmark = [pytest.mark.integration, needs_etcd]

REPLY_WAIT_MS = 10_000
CODEC = Codec()


class HostPeer:
    """A host's agent as the root sees one on the wire: a DEALER with routing id `identity`
    (None: the listener gives it one, as it does an agent's), connected as CURVE client `key`
    of `keys` (None: without CURVE)."""

    def __init__(
        self, ctx: zmq.Context, addr: str, keys: Path, key: str | None, identity: str | None
    ):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        if identity is not None:
            self.sock.setsockopt(zmq.IDENTITY, identity.encode())
        if key is None:
            self.sock.connect(addr)
        else:
            connect(self.sock, addr, load_client_keys(keys, key))
        self.sent = 0

    def send(self, body: f.Body) -> None:
        self.sent += 1
        env = f.Envelope(
            v=PROTOCOL_VERSION,
            id=f"host.1.{self.sent}",
            corr=None,
            sender="host",
            gen=1,
            ttl_s=10.0,
            dest_gen=None,
            body=body,
        )
        # A refused handshake takes the connection's pipe with it, and a DEALER with no pipe
        # blocks on send for ever (libzmq 4.3, `session_base_t::engine_error`): what a refused
        # peer says is dropped here, as the root would drop it.
        with suppress(zmq.Again):
            self.sock.send(CODEC.encode(env), zmq.NOBLOCK)

    def ask(self, body: f.Body) -> f.Body | None:
        """Send `body`; the answer to it (earlier answers skipped), or None when none came."""
        self.send(body)
        want = f"host.1.{self.sent}"
        while self.sock.poll(REPLY_WAIT_MS):
            reply = CODEC.decode(self.sock.recv())
            if reply.corr == want:
                return reply.body
        return None

    def hello(self, name: str, pid: int = 4242) -> f.Body | None:
        """Say `Hello` as host `name`; its answer, or None when none came."""
        info = describe()
        self.send(
            f.Hello(
                role=f.HOST_ROLE,
                name=name,
                generation=1,
                release=info.python,
                proto_min=info.proto_min,
                proto_max=info.proto_max,
                pid=pid,
                version=info.version,
            )
        )
        if not self.sock.poll(REPLY_WAIT_MS):
            return None
        return CODEC.decode(self.sock.recv()).body


@contextmanager
def peers() -> Iterator[Callable[..., HostPeer]]:
    ctx = zmq.Context()
    made: list[HostPeer] = []

    def make(addr: str, keys: Path, key: str | None, identity: str | None = None) -> HostPeer:
        made.append(HostPeer(ctx, addr, keys, key, identity))
        return made[-1]

    try:
        yield make
    finally:
        for peer in made:
            peer.sock.close(linger=0)
        ctx.term()


def status_json(tree: Tree) -> dict:
    done = cli("ctl", "--run-dir", str(tree.run_dir), "status", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_hosts_join_only_with_their_own_key_and_steer_nothing(
    tree_factory: Callable[..., Tree], etcd_cluster: EtcdCluster, tmp_path: Path
) -> None:
    """One tree with `[cluster] listen` and `--ctl-tcp` on one keys directory:

    - a peer without CURVE, and the operator's key, are refused at the hosts' handshake;
    - host-b's key saying `Hello` as host-a is refused in one line, and counted;
    - host-a's own key is welcomed, and its report shows in `ctl status` and `ctl tree`;
    - host-a's key is refused at ctl's handshake, where the operator's is served;
    - host-b's key with host-a's routing id holds nothing: the listener gives routing ids;
    - host-a's agent started again takes its name over, with its new pid, and the first
      agent's reports are answered not_found (it would say Hello again)."""
    keys = tmp_path / "keys"
    for argv in (["--client", "operator"], ["--client", "host-a", "--client", "host-b", "--host"]):
        assert cli("keys", "init", "--dir", str(keys), *argv).returncode == 0
    listen, ctl_tcp = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    config = tmp_path / "tree.toml"
    etcd = json.dumps(etcd_cluster.endpoints)
    config.write_text(f'[cluster]\nlisten = "{listen}"\nkeys = "{keys}"\netcd = {etcd}\n')
    tree = tree_factory(
        shards=1, config=config, extra_args=["--ctl-tcp", ctl_tcp, "--keys", str(keys)]
    )

    def refused_at_handshake() -> int:
        return tree.status().ctl_refused

    with peers() as peer:
        plain = peer(listen, keys, None)
        plain.send(f.Heartbeat())
        wait_until(lambda: refused_at_handshake() >= 1, 10, "the plain peer to be refused")
        assert not plain.sock.poll(0)

        before = refused_at_handshake()
        operator = peer(listen, keys, "operator")
        assert operator.hello("host-a", pid=1) is None
        wait_until(lambda: refused_at_handshake() > before, 10, "the operator's key refused")

        squatter = peer(listen, keys, "host-b", "host-a")  # a routing id can hold no name
        assert isinstance(squatter.hello("host-b", pid=9), f.HostWelcome)
        posing = peer(listen, keys, "host-b")
        answer = posing.hello("host-a", pid=2)
        assert isinstance(answer, f.Reject), answer
        assert answer.reason == "host 'host-a' must connect with its own key, not with 'host-b'"
        assert tree.status().hosts_refused == 1
        assert [h.name for h in tree.status().hosts] == ["host-b"]

        agent = peer(listen, keys, "host-a")
        welcome = agent.hello("host-a", pid=3)
        assert isinstance(welcome, f.HostWelcome), welcome
        assert welcome.etcd == etcd_cluster.endpoints
        assert welcome.prefix == "/orchestra-sup/hosts/"
        shards = [f.HostShard(name="shard-0", state="running", generation=1, pid=77, capacity=4)]
        report = f.HostReport(boot="b00t", shards=shards, capabilities=["remote"], lease=255)
        answer = agent.ask(report)  # the root's coordinator and custodian, at their ports
        host, port = listen.removeprefix("tcp://").rsplit(":", 1)
        ports = {"coordinator": f"tcp://{host}:{int(port) + 1}"}
        ports["custodian"] = f"tcp://{host}:{int(port) + 2}"
        assert (welcome.coordinator, welcome.custodian) == (
            ports["coordinator"],
            ports["custodian"],
        )
        assert isinstance(answer, f.RootPeers), answer
        assert {p.name: (p.endpoint, p.up) for p in answer.peers} == {
            name: (address, True) for name, address in ports.items()
        }

        def joined() -> dict | None:
            cluster = status_json(tree)["cluster"]
            return next((h for h in cluster["hosts"] if h["boot"] == "b00t"), None)

        host = wait_until(joined, 10, "host-a's report in ctl status")
        assert isinstance(host, dict)
        # welcomed, but registered in no etcd: its lanes would not be its own
        assert (host["name"], host["state"], host["pid"]) == ("host-a", "unregistered", 3)
        assert host["capabilities"] == ["remote"] and host["lease"] == 0
        assert status_json(tree)["cluster"]["listen"] == listen
        drawn = cli("ctl", "--run-dir", str(tree.run_dir), "tree")
        assert "host-a (host, pid 3, boot b00t, no lease, unregistered)" in drawn.stdout
        assert "shard-0 pid=77 gen=1 running" in drawn.stdout

        before = refused_at_handshake()
        as_host = cli("ctl", "--connect", ctl_tcp, "--keys", str(keys), "--key", "host-a", "status")
        assert as_host.returncode == 3, as_host.stdout
        assert "refused the CURVE handshake" in as_host.stderr
        wait_until(lambda: refused_at_handshake() > before, 10, "host-a's key refused on ctl")
        as_operator = cli("ctl", "--connect", ctl_tcp, "--keys", str(keys), "status")
        assert as_operator.returncode == 0, as_operator.stderr

        again = peer(listen, keys, "host-a")
        assert isinstance(again.hello("host-a", pid=os.getpid()), f.HostWelcome)
        (host_a,) = [h for h in tree.status().hosts if h.name == "host-a"]
        assert host_a.pid == os.getpid()
        stale = agent.ask(report)  # the first agent's connection is not host-a's any more
        assert isinstance(stale, f.Error) and stale.code == "not_found", stale

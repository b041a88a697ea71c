"""A host's agent for integration tests: `orchestra-sup host` run as an operator runs it, the
root's config that lets it join, and the frames a test sends to a host's or the root's CURVE
ports by hand."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import zmq

from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.curve import REFUSALS, connect
from orchestra_sup.protocol.keys import ClientKeys
from orchestra_sup.protocol.version import PROTOCOL_VERSION
from tests.integration.etcd_cluster import EtcdCluster
from tests.integration.harness import Tree
from tests.integration.test_ctl_access import cli, free_port

PREFIX = "/osup-test/"
ROOT_PORTS = ("coordinator", "custodian")
TTL_S = 3
EVERY_S = 0.5


class Agent:
    """`orchestra-sup host` as an operator runs it on another machine, in its own directories."""

    def __init__(
        self, base: Path, join: str, keys: Path, name: str, *extra: str, wrap: list[str] = ()
    ):
        """`wrap` is what the command runs under (`ip netns exec NS`: another machine's
        network)."""
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.log_path = base / "agent.log"
        self.run_dir = Path(tempfile.mkdtemp(prefix="osup-h", dir="/tmp"))
        argv = [*wrap, sys.executable, "-m", "orchestra_sup", "host", "--join", join]
        argv += ["--keys", str(keys), "--name", name, "--state-dir", str(base / "state")]
        argv += ["--run-dir", str(self.run_dir), *extra]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def lane_key(cluster: EtcdCluster, host: str, lane: str) -> bytes | None:
    """The value etcd holds under the fence key of lane `lane` on `host` (the host's name),
    or None."""
    kv = _get(cluster, f"{PREFIX}lanes/{host}/{lane}")
    return None if kv is None else kv[0]


def registration(cluster: EtcdCluster, name: str) -> dict | None:
    """What etcd holds for host `name` (its JSON and its lease), or None."""
    kv = _get(cluster, f"{PREFIX}hosts/{name}")
    return None if kv is None else json.loads(kv[0]) | {"lease": kv[1]}


def _get(cluster: EtcdCluster, key: str) -> tuple[bytes, int] | None:
    """`key`'s (value, lease) through etcd's JSON gateway, from the first member that answers;
    None when it is not there (or no member answers)."""
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    for url in cluster.endpoints:
        try:
            request = urllib.request.Request(f"{url}/v3/kv/range", data=body, method="POST")
            with urllib.request.urlopen(request, timeout=2) as reply:
                kvs = json.loads(reply.read()).get("kvs", [])
        except OSError:
            continue
        if not kvs:
            return None
        return base64.b64decode(kvs[0]["value"]), int(kvs[0].get("lease", 0))
    return None


def root_config(
    tmp_path: Path,
    keys: Path,
    listen: str,
    cluster: EtcdCluster,
    *hosts: str,
    address: str = "127.0.0.1",
) -> Path:
    """A root's config with `[cluster]` at `listen` on `cluster`, the coordinator's and the
    custodian's ports free ones on `address`, short leases, and `keys` made: an operator's, and
    host-a's and each of `hosts`' as hosts'."""
    for argv in (["--client", "operator"], ["--host", "--client", "host-a"]):
        extra = [w for h in hosts for w in ("--client", h)] if "--host" in argv else []
        assert cli("keys", "init", "--dir", str(keys), *argv, *extra).returncode == 0
    config = tmp_path / "tree.toml"
    data = "".join(f'{k}_listen = "tcp://{address}:{free_port()}"\n' for k in ROOT_PORTS)
    config.write_text(
        f'[cluster]\nlisten = "{listen}"\nkeys = "{keys}"\n{data}'
        f"etcd = {json.dumps(cluster.endpoints)}\n"
        f'prefix = "{PREFIX}"\nlease_ttl_s = {TTL_S}\nkeepalive_s = {EVERY_S}\n'
    )
    return config


def host_of(tree: Tree, name: str) -> f.HostInfo | None:
    return next((h for h in tree.status().hosts if h.name == name), None)


def call_through(
    port: str, keys: ClientKeys | None, ident: str, body: f.Body, sender: str = "coordinator"
) -> f.Body | str:
    """`body` sent to `port` (a data port) as CURVE client `keys` (None: no CURVE) with routing
    id `ident`, as `sender`: the answer, or "refused" once the client's own monitor sees its
    handshake fail (nothing can then be answered)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.setsockopt(zmq.IDENTITY, ident.encode())
    monitor = sock.get_monitor_socket(REFUSALS)
    try:
        if keys is None:
            sock.connect(port)
        else:
            connect(sock, port, keys)
        env = f.Envelope(
            v=PROTOCOL_VERSION, id=f"{ident}.1", corr=None, sender=sender, gen=1,
            ttl_s=10.0, dest_gen=None, body=body,
        )  # fmt: skip
        sock.send(Codec().encode(env), zmq.NOBLOCK)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        ready = dict(poller.poll(15_000))
        if monitor in ready:
            assert sock not in ready
            return "refused"
        assert sock in ready, "neither an answer nor a refusal within 15 s"
        reply = Codec().decode(sock.recv())
        assert reply.corr == f"{ident}.1"
        return reply.body
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
        ctx.term()

"""A host's agent on real processes (issue 21, ADR 0022): `orchestra-sup host` joins a root
over CURVE, registers in a real three-member etcd under a lease, supervises its own shards, and
stops them when it can no longer know it holds its lease."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.keys import ClientKeys, load_client_keys, load_server_keys
from tests.integration.etcd_cluster import EtcdCluster, needs_etcd
from tests.integration.harness import Tree, wait_until
from tests.integration.hostagent import (
    TTL_S,
    Agent,
    call_through,
    host_of,
    registration,
    root_config,
)
from tests.integration.test_ctl_access import cli, free_port

pytestmark = [pytest.mark.integration, needs_etcd]


def test_an_agent_joins_supervises_its_shards_and_stops_them_without_its_lease(
    tree_factory: Callable[..., Tree],
    etcd_cluster: EtcdCluster,
    agents: Callable[..., Agent],
    tmp_path: Path,
) -> None:
    """A root with `[cluster]` and an agent for host-a with two shards:

    - the root shows host-a joined, with its shards, capabilities and etcd lease, and etcd holds
      its registration (name, boot, shards, capabilities) under that lease;
    - `ctl` on the host's run directory shows its shards, and refuses in one line what only a
      root does (plans) and a rollover in place;
    - a host shard SIGKILLed is restarted by the agent, and the root's own children are not;
    - two etcd members of three SIGKILLed: the agent stops its shards (their lanes with them)
      before the lease could end, and the root says it has no etcd quorum while its own
      children go on; with the members back it registers under a new lease;
    - the agent SIGSTOPped past its lease: its shards stop their lanes by the lease's deadline
      themselves (`shards.deadline`), and after SIGCONT the host registers again;
    - the agent SIGKILLed: etcd ends its lease, and the root shows host-a unregistered."""
    keys, listen = tmp_path / "keys", f"tcp://127.0.0.1:{free_port()}"
    tree = tree_factory(shards=1, config=root_config(tmp_path, keys, listen, etcd_cluster))
    root_pids = tree.pids()
    agent = agents(tmp_path / "host-a", listen, keys, "host-a", "--shards", "2",
                   "--lanes-per-shard", "3", "--capabilities", "remote")  # fmt: skip

    def joined() -> f.HostInfo | None:
        host = host_of(tree, "host-a")
        running = host is not None and [s.state for s in host.shards] == ["running"] * 2
        return host if running and host.state == "joined" and host.lease else None

    host = wait_until(joined, 30, f"host-a joined with 2 shards; agent log:\n{agent.log()}")
    assert isinstance(host, f.HostInfo)
    assert host.pid == agent.proc.pid and host.capabilities == ["remote"]
    assert [s.capacity for s in host.shards] == [3, 3]
    held = registration(etcd_cluster, "host-a")
    assert held is not None
    assert (held["name"], held["boot"], held["lease"]) == ("host-a", host.boot, host.lease)
    assert held["shards"] == ["shard-0", "shard-1"] and held["capabilities"] == ["remote"]
    assert tree.status().etcd_quorum is True
    local = cli("ctl", "--run-dir", str(agent.run_dir), "status", "--json")
    assert local.returncode == 0, local.stderr
    assert [c["name"] for c in json.loads(local.stdout)["children"]] == [
        "mirror",
        "shard-0",
        "shard-1",
    ]
    for ask in (["plans"], ["rollover", "supervisor"]):  # its shards roll over, itself not
        refused = cli("ctl", "--run-dir", str(agent.run_dir), *ask)
        assert refused.returncode == 2, (ask, refused.stdout, refused.stderr)
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert (
        "this is a host; ask its root"
        in cli("ctl", "--run-dir", str(agent.run_dir), "plans").stderr
    )

    shard = host.shards[0]
    assert shard.pid is not None
    os.kill(shard.pid, signal.SIGKILL)
    wait_until(
        lambda: (
            (h := host_of(tree, "host-a")) is not None
            and h.shards[0].generation == shard.generation + 1
            and h.shards[0].state == "running"
        ),
        30,
        "the agent to restart its shard-0",
    )
    assert tree.pids() == root_pids

    before = host_of(tree, "host-a")
    assert before is not None
    pids = [s.pid for s in before.shards]
    etcd_cluster.kill("m0")
    etcd_cluster.kill("m1")
    # Within the lease as etcd counts it: a leader cut off from its quorum renews leases
    # until it steps down (its election timeout, 1 s here), so a TTL from the kill plus that
    # and a margin for this machine; the mutation of killing nothing never gets there.
    wait_until(
        lambda: not any(psutil.pid_exists(p) and _alive(p) for p in pids if p is not None),
        TTL_S + 3,
        f"the agent to stop its shards within the lease; agent log:\n{agent.log()}",
    )
    # Each shard keeps the deadline itself too (`shards.deadline`), so by the time the agent
    # says so some may have stopped already: the line comes, its count is the race's.
    wait_until(lambda: "lease lost: stopping" in agent.log(), 10, "the agent to say so")
    wait_until(lambda: tree.status().etcd_quorum is False, 15, "the root to see no etcd quorum")
    assert tree.pids() == root_pids  # its own lanes' shards go on
    etcd_cluster.start("m0", "m1")
    wait_until(lambda: tree.status().etcd_quorum is True, 15, "the root to see the quorum back")
    wait_until(
        lambda: (h := joined()) is not None and h.lease != before.lease,
        30,
        "host-a registered under a new lease",
    )

    frozen = host_of(tree, "host-a")
    assert frozen is not None
    pids = [s.pid for s in frozen.shards]
    agent.proc.send_signal(signal.SIGSTOP)  # a frozen agent kills nothing: its shards must
    try:
        wait_until(
            lambda: not any(psutil.pid_exists(p) and _alive(p) for p in pids if p is not None),
            TTL_S + 3,
            "the frozen agent's shards to stop their lanes by the lease's deadline",
        )
    finally:
        agent.proc.send_signal(signal.SIGCONT)
    wait_until(
        lambda: (h := joined()) is not None and h.lease != frozen.lease,
        30,
        f"host-a registered again after the thaw; agent log:\n{agent.log()}",
    )

    agent.proc.send_signal(signal.SIGKILL)
    agent.proc.wait()
    wait_until(
        lambda: (h := host_of(tree, "host-a")) is not None and h.state == "unregistered",
        TTL_S + 5,
        "etcd to end the dead agent's lease, and the root to see it",
    )
    assert registration(etcd_cluster, "host-a") is None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_root_reaches_a_hosts_shards_through_its_data_port_only_with_its_key(
    tree_factory: Callable[..., Tree],
    etcd_cluster: EtcdCluster,
    agents: Callable[..., Agent],
    tmp_path: Path,
) -> None:
    """`host --listen`: a caller with the root's server keypair and routing id
    `coordinator.1>shard-1` is answered by the host's real shard-1; a shard the host does not
    have is answered peer_down; host-b's key, or no CURVE, is refused at the handshake. The
    registration and `ctl status` name the data port. An agent whose key the root does not
    allow exits 2, naming the refused handshake. SIGTERM ends the agent with status 0."""
    keys = tmp_path / "keys"
    listen, data = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    config = root_config(tmp_path, keys, listen, etcd_cluster, "host-b")
    tree = tree_factory(shards=1, config=config)
    agent = agents(tmp_path / "host-a", listen, keys, "host-a", "--listen", data)
    wait_until(
        lambda: (h := host_of(tree, "host-a")) is not None and h.state == "joined",
        30,
        f"host-a joined; agent log:\n{agent.log()}",
    )
    assert host_of(tree, "host-a").data == data  # type: ignore[union-attr]
    held = registration(etcd_cluster, "host-a")
    assert held is not None and held["data"] == data

    server = load_server_keys(keys)
    host_a = load_client_keys(keys, "host-a")
    root = ClientKeys(server_public=host_a.client.public, client=server.server, name="root")
    answer = call_through(data, root, "coordinator.1>shard-1", f.ListLanes())
    assert isinstance(answer, f.LaneList) and answer.lanes == [], answer
    missing = call_through(data, root, "coordinator.1>shard-7", f.ListLanes())
    assert isinstance(missing, f.Error) and missing.code == "peer_down", missing
    assert "no shard 'shard-7'" in missing.message

    host_b = load_client_keys(keys, "host-b")
    posing = ClientKeys(server_public=host_a.client.public, client=host_b.client, name="host-b")
    assert call_through(data, posing, "coordinator.1>shard-1", f.ListLanes()) == "refused"
    assert call_through(data, None, "coordinator.1>shard-1", f.ListLanes()) == "refused"

    rogue = tmp_path / "rogue"  # host-a's name, a key the root never allowed
    assert cli("keys", "init", "--dir", str(rogue), "--client", "host-a", "--host").returncode == 0
    (rogue / "server.public").write_bytes((keys / "server.public").read_bytes())
    stray = agents(tmp_path / "stray", listen, rogue, "host-a")
    assert stray.proc.wait(60) == 2, stray.log()
    assert "refused the CURVE handshake" in stray.log()

    agent.proc.send_signal(signal.SIGTERM)  # systemctl stop: the agent ends, its lease revoked
    assert agent.proc.wait(30) == 0, agent.log()
    wait_until(lambda: registration(etcd_cluster, "host-a") is None, 10, "the lease revoked")

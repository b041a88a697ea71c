"""A tree on an etcd with its own users (`etcdctl auth enable`; issue 21: "TLS and auth options
as etcd offers them"): the root as one user, host-a as another whose role allows it only its
own registration and its own lanes' keys (`cluster.fences`: `lanes/<host>/`), from the
`[cluster]` of the host's own `--config`."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.etcd_cluster import EtcdCluster, needs_etcd
from tests.integration.harness import Tree, make_repo, plan, task, wait_until
from tests.integration.hostagent import PREFIX, Agent, host_of, root_config
from tests.integration.test_ctl_access import cli, free_port

pytestmark = [pytest.mark.integration, needs_etcd]

TTL_S = 30
"""The lease here: long, so a registration gone within seconds was revoked, not expired."""


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def prefix_end(prefix: str) -> str:
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def gateway(cluster: EtcdCluster, path: str, body: dict[str, Any], token: str = "") -> dict:
    """etcd's JSON gateway at `path` on the first member: its answer, or {"error": ...}."""
    request = urllib.request.Request(
        f"{cluster.endpoints[0]}{path}", data=json.dumps(body).encode(), method="POST"
    )
    if token:
        request.add_header("Authorization", token)
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return {"error": exc.read().decode(errors="replace")}


def token_of(cluster: EtcdCluster, user: str) -> str:
    return gateway(cluster, "/v3/auth/authenticate", {"name": user, "password": f"{user}-pw"})[
        "token"
    ]


def enable_auth(cluster: EtcdCluster) -> None:
    """Users `root`, `orchestra` (the tree's whole prefix) and `host-a` (its registration and
    `lanes/host-a/` only), each with the password `<user>-pw`; then auth on."""
    grants = {
        "orchestra": [(PREFIX, prefix_end(PREFIX))],
        "host-a": [
            (f"{PREFIX}hosts/host-a", ""),
            (f"{PREFIX}lanes/host-a/", prefix_end(f"{PREFIX}lanes/host-a/")),
        ],
    }
    for user in ("root", *grants):
        gateway(cluster, "/v3/auth/user/add", {"name": user, "password": f"{user}-pw"})
        gateway(cluster, "/v3/auth/role/add", {"name": user})
        gateway(cluster, "/v3/auth/user/grant", {"user": user, "role": user})
    for role, ranges in grants.items():
        for key, end in ranges:
            perm = {"permType": "READWRITE", "key": b64(key)} | (
                {"range_end": b64(end)} if end else {}
            )
            answer = gateway(cluster, "/v3/auth/role/grant", {"name": role, "perm": perm})
            assert "error" not in answer, answer
    assert "error" not in gateway(cluster, "/v3/auth/enable", {})


def keys_under(cluster: EtcdCluster, prefix: str) -> list[str]:
    body = {"key": b64(prefix), "range_end": b64(prefix_end(prefix))}
    answer = gateway(cluster, "/v3/kv/range", body, token_of(cluster, "root"))
    return [base64.b64decode(kv["key"]).decode() for kv in answer.get("kvs", [])]


def test_a_host_with_its_own_etcd_user_touches_only_its_own_keys(
    tree_factory: Callable[..., Tree],
    etcd_cluster: EtcdCluster,
    agents: Callable[..., Agent],
    tmp_path: Path,
) -> None:
    """The root and host-a each log in as their own etcd user. Host-a registers, runs a lane
    the root fenced under its lease, and when it stops it revokes that lease, its lane's key
    attached (etcd lets a user revoke a lease only if it may write every key under it): the
    registration is gone in seconds, not at the TTL's end. Host-a's user may not write
    another host's registration or lanes. An agent with a wrong password exits 2, saying
    etcd refused its user."""
    enable_auth(etcd_cluster)
    for user in ("orchestra", "host-a"):
        (tmp_path / f"{user}.password").write_text(f"{user}-pw\n")
    keys = tmp_path / "keys"
    listen, data = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    config = root_config(tmp_path, keys, listen, etcd_cluster)
    text = config.read_text().replace("lease_ttl_s = 3\n", f"lease_ttl_s = {TTL_S}\n")
    config.write_text(
        f'{text}etcd_user = "orchestra"\netcd_password_file = "{tmp_path / "orchestra.password"}"\n'
    )
    tree = tree_factory(workspace=make_repo(tmp_path / "workspace"), shards=1, config=config)
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-host-a-pw\n")
    bad_config = tmp_path / "host-a-wrong.toml"
    bad_config.write_text(f'[cluster]\netcd_user = "host-a"\netcd_password_file = "{wrong}"\n')
    refused = agents(
        tmp_path / "host-a-wrong", listen, keys, "host-a", "--shards", "1",
        "--config", str(bad_config),
    )  # fmt: skip
    assert refused.proc.wait(timeout=30) == 2, refused.log()[-2000:]
    assert "etcd refused user 'host-a'" in refused.log(), refused.log()[-2000:]
    host_config = tmp_path / "host-a.toml"
    host_config.write_text(
        f'[cluster]\netcd_user = "host-a"\netcd_password_file = "{tmp_path / "host-a.password"}"\n'
    )
    agent = agents(
        tmp_path / "host-a", listen, keys, "host-a", "--shards", "1", "--capabilities", "remote",
        "--listen", data, "--config", str(host_config),
    )  # fmt: skip
    wait_until(
        lambda: (h := host_of(tree, "host-a")) is not None and h.state == "joined",
        30,
        f"host-a joined as etcd user host-a; agent log:\n{agent.log()}",
    )
    ran = tree.wait_plan(tree.submit(plan("there", task("t", "true", requires=["remote"]))), 60)
    assert ran.ok and ran.tasks[0].shard == "host-a/shard-0", ran.tasks

    host_token = token_of(etcd_cluster, "host-a")
    for key in (f"{PREFIX}hosts/host-b", f"{PREFIX}lanes/host-b/l-1", f"{PREFIX}lanes/l-1"):
        put = gateway(etcd_cluster, "/v3/kv/put", {"key": b64(key), "value": b64("x")}, host_token)
        assert "permission denied" in put.get("error", ""), (key, put)

    go = tmp_path / "go"
    running = tree.submit(
        plan("held", task("t", f"while [ ! -e {go} ]; do sleep 0.05; done", requires=["remote"]))
    )
    wait_until(lambda: keys_under(etcd_cluster, f"{PREFIX}lanes/host-a/"), 30, "the lane's key")
    argv = [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(tree.run_dir)]
    stopped = subprocess.run(
        [*argv, "stop-host", "host-a", "--drain-timeout", "0.5"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert stopped.returncode == 0, stopped
    left = time.monotonic()
    assert agent.proc.wait(timeout=30) == 0, agent.log()
    wait_until(
        lambda: not keys_under(etcd_cluster, f"{PREFIX}hosts/"), 10, "the revoked registration"
    )
    assert time.monotonic() - left < TTL_S / 2, "the lease expired: it was not revoked"
    assert keys_under(etcd_cluster, f"{PREFIX}lanes/") == []  # its lane's key went with it
    assert "permission denied" not in agent.log(), agent.log()[-3000:]
    go.touch()
    assert running  # the lane runs again when a host offers "remote"; none does now
    assert cli("ctl", "--run-dir", str(tree.run_dir), "status").returncode == 0

"""A partitioned host (issue 21's must-show): host-a runs on a network of its own (a network
namespace over a veth pair, `hostnet`), and its link goes down for twice its lease while its
lane commits. The commit's `SandboxLand` waits in TCP; host-a stops its lanes as its lease
runs out; etcd ends the lease and deletes the lane's key; the lane runs again on the root and
its commit lands. Once the link is back the held commit reaches the custodian, which refuses
it as fenced and counts it: the change is in the workspace once.

host-a's processes also run in a mount namespace where the root's state directory and its
workspace are empty tmpfs (`HIDE`): what a host's lane gets, it gets over the CURVE links."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestra_sup.protocol import frames as f
from tests.integration.etcd_cluster import EtcdCluster, needs_etcd
from tests.integration.harness import Tree, git, make_repo, plan, task, wait_until
from tests.integration.hostagent import TTL_S, Agent, host_of, root_config
from tests.integration.hostnet import HostNet, host_net
from tests.integration.test_ctl_access import free_port

pytestmark = [pytest.mark.integration, needs_etcd]

HIDE = 'mount -t tmpfs hidden "$1" && mount -t tmpfs hidden "$2" && shift 2 && exec "$@"'
"""Run the rest of the command line with directories $1 and $2 hidden under empty tmpfs."""


@pytest.fixture
def net() -> Iterator[HostNet]:
    made = host_net(os.getpid() % 16000)
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture
def net_etcd(net: HostNet, tmp_path: Path) -> Iterator[EtcdCluster]:
    """Three etcd members on the root's side of the pair: host-a reaches them over it."""
    members = EtcdCluster.up(tmp_path / "etcd", address=net.root_ip)
    try:
        yield members
    finally:
        members.stop()


def fenced(tree: Tree) -> int:
    """Hosts' results and commits the tree refused as fenced (`ChildInfo.fenced`)."""
    return sum(c.fenced for c in tree.status().children)


def test_a_partitioned_hosts_commit_is_fenced_and_the_change_lands_once(
    tree_factory: Callable[..., Tree],
    net: HostNet,
    net_etcd: EtcdCluster,
    agents: Callable[..., Agent],
    tmp_path: Path,
) -> None:
    keys = tmp_path / "keys"
    listen = f"tcp://{net.root_ip}:{free_port()}"
    config = root_config(tmp_path, keys, listen, net_etcd, address=net.root_ip)
    tree = tree_factory(workspace=make_repo(tmp_path / "workspace"), shards=1, config=config)
    assert tree.workspace is not None
    hidden = [str(tree.state_dir), str(tree.workspace)]
    wrap = [*net.wrap, "unshare", "--mount", "sh", "-c", HIDE, "hide", *hidden]
    agent = agents(
        tmp_path / "host-a", listen, keys, "host-a", "--shards", "1",
        "--listen", f"tcp://{net.host_ip}:{free_port()}", wrap=wrap,
    )  # fmt: skip
    wait_until(
        lambda: (h := host_of(tree, "host-a")) is not None and h.state == "joined",
        30,
        f"host-a joined; agent log:\n{agent.log()}",
    )
    began, go = tmp_path / "began", tmp_path / "go"
    spec = plan(
        "partition",
        task(
            "work",
            # on host-a (attempt 1) the root's files are not there to see
            f'[ "$ORCHESTRA_ATTEMPT" != 1 ] || [ ! -e {tree.state_dir}/sandboxes ] || exit 7; '
            f"touch {began}; while [ ! -e {go} ]; do sleep 0.05; done; echo once >> count.txt",
            commit=True,
            timeout_s=120,
        ),
        task("check", 'test "$(grep -c once count.txt)" = 1', needs=["work"]),
    )
    plan_id = tree.submit(spec)  # both shards idle: host-a/shard-0 sorts first

    def work() -> f.TaskReport:
        reply = tree.ctl(f.CtlPlan(id=plan_id))
        assert isinstance(reply, f.PlanReport)
        return next(t for t in reply.tasks if t.id == "work")

    wait_until(began.exists, 60, "the lane's command running")
    assert work().shard == "host-a/shard-0", work()
    net.down()
    cut = time.monotonic()
    go.touch()  # host-a's lane ends and commits: its landing waits in TCP
    report = tree.wait_plan(plan_id, timeout_s=60)
    by_id = {t.id: t for t in report.tasks}
    assert report.ok, report
    assert by_id["work"].shard == "shard-0" and by_id["work"].attempts == 2, by_id["work"]
    assert any("host-a/shard-0" in w for w in by_id["work"].warnings), by_id["work"].warnings
    print(f"re-run and landed {time.monotonic() - cut:.2f} s after the cut (lease {TTL_S} s)")
    wait_until(lambda: time.monotonic() - cut >= 2 * TTL_S, 2 * TTL_S + 1, "twice the lease")
    assert fenced(tree) == 0
    net.up()
    assert tree.workspace is not None
    workspace = tree.workspace

    def landed() -> int:
        """Commits of the task "work" in the workspace (each lane's commit names its task)."""
        subjects = git(workspace, "log", "--format=%s").splitlines()
        return sum("partition/work" in s for s in subjects)

    wait_until(
        lambda: fenced(tree) >= 1 or landed() > 1, 60, "the held commit to reach the custodian"
    )
    assert landed() == 1
    assert git(workspace, "show", "HEAD:count.txt") == "once"
    status = tree.status()
    assert next(c for c in status.children if c.name == "custodian").fenced == 1
    assert "lease lost" in agent.log()

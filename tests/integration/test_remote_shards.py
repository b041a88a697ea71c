"""A host's shards in the root's tree (issue 21, ADR 0021 step 3): the root's roster lists them
as `host-a/shard-0`, the coordinator places on them through the host's data port, and they
reach the root's coordinator and custodian on those two's own CURVE ports, where a host speaks
for its own processes only."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.keys import load_client_keys
from tests.integration.etcd_cluster import EtcdCluster, needs_etcd
from tests.integration.harness import Tree, git, make_repo, plan, task, wait_until
from tests.integration.hostagent import (
    TTL_S,
    Agent,
    call_through,
    host_of,
    lane_key,
    root_config,
)
from tests.integration.test_ctl_access import free_port

pytestmark = [pytest.mark.integration, needs_etcd]


def kill_host(agent: Agent) -> None:
    """Host-a's machine dies: its agent and everything under it SIGKILLed at once."""
    procs = [psutil.Process(agent.proc.pid)]
    procs += procs[0].children(recursive=True)
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):  # one that ended since it was listed
            proc.send_signal(signal.SIGKILL)
    agent.proc.wait()


def joined_tree(
    tree_factory: Callable[..., Tree],
    etcd_cluster: EtcdCluster,
    agents: Callable[..., Agent],
    tmp_path: Path,
    seed: Callable[[Path], None] | None = None,
) -> tuple[Tree, Agent, Path]:
    """A root of one local shard over a git workspace (`seed` adds to it first), and host-a
    (one shard, capability "remote", a data port) joined to it: (tree, agent, keys
    directory)."""
    keys = tmp_path / "keys"
    listen, data = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    config = root_config(tmp_path, keys, listen, etcd_cluster)
    workspace = make_repo(tmp_path / "workspace")
    if seed is not None:
        seed(workspace)
    tree = tree_factory(workspace=workspace, shards=1, config=config)
    agent = agents(
        tmp_path / "host-a", listen, keys, "host-a", "--shards", "1", "--capabilities", "remote",
        "--listen", data,
    )  # fmt: skip
    wait_until(
        lambda: (h := host_of(tree, "host-a")) is not None and h.state == "joined",
        30,
        f"host-a joined; agent log:\n{agent.log()}",
    )
    return tree, agent, keys


def agent_join(tmp_path: Path) -> str:
    """The root's cluster endpoint in the config `joined_tree` wrote."""
    (listen,) = [
        line.split(" = ")[1].strip('"')
        for line in (tmp_path / "tree.toml").read_text().splitlines()
        if line.startswith("listen")
    ]
    return listen


def test_a_task_that_requires_a_hosts_capability_runs_there_and_its_commit_lands(
    tree_factory: Callable[..., Tree],
    etcd_cluster: EtcdCluster,
    agents: Callable[..., Agent],
    tmp_path: Path,
) -> None:
    """A task with `requires = ["remote"]`, which only host-a offers, runs on host-a/shard-0, in
    a sandbox host-a's mirror made (the root's custodian made none for it); its commit lands in
    the root's workspace, and the task that needs it sees the file."""
    tree, _agent, _keys = joined_tree(tree_factory, etcd_cluster, agents, tmp_path)
    spec = plan(
        "remote",
        task("write", "echo from-host-a > made.txt", commit=True, requires=["remote"]),
        task("read", "grep -qx from-host-a made.txt", needs=["write"]),
    )
    report = tree.wait_plan(tree.submit(spec), timeout_s=90)
    by_id = {t.id: t for t in report.tasks}
    assert report.ok, report
    assert by_id["write"].shard == "host-a/shard-0", by_id["write"]
    assert by_id["write"].commit is not None
    assert tree.workspace is not None
    assert git(tree.workspace, "show", "HEAD:made.txt") == "from-host-a"
    lane = by_id["write"].lane
    assert (tmp_path / "host-a" / "state" / "sandboxes" / lane / "made.txt").is_file()
    assert not (tree.state_dir / "sandboxes" / lane).exists()
    # its fence went with its result: a late landing of it would be refused now
    wait_until(
        lambda: lane_key(etcd_cluster, "host-a", lane) is None, 10, "the lane's fence key gone"
    )


def test_a_workspace_larger_than_a_frame_reaches_a_hosts_mirror_in_parts(
    tree_factory: Callable[..., Tree],
    etcd_cluster: EtcdCluster,
    agents: Callable[..., Agent],
    tmp_path: Path,
) -> None:
    """A workspace whose history bundles to more than one frame (24 MiB that do not compress,
    over `codec.MAX_FRAME_BYTES`): host-a's first sandbox gets it all, in parts, and its lane
    reads the file whole; the custodian keeps no part once the mirror has read it."""
    noise = os.urandom(24 << 20)

    def seed(workspace: Path) -> None:
        (workspace / "noise.bin").write_bytes(noise)
        git(workspace, "add", "-A")
        git(workspace, "commit", "-q", "-m", "24 MiB of noise")

    tree, _agent, _keys = joined_tree(tree_factory, etcd_cluster, agents, tmp_path, seed)
    digest = hashlib.sha256(noise).hexdigest()
    check = f"test \"$(sha256sum noise.bin | cut -d' ' -f1)\" = {digest}"
    report = tree.wait_plan(tree.submit(plan("big", task("t", check, requires=["remote"]))), 120)
    assert report.ok and report.tasks[0].shard == "host-a/shard-0", report.tasks
    assert list((tree.state_dir / "exports").iterdir()) == []
    assert "in parts" in tree.log(), "the custodian made no bundle in parts"


def test_a_host_speaks_to_the_coordinator_only_for_its_own_processes(
    tree_factory: Callable[..., Tree],
    etcd_cluster: EtcdCluster,
    agents: Callable[..., Agent],
    tmp_path: Path,
) -> None:
    """On the coordinator's `[cluster] coordinator_listen`: host-a's key sending as a local
    shard, as host-b's, or from a routing id not under host-a/ is refused `forbidden`; as
    host-a/shard-0 only a shard's outbox frame is taken (a plan listing, a ctl frame, is
    refused: a host steers nothing). On the custodian's port a host's process gets no sandbox
    on the root. An operator's key, or no CURVE, is refused at the handshake."""
    tree, _agent, keys = joined_tree(tree_factory, etcd_cluster, agents, tmp_path)
    ports = {
        line.split("_listen = ")[0]: line.split(" = ")[1].strip('"')
        for line in (tmp_path / "tree.toml").read_text().splitlines()
        if "_listen = " in line
    }
    port = ports["coordinator"]
    host_a = load_client_keys(keys, "host-a")
    outbox = f.InboxPut(msg_id="m-1")  # a shard's frame, malformed: who may say it matters
    for ident, sender in (
        ("shard-0.1", "shard-0"),
        ("host-b/shard-0.1", "host-b/shard-0"),
        ("coordinator.1", "host-a/shard-0"),
    ):
        answer = call_through(port, host_a, ident, outbox, sender=sender)
        assert isinstance(answer, f.Error) and answer.code == "forbidden", (ident, answer)
        assert "host 'host-a' speaks for its own processes only" in answer.message
    answer = call_through(port, host_a, "host-a/shard-0.1", outbox, sender="host-a/shard-0")
    assert isinstance(answer, f.Error) and answer.code == "bad_request", answer
    assert "exactly one of result, pause and note" in answer.message
    steer = call_through(port, host_a, "host-a/shard-0.1", f.CtlPlans(), sender="host-a/shard-0")
    assert isinstance(steer, f.Error) and steer.code == "forbidden", steer
    assert "may not send CtlPlans here" in steer.message
    sandbox = call_through(
        ports["custodian"], host_a, "host-a/shard-0.1", f.SandboxCreate(lane="x-1"),
        sender="host-a/shard-0",
    )  # fmt: skip
    assert isinstance(sandbox, f.Error) and sandbox.code == "forbidden", sandbox
    assert not (tree.state_dir / "sandboxes" / "x-1").exists()
    for tool, params in (("read_file", {"path": "README"}), ("list_dir", {})):
        read = call_through(  # a host's lane's read, passed on by its mirror
            ports["custodian"],
            host_a,
            "host-a/mirror.1",
            f.ToolCall(tool=tool, params=params),
            sender="host-a/mirror",
        )
        assert isinstance(read, f.ToolResult) and "README" in str(read.value), (tool, read)
    operator = load_client_keys(keys, "operator")
    assert call_through(port, operator, "host-a/shard-0.1", outbox, sender="host-a/x") == "refused"
    assert call_through(port, None, "host-a/shard-0.1", outbox, sender="host-a/x") == "refused"
    assert tree.child("coordinator").restarts == 0


def test_a_dead_hosts_lane_runs_again_on_the_root_and_the_host_gets_work_once_back(
    tree_factory: Callable[..., Tree],
    etcd_cluster: EtcdCluster,
    agents: Callable[..., Agent],
    tmp_path: Path,
) -> None:
    """Host-a's machine SIGKILLed while a lane runs there: once etcd ends its lease (TTL 3 s
    here) the root lists its shard down, the lane is lost with a partial-work warning and runs
    again on the root's own shard, and the plan succeeds. Host-a started again (a new boot,
    a new lease) gets work again."""
    tree, agent, keys = joined_tree(tree_factory, etcd_cluster, agents, tmp_path)
    spec = plan("outlive", task("long", "sleep 4", timeout_s=60))
    plan_id = tree.submit(spec)  # both shards idle: host-a/shard-0 sorts first

    def running_on(shard: str) -> f.TaskReport | None:
        reply = tree.ctl(f.CtlPlan(id=plan_id))
        assert isinstance(reply, f.PlanReport)
        (long,) = reply.tasks
        return long if long.shard == shard and long.status == "running" else None

    wait_until(lambda: running_on("host-a/shard-0"), 30, "the lane running on host-a")
    first_boot = host_of(tree, "host-a").boot  # type: ignore[union-attr]
    killed = time.monotonic()
    kill_host(agent)
    wait_until(lambda: running_on("shard-0"), TTL_S + 2 + 5, "the lane running again locally")
    print(f"re-placed {time.monotonic() - killed:.2f} s after the kill (lease {TTL_S} s)")
    report = tree.wait_plan(plan_id, timeout_s=60)
    (long,) = report.tasks
    assert report.ok and long.shard == "shard-0" and long.attempts == 2, long
    assert any("host-a/shard-0" in w for w in long.warnings), long.warnings

    again = agents(
        tmp_path / "host-a", agent_join(tmp_path), keys, "host-a", "--shards", "1",
        "--capabilities", "remote", "--listen", f"tcp://127.0.0.1:{free_port()}",
    )  # fmt: skip
    wait_until(
        lambda: (
            (h := host_of(tree, "host-a")) is not None
            and h.state == "joined"
            and h.boot != first_boot
        ),
        30,
        f"host-a back under a new boot; agent log:\n{again.log()}",
    )
    back = tree.wait_plan(
        tree.submit(plan("back", task("there", "true", requires=["remote"]))), timeout_s=60
    )
    assert back.ok and back.tasks[0].shard == "host-a/shard-0", back.tasks


def test_a_lane_only_a_host_can_run_waits_for_it_through_its_death(
    tree_factory: Callable[..., Tree],
    etcd_cluster: EtcdCluster,
    agents: Callable[..., Agent],
    tmp_path: Path,
) -> None:
    """A task that `requires = ["remote"]`, which only host-a offers, runs there; host-a is
    SIGKILLed, its lease ends, and the task waits (no shard offers "remote" now, but one did
    and may again): host-a started again runs it, and the plan succeeds."""
    tree, agent, keys = joined_tree(tree_factory, etcd_cluster, agents, tmp_path)
    plan_id = tree.submit(plan("only-there", task("t", "sleep 2", requires=["remote"])))

    wait_until(lambda: tree.task(plan_id).status == "running", 30, "the lane running on host-a")
    kill_host(agent)
    wait_until(
        lambda: host_of(tree, "host-a") is None or tree.task(plan_id).status != "running",
        20,
        "lost",
    )
    gone = time.monotonic() + TTL_S + 3  # well past the lease: the roster forgot its shard
    while time.monotonic() < gone:
        assert tree.task(plan_id).status not in ("failed", "skipped"), tree.task(plan_id)
        time.sleep(0.2)
    agents(
        tmp_path / "host-a", agent_join(tmp_path), keys, "host-a", "--shards", "1",
        "--capabilities", "remote", "--listen", f"tcp://127.0.0.1:{free_port()}",
    )  # fmt: skip
    report = tree.wait_plan(plan_id, timeout_s=60)
    assert report.ok and report.tasks[0].shard == "host-a/shard-0", report.tasks
    assert report.tasks[0].attempts == 2, report.tasks


def test_without_an_etcd_quorum_nothing_new_goes_to_a_host_and_the_roots_lanes_go_on(
    tree_factory: Callable[..., Tree],
    etcd_cluster: EtcdCluster,
    agents: Callable[..., Agent],
    tmp_path: Path,
) -> None:
    """One etcd member SIGKILLed: a task for host-a still runs there. Two: a task for host-a
    waits, and a task for the root's own shard runs. The members back: the waiting task runs
    on host-a."""
    tree, agent, _keys = joined_tree(tree_factory, etcd_cluster, agents, tmp_path)
    etcd_cluster.kill("m2")
    one_down = tree.wait_plan(
        tree.submit(plan("one-down", task("there", "true", requires=["remote"]))), timeout_s=60
    )
    assert one_down.ok and one_down.tasks[0].shard == "host-a/shard-0", one_down.tasks

    etcd_cluster.kill("m1")
    wait_until(lambda: tree.status().etcd_quorum is False, 15, "the root to see no etcd quorum")
    wait_until(
        lambda: host_of(tree, "host-a").state != "joined",  # type: ignore[union-attr]
        TTL_S + 5,
        "host-a to say it lost its lease",
    )
    waiting = tree.submit(plan("waits", task("there", "true", requires=["remote"])))
    local = tree.wait_plan(tree.submit(plan("local", task("here", "true"))), timeout_s=60)
    assert local.ok and local.tasks[0].shard == "shard-0", local.tasks
    reply = tree.ctl(f.CtlPlan(id=waiting))
    assert isinstance(reply, f.PlanReport) and not reply.done, reply
    assert reply.tasks[0].shard is None, reply.tasks  # placed nowhere while there is no quorum

    etcd_cluster.start("m1", "m2")
    back = tree.wait_plan(waiting, timeout_s=60)
    assert back.ok and back.tasks[0].shard == "host-a/shard-0", back.tasks
    assert "lease lost" in agent.log()


def test_a_host_can_neither_report_nor_land_for_a_lane_not_its_own(
    tree_factory: Callable[..., Tree],
    etcd_cluster: EtcdCluster,
    agents: Callable[..., Agent],
    tmp_path: Path,
) -> None:
    """With host-a's own key, as host-a's own processes: a result for a lane that runs on the
    root's shard is refused `fenced` by the coordinator, and a landing for it `fenced` by the
    custodian (no key in etcd names host-a for that lane); both are counted, and the real
    lane's result is the one the task keeps."""
    tree, _agent, keys = joined_tree(tree_factory, etcd_cluster, agents, tmp_path)
    go = tmp_path / "go"
    spec = plan("local", task("here", f"while [ ! -e {go} ]; do sleep 0.05; done; echo REAL"))
    wait = f"while [ ! -e {go} ]; do sleep 0.05; done"
    tree.submit(plan("busy", task("there", wait, requires=["remote"])))
    plan_id = tree.submit(spec)  # host-a/shard-0 is taken: this one runs on shard-0

    def here() -> f.TaskReport:
        reply = tree.ctl(f.CtlPlan(id=plan_id))
        assert isinstance(reply, f.PlanReport)
        return reply.tasks[0]

    wait_until(lambda: here().status == "running", 30, "the root's lane running")
    lane = here().lane
    assert here().shard == "shard-0" and lane is not None, here()
    ports = {
        line.split("_listen = ")[0]: line.split(" = ")[1].strip('"')
        for line in (tmp_path / "tree.toml").read_text().splitlines()
        if "_listen = " in line
    }
    host_a = load_client_keys(keys, "host-a")
    forged = f.LaneResult(
        lane=lane, plan=plan_id, task="here", shard="host-a/shard-0",
        status=f.ResultStatus.SUCCEEDED, exit_code=0, duration_s=0.1, output_tail="FORGED",
        sandbox=None, commit=None, error=None,
    )  # fmt: skip
    put = f.InboxPut(msg_id=f"result:{lane}", result=forged)
    answer = call_through(ports["coordinator"], host_a, "host-a/shard-0.9", put, "host-a/shard-0")
    assert isinstance(answer, f.Error) and answer.code == "fenced", answer
    land = f.SandboxLand(lane=lane, base="0" * 40, bundle=b"", fence=1)
    answer = call_through(ports["custodian"], host_a, "host-a/mirror.9", land, "host-a/mirror")
    assert isinstance(answer, f.Error) and answer.code == "fenced", answer
    go.touch()
    report = tree.wait_plan(plan_id, timeout_s=60)
    assert report.ok and "REAL" in report.tasks[0].output_tail, report.tasks
    wait_until(
        lambda: sum(c.fenced for c in tree.status().children) == 2, 10, "both refusals counted"
    )


def test_a_hosts_commit_waits_out_a_restart_of_the_roots_custodian(
    tree_factory: Callable[..., Tree],
    etcd_cluster: EtcdCluster,
    agents: Callable[..., Agent],
    tmp_path: Path,
) -> None:
    """The root's custodian SIGKILLed as a host's lane commits: the host's mirror asks again
    once the custodian is back (a new generation), and the commit lands in the one attempt."""
    tree, _agent, _keys = joined_tree(tree_factory, etcd_cluster, agents, tmp_path)
    began, go = tmp_path / "began", tmp_path / "go"
    wait = f"touch {began}; while [ ! -e {go} ]; do sleep 0.05; done; echo landed > made.txt"
    plan_id = tree.submit(plan("custodian", task("write", wait, commit=True, requires=["remote"])))
    wait_until(began.exists, 60, "the lane's command running on host-a")
    custodian = tree.child("custodian")
    assert custodian.pid is not None
    psutil.Process(custodian.pid).send_signal(signal.SIGKILL)
    go.touch()
    report = tree.wait_plan(plan_id, timeout_s=90)
    (write,) = report.tasks
    assert report.ok and write.attempts == 1 and write.commit is not None, write
    assert tree.child("custodian").generation > custodian.generation
    assert tree.workspace is not None
    assert git(tree.workspace, "show", "HEAD:made.txt") == "landed"

"""The coordinator's tools through the real relay (`ctl call`), and `bench relay`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.version import PROTOCOL_VERSION
from orchestra_sup.system.cpupolicy import CpuSettings
from tests.integration.harness import (
    RawPeer,
    Tree,
    assert_machine_record,
    cpu_latency_holdable,
    git,
    plan,
    task,
    wait_until,
)

pytestmark = pytest.mark.integration


def call(tree: Tree, tool: str, timeout_s: float = 30.0, **params: str) -> object:
    reply = tree.ctl(f.CtlCall(tool=tool, params=params), timeout_s=timeout_s)
    assert isinstance(reply, f.ToolResult)
    return reply.value


def test_read_tools_through_the_relay(tree: Tree, repo: Path) -> None:
    """read_file of a 5 MB file, list_dir of a 2,000-entry directory and stat, answered by the
    custodian through the coordinator's relay."""
    big = "0123456789abcdef" * (5 * 1024 * 1024 // 16)
    (repo / "big.txt").write_text(big)
    many = repo / "many"
    many.mkdir()
    for i in range(2000):
        (many / f"f{i:04d}").write_text("x")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "fixtures")
    value = call(tree, "read_file", path="big.txt")
    assert isinstance(value, dict) and value["text"] == big and value["size"] == len(big)
    listing = call(tree, "list_dir", path="many")
    assert isinstance(listing, dict) and len(listing["entries"]) == 2000
    stat = call(tree, "stat", path="big.txt")
    assert isinstance(stat, dict) and stat["size"] == len(big) and stat["type"] == "file"


@pytest.mark.parametrize("path", ["../outside", "/etc/passwd", "link-out", ".git/config"])
def test_path_escapes_are_refused_through_the_relay(tree: Tree, repo: Path, path: str) -> None:
    """`..`, absolute paths, symlinks out of the workspace and .git are typed path_escape."""
    (repo / "link-out").symlink_to("/etc")
    with pytest.raises(RemoteError) as info:
        call(tree, "read_file", path=path)
    assert info.value.code is ErrorCode.PATH_ESCAPE


def test_lane_tools_through_the_relay(tree: Tree) -> None:
    """list_lanes, lane_status and cancel_lane reach the shards; an unknown lane is not_found."""
    plan_id = tree.submit(plan("tools", task("long", "sleep 300")))

    def lanes() -> list[dict[str, object]]:
        value = call(tree, "list_lanes")
        assert isinstance(value, dict)
        return [lane for lane in value["lanes"] if lane["state"] == "running"]

    (lane,) = wait_until(lanes, 20, "the lane to run")  # type: ignore[misc]
    status = call(tree, "lane_status", lane=str(lane["lane"]))
    assert isinstance(status, dict) and status["task"] == "long" and status["plan"] == plan_id
    assert call(tree, "cancel_lane", lane=str(lane["lane"])) == {"cancelled": lane["lane"]}
    report = tree.wait_plan(plan_id, timeout_s=10)
    assert report.tasks[0].status == "cancelled"
    with pytest.raises(RemoteError) as info:
        call(tree, "lane_status", lane="no-such-lane")
    assert info.value.code is ErrorCode.NOT_FOUND


def test_custodian_killed_mid_call_is_a_typed_error_at_once(tree: Tree) -> None:
    """A read in flight when the custodian dies fails at once with peer_down (not after the
    55 s deadline), and the same read succeeds once the custodian is back."""
    custodian = tree.pids()["custodian"]
    started = time.monotonic()
    os.kill(custodian, signal.SIGSTOP)  # type: ignore[arg-type]  # the call stays in flight
    try:
        from orchestra_sup.client.ctl import CtlClient

        with CtlClient(tree.run_dir) as client:
            client.sock.send(
                client.codec.encode(
                    f.Envelope(
                        v=PROTOCOL_VERSION,
                        id="mid-call",
                        corr=None,
                        sender="ctl",
                        gen=0,
                        ttl_s=55.0,
                        dest_gen=None,
                        body=f.CtlCall(tool="stat", params={"path": "README"}),
                    )
                )
            )
            os.kill(custodian, signal.SIGKILL)  # type: ignore[arg-type]
            assert client.sock.poll(20_000), "no answer"
            reply = client.codec.decode(client.sock.recv())
        assert isinstance(reply.body, f.Error) and reply.body.code is ErrorCode.PEER_DOWN
        assert time.monotonic() - started < 20
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(custodian, signal.SIGCONT)  # type: ignore[arg-type]
    tree.wait_running("custodian", 2)
    value = call(tree, "stat", path="README")
    assert isinstance(value, dict) and value["type"] == "file"


def bench_relay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestra_sup", "bench", "relay", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("spawn", ["fork", "exec"])
def test_the_coordinator_runs_on_uvloop_and_the_others_on_asyncio(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path, spawn: str
) -> None:
    """The relay's waiting side, the coordinator, runs on uvloop; the custodian and the shards
    on asyncio's loop (node.roles.UVLOOP_ROLES, ADR 0001). Each child names the loop it is
    running on when it starts, forked from the template or exec'd alike."""
    config = tmp_path / "spawn.toml"
    config.write_text(f'[supervisor]\nspawn = "{spawn}"\n')
    tree = tree_factory(workspace=repo, shards=1, config=config)
    expected = {"coordinator": "uvloop", "custodian": "asyncio", "shard-0": "asyncio"}

    def said() -> bool:
        log = tree.log()
        return all(f"{name}: event loop {kind}" in log for name, kind in expected.items())

    wait_until(said, 10.0, "every child's event-loop line")
    assert call(tree, "stat", path="README")["type"] == "file"  # type: ignore[index]


def test_bench_relay_emits_well_formed_json() -> None:
    """`bench relay` with tiny counts: a floor, the busy-polling floor, the Python floors, three
    relays (message_lane to a live lane among them), ratios, p99.9 and max, every sample, the
    machine, and how it was measured (the busy-poll window among it)."""
    proc = bench_relay("--iterations", "50", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert set(result["baseline"]) >= {"p50_us", "p99_us", "p999_us", "max_us"}
    assert result["baseline"]["n"] == 50
    busy = result["busy_floor"]
    assert busy["n"] == 50
    assert busy["ratio_p50"] == round(busy["p50_us"] / result["baseline"]["p50_us"], 2)
    assert result["method"]["busy_poll_s"] == CpuSettings().busy_poll_s
    assert set(result["relays"]) == {"stat", "read_file", "message_lane"}
    for stats in result["relays"].values():
        assert stats["p50_us"] > 0 and stats["ratio_p50"] > 0 and stats["ratio_p99"] > 0
        assert stats["p99_us"] <= stats["p999_us"] <= stats["max_us"]
        assert stats["n"] == 50
    assert set(result["python_floors"]) == {"loop_echo", "stat", "read_file"}
    for stats in result["python_floors"].values():
        assert stats["n"] == 50 and stats["ratio_p50"] > 0 and stats["ratio_p99"] > 0
    for tool in ("stat", "read_file"):
        stats = result["relays"][tool]
        python = result["python_floors"][tool]
        assert stats["ratio_p50_python"] == round(stats["p50_us"] / python["p50_us"], 2)
    assert "ratio_p50_python" not in result["relays"]["message_lane"]
    assert result["method"]["iterations"] == 50 and result["method"]["rounds"] >= 1
    samples = result["samples_us"]
    assert set(samples) == {
        "baseline",
        "busy_floor",
        "python_loop_echo",
        "python_stat",
        "python_read_file",
        "stat",
        "read_file",
        "message_lane",
    }
    assert all(len(xs) == 50 for xs in samples.values())
    assert max(samples["stat"]) == result["relays"]["stat"]["max_us"]
    assert_machine_record(result["machine"], held=False)


def test_bench_relay_runs_its_tree_with_the_cpu_config_given(tmp_path: Path) -> None:
    """--cpu-config FILE: the tree runs with that [cpu], and the busy-polling floor polls for
    its window (0: a second blocking floor), both recorded in `method`; a bad value or a file
    that cannot be read is one line naming it, exit 2, before anything starts."""
    off = tmp_path / "off.toml"
    off.write_text("[cpu]\nbusy_poll_s = 0\n")
    proc = bench_relay("--iterations", "20", "--cpu-config", str(off), "--json")
    assert proc.returncode == 0, proc.stderr
    method = json.loads(proc.stdout)["method"]
    assert method["busy_poll_s"] == 0 and method["cpu"] == {"busy_poll_s": 0}
    bad = tmp_path / "bad.toml"
    bad.write_text("[cpu]\nbusy_poll_s = 0.5\n")
    for path, says in [(bad, "busy_poll_s = 0.5: must be between"), (tmp_path / "no", "no")]:
        refused = bench_relay("--iterations", "20", "--cpu-config", str(path))
        assert refused.returncode == 2 and says in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and not refused.stdout


def test_bench_relay_holds_cpu_latency_or_refuses_in_one_line() -> None:
    """--hold-cpu-latency where /dev/cpu_dma_latency is writable (root here): the run holds it
    at 0 and says so; elsewhere one line naming the device, exit 2."""
    proc = bench_relay("--iterations", "20", "--hold-cpu-latency", "--json")
    if cpu_latency_holdable():
        assert proc.returncode == 0, proc.stderr
        assert_machine_record(json.loads(proc.stdout)["machine"], held=True)
    else:
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
        assert "--hold-cpu-latency: cannot hold /dev/cpu_dma_latency: " in proc.stderr


def test_bench_relay_table_has_p999_max_and_the_machine() -> None:
    proc = bench_relay("--iterations", "20")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert all("p99.9 " in line and "max " in line for line in lines[:8])
    assert [line.split(":")[0] for line in lines[1:5]] == [
        f"busy-polling floor ({CpuSettings().busy_poll_s * 1e6:g} us window)",
        "python floor loop_echo",
        "python floor stat",
        "python floor read_file",
    ]
    assert all("x its python floor]" in line and "[p50 " in line for line in lines[5:7])
    assert lines[-1].startswith("machine: ") and "CPUs" in lines[-1] and "steal" in lines[-1]


def test_message_lane_with_one_key_acts_once(tree: Tree, tmp_path: Path) -> None:
    """message_lane delivers into the lane's $ORCHESTRA_INBOX; the same idempotency key sent
    twice is delivered once (the second answer says duplicate); snapshot_lane shows it."""
    seen = tmp_path / "seen"
    cmd = (
        f'while [ ! -s "$ORCHESTRA_INBOX" ]; do sleep 0.05; done; sleep 0.3; '
        f'cat "$ORCHESTRA_INBOX" > {seen}'
    )
    plan_id = tree.submit(plan("talk", task("listener", cmd)))

    def lane() -> str | None:
        report = tree.ctl(f.CtlPlan(id=plan_id))
        assert isinstance(report, f.PlanReport)
        return report.tasks[0].lane if report.tasks[0].status == "running" else None

    lane_id = wait_until(lane, 20, "the lane to run")
    first = call(tree, "message_lane", lane=str(lane_id), text="hello", key="k-1")
    again = call(tree, "message_lane", lane=str(lane_id), text="hello", key="k-1")
    assert first == {"lane": lane_id, "key": "k-1", "delivered": True, "duplicate": False}
    assert again == {"lane": lane_id, "key": "k-1", "delivered": False, "duplicate": True}
    snap = call(tree, "snapshot_lane", lane=str(lane_id))
    assert isinstance(snap, dict)
    assert [r["data"] for r in snap["transcript_tail"]].count("message (k-1): hello") == 1
    report = tree.wait_plan(plan_id, timeout_s=20)
    assert report.ok, report
    assert seen.read_text() == "hello\n"


def test_a_full_shard_refuses_admission_with_a_typed_error(
    tree_factory: Callable[..., Tree], repo: Path
) -> None:
    """A shard at its lane bound answers a LaneStart with shard_full (the coordinator's cue to
    try the next shard); the lane it already hosts is not disturbed."""
    tree = tree_factory(workspace=repo, shards=1, lanes=1)
    plan_id = tree.submit(plan("full", task("busy", "sleep 300")))
    wait_until(lambda: call(tree, "list_lanes")["lanes"], 20, "the lane to run")  # type: ignore[index]
    start = f.LaneStart(lane="extra-1", plan="p", task=f.TaskSpec(id="x", run="true"))
    with RawPeer(tree.run_dir / "shard-0.ipc", b"coordinator.99", "coordinator", 99) as peer:
        reply = peer.ask(start)
    assert isinstance(reply, f.Error) and reply.code is ErrorCode.SHARD_FULL
    report = tree.ctl(f.CtlPlan(id=plan_id))
    assert isinstance(report, f.PlanReport) and report.tasks[0].status == "running"


def test_a_read_is_answered_while_an_ordered_commit_is_still_running(
    tree: Tree, tmp_path: Path
) -> None:
    """On one connection to the custodian: a slow SandboxCommit (ordered work), then a stat read
    sent after it; the read's answer arrives first (reads are served concurrently, off the
    ordered path)."""
    with RawPeer(tree.run_dir / "custodian.ipc", b"shard-9.1", "shard-9") as peer:
        ready = peer.ask(f.SandboxCreate(lane="ordered-1"), "create", timeout_s=60)
        assert isinstance(ready, f.SandboxReady)
        with open(Path(ready.path) / "big.bin", "wb") as fh:  # slow to hash and compress
            for _ in range(48):
                fh.write(os.urandom(1024 * 1024))
        peer.send(f.SandboxCommit(lane="ordered-1", message="big"), "commit", ttl_s=60.0)
        peer.send(f.ToolCall(tool="stat", params={"path": "README"}), "read", ttl_s=60.0)
        order = [peer.receive(60).corr, peer.receive(60).corr]
    assert order == ["read", "commit"]


def test_start_lane_with_one_key_starts_once(tree: Tree, tmp_path: Path) -> None:
    """start_lane places a one-task plan like any other; the same idempotency key sent twice
    answers the same plan and lane and the command runs once."""
    runs = tmp_path / "runs"
    first = call(tree, "start_lane", run=f"echo ran >> {runs}", key="once")
    again = call(tree, "start_lane", run=f"echo ran >> {runs}", key="once")
    assert isinstance(first, dict) and isinstance(again, dict)
    assert first["duplicate"] is False and again["duplicate"] is True
    assert again["plan"] == first["plan"]
    report = tree.wait_plan(str(first["plan"]), timeout_s=20)
    assert report.ok and report.tasks[0].lane is not None
    assert runs.read_text() == "ran\n"

"""Who may steer a real tree (issue 9, ADR 0012): its run directory and sockets are private,
ctl admits only the owner's uid over `ipc://`, and only allowed CURVE keys over `tcp://`."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import msgspec
import pytest
import zmq

from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.version import PROTOCOL_VERSION
from tests.integration.harness import Tree, make_release, wait_until
from tests.integration.test_hitl_ctl import submit_gated
from tests.integration.test_rollover_shard import rollover

pytestmark = pytest.mark.integration

NOBODY = 65534
REPLY_WAIT_MS = 15_000
HARNESS_NOTIFY = "notify.sock"
"""The test's own sd_notify listener, which the harness binds in the run directory."""


def private_modes(run_dir: Path) -> dict[str, int]:
    """Every entry the tree made in `run_dir` -> its permission bits; asserts each is a
    socket or the lock file, and that the directory is 0700."""
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    modes = {}
    for entry in run_dir.iterdir():
        if entry.name == HARNESS_NOTIFY:
            continue
        try:
            st = entry.lstat()
        except FileNotFoundError:  # a retired generation's socket, unlinked since the listing
            continue
        assert stat.S_ISSOCK(st.st_mode) or entry.name == "supervisor.lock", entry
        modes[entry.name] = stat.S_IMODE(st.st_mode)
    return modes


def test_run_dir_is_0700_and_every_socket_in_it_0600(
    tree_factory: Callable[..., Tree], tmp_path: Path
) -> None:
    """Listed on a live tree, then during and after a shard's rollover (whose new generation
    binds `shard-0.2.ipc` beside the old): nothing in the run directory but 0600 files."""
    tree = tree_factory(shards=1)
    modes = private_modes(tree.run_dir)
    assert set(modes) == {
        "supervisor.lock",
        "supervisor.ipc",
        "ctl.ipc",
        "custodian.ipc",
        "coordinator.ipc",
        "shard-0.ipc",
    }
    assert set(modes.values()) == {0o600}, modes
    seen: set[str] = set()

    def check(event: f.RolloverEvent) -> None:
        now = private_modes(tree.run_dir)
        assert set(now.values()) == {0o600}, (event, now)
        seen.update(now)

    release = make_release(tmp_path / "rel", "python")
    report, _ = rollover(tree, "shard-0", release, check)
    assert report.ok, report
    check(f.RolloverEvent(seq=-1, at_s=0.0, child="shard-0", text="done"))
    assert "shard-0.2.ipc" in seen


def ask_as(uid: int, ctl_path: Path) -> tuple[int, str]:
    """Fork a child that drops to `uid` (and its gid, no supplementary groups), sends
    `CtlStatus` to `ctl_path` over a fresh DEALER and reports the reply over a pipe: the
    child's pid and "ok", the `Error` code, or "timeout"."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: pyzmq is imported already; nothing of the parent's is used
        outcome = "crashed"
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            outcome = _status_reply(ctl_path)
        finally:
            os.write(write_end, outcome.encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        outcome = pipe.read().decode()  # EOF when the child exits, whatever it did
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return pid, outcome


def _status_reply(ctl_path: Path) -> str:
    env = f.Envelope(
        v=PROTOCOL_VERSION,
        id="other.1",
        corr=None,
        sender="ctl",
        gen=0,
        ttl_s=10.0,
        dest_gen=None,
        body=f.CtlStatus(),
    )
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(f"ipc://{ctl_path}")
        sock.send(msgspec.msgpack.encode(env))
        if not sock.poll(REPLY_WAIT_MS):
            return "timeout"
        body = Codec().decode(sock.recv()).body
    finally:
        sock.close(linger=0)
        ctx.term()
    if isinstance(body, f.Error):
        return f"{body.code}\n{body.message}"
    return "ok" if isinstance(body, f.StatusReply) else type(body).__name__


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming another uid needs root")
def test_a_client_running_as_another_uid_is_refused(tree_factory: Callable[..., Tree]) -> None:
    """With the walls opened on purpose (run dir 0711, ctl.ipc 0666) so only the uid check
    stands: a process running as nobody gets `Error(forbidden)` naming its uid and pid, the
    refusal is counted; a process of the owner's uid is answered."""
    tree = tree_factory(shards=1)
    os.chmod(tree.run_dir, 0o711)
    os.chmod(tree.run_dir / "ctl.ipc", 0o666)
    pid, outcome = ask_as(NOBODY, tree.run_dir / "ctl.ipc")
    code, _, message = outcome.partition("\n")
    assert code == "forbidden", outcome
    assert f"uid {NOBODY} (pid {pid})" in message
    status = tree.ctl(f.CtlStatus())
    assert isinstance(status, f.StatusReply) and status.ctl_refused == 1
    assert ask_as(os.geteuid(), tree.run_dir / "ctl.ipc")[1] == "ok"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestra_sup", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def refused(tree: Tree) -> int:
    status = tree.ctl(f.CtlStatus())
    assert isinstance(status, f.StatusReply)
    return status.ctl_refused


def test_ctl_over_tcp_needs_an_allowed_curve_key(
    tree_factory: Callable[..., Tree], repo: Path, tmp_path: Path
) -> None:
    """`start --ctl-tcp`: `ctl --connect` with the operator's keys works end to end, and a HITL
    answer over it is recorded as `key:operator`; a plain tcp peer gets no reply and a client
    with another tree's keys is refused at the handshake (one line, exit 3), both counted."""
    keys, other = tmp_path / "keys", tmp_path / "other"
    assert cli("keys", "init", "--dir", str(keys)).returncode == 0
    assert cli("keys", "init", "--dir", str(other)).returncode == 0
    addr = f"tcp://127.0.0.1:{free_port()}"
    tree = tree_factory(
        workspace=repo, shards=1, extra_args=["--ctl-tcp", addr, "--keys", str(keys)]
    )
    remote = ["ctl", "--connect", addr, "--keys", str(keys)]

    done = cli(*remote, "status", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["supervisor"]["pid"] == tree.proc.pid

    ctx = zmq.Context()
    plain = ctx.socket(zmq.DEALER)
    plain.linger = 0
    try:
        plain.connect(addr)
        with suppress(zmq.Again):  # once refused, the pipe is gone and a send would block
            plain.send(b"anything", zmq.NOBLOCK)
        wait_until(lambda: refused(tree) >= 1, 10, "the plain tcp peer to be refused")
        assert not plain.poll(0)
    finally:
        plain.close(linger=0)
        ctx.term()

    before = refused(tree)
    wrong = cli("ctl", "--connect", addr, "--keys", str(other), "status")
    assert wrong.returncode == 3 and "refused the CURVE handshake" in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1 and "Traceback" not in wrong.stderr
    wait_until(lambda: refused(tree) > before, 10, "the wrong key to be counted")
    nobody = f"tcp://127.0.0.1:{free_port()}"  # said at once, not at the deadline
    absent = cli("ctl", "--connect", nobody, "--keys", str(keys), "status", "--timeout", "30")
    assert absent.returncode == 3, absent.stderr
    assert f"nothing accepts connections at {nobody} (connection refused)" in absent.stderr
    assert len(absent.stderr.strip().splitlines()) == 1

    plan_id, entry = submit_gated(tree, tmp_path)
    approved = cli(*remote, "approve", str(entry["lane"]))
    assert approved.returncode == 0, approved.stderr
    (task,) = tree.wait_plan(plan_id).tasks
    assert [(a.responder, a.uid) for a in task.answers] == [("key:operator", -1)]


def test_bad_remote_options_are_one_line(tmp_path: Path) -> None:
    """tcp without keys, a missing keys directory, a non-tcp --ctl-tcp: one line, exit 2."""
    for args in (
        ["ctl", "--connect", "tcp://127.0.0.1:9", "status"],
        ["ctl", "--connect", "tcp://127.0.0.1:9", "--keys", str(tmp_path / "none"), "status"],
        ["start", "--ctl-tcp", "ipc:///tmp/x", "--state-dir", str(tmp_path / "s")],
        ["start", "--ctl-tcp", "tcp://127.0.0.1:9", "--keys", str(tmp_path / "none")],
    ):
        done = cli(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
        assert "Traceback" not in done.stderr


def test_an_oversized_frame_on_ctl_is_answered_too_large(tree: Tree) -> None:
    """Issue 24, defect 4: a raw 17 MB `CtlSubmit` frame (a valid plan, as a client that does
    not know the limit sends it) is answered with a typed `Error(too_large)` that carries its
    id and names the limit, not dropped with its connection; the same connection is served
    next, and the tree counts the frame as refused."""
    tasks = [{"id": f"t{i}", "run": "echo " + "x" * 170_000} for i in range(100)]
    raw = [PROTOCOL_VERSION, "big.1", None, "ctl", 0, 10.0, None]
    frame = msgspec.msgpack.encode(
        [*raw, {"t": "ctl_submit", "plan": {"name": "big", "tasks": tasks}}]
    )
    assert len(frame) > 17_000_000
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(f"ipc://{tree.run_dir / 'ctl.ipc'}")
        sock.send(frame)
        assert sock.poll(REPLY_WAIT_MS), "the oversized frame got no answer"
        reply = Codec().decode(sock.recv())
        sock.send(msgspec.msgpack.encode([*raw[:1], "small.2", *raw[2:], {"t": "ctl_status"}]))
        assert sock.poll(REPLY_WAIT_MS), "the connection is not served after it"
        after = Codec().decode(sock.recv())
    finally:
        sock.close(linger=0)
        ctx.term()
    assert reply.corr == "big.1"
    assert isinstance(reply.body, f.Error), reply.body
    assert reply.body.code == "too_large"
    assert f"{len(frame):,} bytes" in reply.body.message
    assert "16,777,216 bytes" in reply.body.message
    assert after.corr == "small.2" and isinstance(after.body, f.StatusReply)
    assert after.body.bad_frames >= 1

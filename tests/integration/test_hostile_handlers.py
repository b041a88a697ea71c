"""A request can never cost its process (issue 24): hostile input at every role of a live tree
(the supervisor's control and ctl sockets, the coordinator, the custodian's front, each shard).

What it is sent may make decoding, a handler, a task serving the request or the encoding of its
reply fail; the request is then answered (a bad frame `bad_frame`, anything unexpected `internal`
naming the exception's type, counted in `ctl status`), the requests behind it are served, and
every process keeps its pid.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import zmq

from orchestra_sup.errors import ErrorCode, RemoteError
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import Codec
from orchestra_sup.protocol.version import PROTOCOL_VERSION
from tests.integration.harness import Tree, plan, task, wait_until

pytestmark = pytest.mark.integration

REPLY_DEADLINE_S = 15.0
ROLES = ["supervisor", "custodian", "coordinator", "shard-0", "shard-1"]

_codec = Codec()


def _deep_frame(depth: int = 100_000) -> bytes:
    """A well-formed envelope whose `ToolResult` value is `depth` nested one-element arrays
    (100 KB): msgspec cannot decode it without running out of stack (`RecursionError`)."""
    head = msgspec.msgpack.encode(
        [PROTOCOL_VERSION, "deep", None, "hostile", 1, 5.0, None, {"t": "tool_result", "value": 0}]
    )
    return head[:-1] + b"\x91" * depth + b"\xc0"


def _status_frame(msg_id: str) -> bytes:
    return _codec.encode(
        f.Envelope(
            v=PROTOCOL_VERSION,
            id=msg_id,
            corr=None,
            sender="hostile",
            gen=1,
            ttl_s=5.0,
            dest_gen=None,
            body=f.CtlStatus(),
        )
    )


def _endpoints(tree: Tree) -> dict[str, Path]:
    ends = {"supervisor": tree.run_dir / "supervisor.ipc", "ctl": tree.run_dir / "ctl.ipc"}
    for c in tree.status().children:
        ends[c.name] = Path(c.endpoint.removeprefix("ipc://"))
    return ends


def test_a_frame_nested_too_deeply_costs_no_role_anything(tree: Tree) -> None:
    """A frame nested 100,000 deep, followed at once by a request, at every socket of the
    tree: the deep one is answered `bad_frame`, the request behind it is answered, and no
    pid changes. (On main the custodian's front thread died of the RecursionError, taking the
    custodian with it, and every other socket left the request behind it unanswered.)"""
    before = tree.pids()
    ctx = zmq.Context()
    try:
        for name, path in _endpoints(tree).items():
            sock = ctx.socket(zmq.DEALER)
            sock.linger = 0
            sock.setsockopt(zmq.IDENTITY, f"hostile.{time.monotonic_ns()}".encode())
            sock.connect(f"ipc://{path}")
            try:
                sock.send(_deep_frame())
                sock.send(_status_frame(f"{name}.after"))
                bad, answered = _collect(sock, f"{name}.after")
            finally:
                sock.close(linger=0)
            assert bad == [ErrorCode.BAD_FRAME], (name, bad)
            assert answered, f"{name} left the request behind the deep frame unanswered"
    finally:
        ctx.term()
    after = tree.status()
    assert {c.name: c.pid for c in after.children} == before
    assert {c.state for c in after.children} == {"running"}
    assert after.bad_frames >= 2  # the supervisor's control and ctl sockets


def test_a_body_this_release_does_not_know_is_refused_to_its_request(tree: Tree) -> None:
    """A well-formed envelope of a body no role knows (what a newer `ctl` sends an older
    tree) is answered `bad_frame` at every socket, correlated with its id, within the
    deadline: its caller is told at once. (Before, the refusal went out with no `corr`, so
    the ctl client dropped it and reported the tree unreachable after its 10 s timeout.)"""
    head = [PROTOCOL_VERSION, "", None, "newer-ctl", 1, 5.0, None, {"t": "ctl_ping"}]
    ctx = zmq.Context()
    try:
        for name, path in _endpoints(tree).items():
            sock = ctx.socket(zmq.DEALER)
            sock.linger = 0
            sock.connect(f"ipc://{path}")
            try:
                msg_id = f"{name}.ping"
                sock.send(msgspec.msgpack.encode([*head[:1], msg_id, *head[2:]]))
                assert sock.poll(int(REPLY_DEADLINE_S * 1000)), f"{name} did not answer"
                env = _codec.decode(sock.recv())
            finally:
                sock.close(linger=0)
            assert env.corr == msg_id, (name, env)
            assert isinstance(env.body, f.Error) and env.body.code is ErrorCode.BAD_FRAME, name
    finally:
        ctx.term()


def _collect(sock: zmq.Socket, msg_id: str) -> tuple[list[ErrorCode], bool]:
    """Read replies on `sock` until `msg_id` is answered and one uncorrelated Error came, or
    the deadline passes: (codes of the uncorrelated Errors, whether `msg_id` was answered)."""
    bad: list[ErrorCode] = []
    answered = False
    deadline = time.monotonic() + REPLY_DEADLINE_S
    while not (answered and bad):
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0 or not sock.poll(left_ms):
            break
        env = _codec.decode(sock.recv())
        if env.corr is None and isinstance(env.body, f.Error):
            bad.append(env.body.code)
        answered = answered or env.corr == msg_id
    return bad, answered


def test_every_role_answers_a_raising_handler_internal_and_keeps_its_pid(
    tree_factory: Callable[..., Tree], repo: Path
) -> None:
    """A handler that raises, and a task serving a request that raises (the debug hooks
    `raise` and `raise_in_task`), in the supervisor and in every child: each request is
    answered `internal` naming `RuntimeError`, each process counts them (`ctl status`), keeps
    its pid and goes on serving: a read through the relay, a plan."""
    tree = tree_factory(workspace=repo, extra_env={"ORCHESTRA_SUP_DEBUG_HOOKS": "1"})
    before = tree.pids()
    for name in ROLES:
        for action in ("raise", "raise_in_task"):
            with pytest.raises(RemoteError) as info:
                tree.ctl(f.CtlDebug(name=name, action=action))
            assert info.value.code is ErrorCode.INTERNAL, (name, action)
            assert info.value.message.startswith("RuntimeError: debug hook"), info.value.message
    status = tree.status()
    assert {c.name: c.pid for c in status.children} == before
    assert status.internal_errors == 2
    wait_until(
        lambda: all(c.internal_errors == 2 for c in tree.status().children),
        10,
        "every child's heartbeat to count its two internal errors",
    )
    assert tree.call("stat", path="README")["type"] == "file"
    report = tree.wait_plan(tree.submit(plan("after", task("a", "true"))), timeout_s=30)
    assert report.ok, report
    assert tree.pids() == before
    assert "serving CtlDebug failed in its handler" in tree.log()
    assert "serving DebugHook failed in the task serving it" in tree.log()

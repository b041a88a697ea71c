"""`orchestra_sup.runtime.front.Front`: a thread owning a node's ROUTER, over real `ipc://` sockets.

A blocking DEALER plays the peer; the node's side is an `Endpoint(DEALER, routed=True)` on a
loop of the test's own (`asyncio.run`), or no loop at all where the point is that none is needed.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from orchestra_sup.errors import ErrorCode, PathEscape
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.codec import MAX_FRAME_BYTES, Codec
from orchestra_sup.protocol.endpoint import Endpoint
from orchestra_sup.protocol.version import PROTOCOL_VERSION
from orchestra_sup.runtime.front import LOOP_ID, Front
from orchestra_sup.system.cpupolicy import realtime_refusal

INNER = "inproc://node.front"
DEADLINE_MS = 5000
"""Upper bound for a reply that should come promptly; only reached when a test fails."""


class Rig:
    """A front for node `node` generation 1, its loop-side endpoint and a peer's DEALER."""

    def __init__(
        self, tmp_path: Path, crashed: threading.Event | None = None, busy_poll_s: float = 0.0
    ) -> None:
        self.ctx = zmq.Context()
        self.codec = Codec()
        self.served_on: list[int] = []
        self.front = Front(
            self.ctx,
            name="node",
            generation=1,
            serve=self.serve,
            on_crash=(crashed or threading.Event()).set,
            inner=INNER,
            busy_poll_s=busy_poll_s,
        )
        self.inner = Endpoint(
            self.ctx,
            zmq.DEALER,
            name="node",
            generation=1,
            codec=Codec(),
            identity=LOOP_ID.decode(),
            routed=True,
        )
        self.inner.connect(INNER)
        public = f"ipc://{tmp_path / 'node.ipc'}"
        self.front.start(public)
        self.peer = self.ctx.socket(zmq.DEALER)
        self.peer.linger = 0
        self.peer.setsockopt(zmq.IDENTITY, b"coordinator.1")
        self.peer.connect(public)

    def serve(self, env: f.Envelope) -> f.Body | None:
        self.served_on.append(threading.get_ident())
        body = env.body
        if isinstance(body, f.ToolCall) and body.tool == "stat":
            if body.params.get("path", "").startswith(".."):
                raise PathEscape(body.params["path"])
            return f.ToolResult(value={"path": body.params["path"]})
        if isinstance(body, f.ToolCall) and body.tool == "boom":
            raise RuntimeError("a bug in serve")
        if isinstance(body, f.ToolCall) and body.tool == "list_dir":
            # what os.scandir gives for the name b"caf\xe9.txt": msgpack cannot encode it
            return f.ToolResult(value={"entries": [{"name": "caf\udce9.txt"}]})
        if isinstance(body, f.ToolCall) and body.tool == "huge":
            return f.ToolResult(value={"text": "x" * (MAX_FRAME_BYTES + 1)})
        return None

    def send(self, body: f.Body, *, msg_id: str = "c.1.1", dest_gen: int | None = 1) -> None:
        env = f.Envelope(
            v=PROTOCOL_VERSION,
            id=msg_id,
            corr=None,
            sender="coordinator",
            gen=1,
            ttl_s=5.0,
            dest_gen=dest_gen,
            body=body,
        )
        self.peer.send(self.codec.encode(env))

    def recv(self) -> f.Envelope:
        assert self.peer.poll(DEADLINE_MS), "no reply"
        return self.codec.decode(self.peer.recv())

    def close(self) -> None:
        self.front.close()
        self.inner.close()
        self.peer.close()
        self.ctx.term()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.close()


def test_front_answers_on_its_own_thread_without_a_loop(rig: Rig) -> None:
    """A request `serve` takes is answered by the front's thread while no event loop runs at
    all, with the request's id as corr and the node's name and generation as sender."""
    rig.send(f.ToolCall(tool="stat", params={"path": "README"}), msg_id="c.1.7")
    reply = rig.recv()
    assert reply.body == f.ToolResult(value={"path": "README"})
    assert (reply.corr, reply.sender, reply.gen) == ("c.1.7", "node", 1)
    assert rig.served_on and threading.get_ident() not in rig.served_on
    assert (rig.front.answered, rig.front.forwarded) == (1, 0)


def test_serve_errors_are_typed_error_frames(rig: Rig) -> None:
    """A typed error raised by `serve` is its Error frame; a bug is `internal`; both leave the
    front serving."""
    rig.send(f.ToolCall(tool="stat", params={"path": "../x"}))
    escape = rig.recv().body
    assert isinstance(escape, f.Error) and escape.code is ErrorCode.PATH_ESCAPE
    rig.send(f.ToolCall(tool="boom"))
    bug = rig.recv().body
    assert isinstance(bug, f.Error) and bug.code is ErrorCode.INTERNAL
    assert bug.message == "RuntimeError: a bug in serve"
    assert rig.front.internal_errors == 1  # the typed error is not counted
    rig.send(f.ToolCall(tool="stat", params={"path": "a"}))
    assert rig.recv().body == f.ToolResult(value={"path": "a"})


def test_a_reply_that_cannot_be_encoded_is_internal_and_the_front_lives(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """A body `serve` returns that cannot be encoded (a lone surrogate from a file name that is
    not UTF-8) is answered `internal` naming `UnicodeEncodeError`, counted and logged; the
    thread goes on serving (on main it died, and its node with it)."""
    rig.send(f.ToolCall(tool="list_dir"), msg_id="c.1.9")
    reply = rig.recv()
    assert reply.corr == "c.1.9" and isinstance(reply.body, f.Error)
    assert reply.body.code is ErrorCode.INTERNAL
    assert reply.body.message.startswith("UnicodeEncodeError: ")
    assert rig.front.internal_errors == 1
    assert "serving ToolCall failed encoding its ToolResult reply" in caplog.text
    rig.send(f.ToolCall(tool="stat", params={"path": "a"}))
    assert rig.recv().body == f.ToolResult(value={"path": "a"})


def test_an_answer_over_the_frame_limit_is_a_too_large_error(rig: Rig) -> None:
    """An answer `serve` makes that would be over the frame limit is replaced by
    `Error(too_large)` for the same request (the thread neither dies nor goes silent), and
    the front goes on serving."""
    rig.send(f.ToolCall(tool="huge"), msg_id="c.1.9")
    reply = rig.recv()
    assert reply.corr == "c.1.9"
    assert isinstance(reply.body, f.Error) and reply.body.code is ErrorCode.TOO_LARGE
    assert "ToolResult" in reply.body.message
    rig.send(f.ToolCall(tool="stat", params={"path": "README"}))
    assert rig.recv().body == f.ToolResult(value={"path": "README"})


def test_the_rest_reaches_the_loop_and_its_replies_go_back(rig: Rig) -> None:
    """What `serve` leaves (None), a stale generation and an undecodable frame all reach the
    loop's endpoint, which answers them as a ROUTER would: its handler's reply to the right
    peer, `stale_generation` without calling the handler, `bad_frame`."""
    handled: list[tuple[bytes | None, str]] = []

    def handler(ep: Endpoint, peer: bytes | None, env: f.Envelope) -> None:
        handled.append((peer, type(env.body).__name__))
        ep.reply(env, peer, f.Ack())

    async def go() -> list[f.Body]:
        rig.inner.handler = handler
        rig.inner.start()
        rig.send(f.ListLanes())
        rig.send(f.ToolCall(tool="stat", params={"path": "a"}), dest_gen=2)
        rig.peer.send(b"\x00garbage")
        # The blocking peer waits in a worker thread while this loop serves.
        return [(await asyncio.to_thread(rig.recv)).body for _ in range(3)]

    ack, stale, bad = asyncio.run(go())
    assert ack == f.Ack() and handled == [(b"coordinator.1", "ListLanes")]
    assert isinstance(stale, f.Error) and stale.code is ErrorCode.STALE_GENERATION
    assert isinstance(bad, f.Error) and bad.code is ErrorCode.BAD_FRAME
    assert rig.front.forwarded == 3 and rig.inner.bad_frames == 1
    assert len(rig.served_on) == 1  # only the ListLanes was offered to serve


def test_close_ends_the_thread_and_releases_its_sockets(tmp_path: Path) -> None:
    """close() wakes the idle thread, which closes its sockets and exits; the context then
    terminates at once (a socket left open would make term() hang)."""
    r = Rig(tmp_path)
    r.send(f.ToolCall(tool="stat", params={"path": "a"}))
    r.recv()
    r.front.close()
    assert not any(t.name == "node-front" for t in threading.enumerate())
    assert r.front.router.closed
    r.inner.close()
    r.peer.close()
    done = threading.Thread(target=r.ctx.term, daemon=True)
    done.start()
    done.join(DEADLINE_MS / 1000)
    assert not done.is_alive(), "zmq context did not terminate"


def test_a_front_that_dies_says_so(tmp_path: Path) -> None:
    """If the thread fails outside `serve` (here: its socket is closed under it), `on_crash`
    is called so the node can stop instead of going on deaf."""
    crashed = threading.Event()
    r = Rig(tmp_path, crashed)
    r.front.serve = lambda env: r.front.router.close()  # type: ignore[func-returns-value]
    r.send(f.ListLanes())
    assert crashed.wait(DEADLINE_MS / 1000)
    r.close()


def _task(tid: int) -> tuple[str, int]:
    """(state letter, CPU clock ticks used) of this process's thread `tid` (proc(5) stat)."""
    text = Path(f"/proc/self/task/{tid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[11]) + int(fields[12])


def _asleep_within(tid: int, deadline_s: float) -> bool:
    """Whether thread `tid` is seen asleep with its CPU time standing still over 0.2 s
    (20 clock ticks a spinning thread would add) before `deadline_s` seconds pass."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        state, before = _task(tid)
        time.sleep(0.2)
        if state == "S" and _task(tid) == ("S", before):
            return True
    return False


def test_a_busy_polling_front_stays_awake_after_a_frame_then_sleeps(tmp_path: Path) -> None:
    """With `busy_poll_s`, the thread is still running once it has answered (the next request
    finds it awake, not asleep on a halted CPU), and after the window it sleeps in recv: its
    CPU time stops growing. Mutations: the window never ends (still spinning at the deadline);
    no busy polling (seen asleep right after the reply)."""
    r = Rig(tmp_path, busy_poll_s=1.0)
    try:
        tid = r.front._thread.native_id
        assert tid is not None
        r.send(f.ToolCall(tool="stat", params={"path": "a"}))
        assert r.recv().body == f.ToolResult(value={"path": "a"})
        assert "R" in {_task(tid)[0] for _ in range(20)}, "asleep right after its answer"
        assert _asleep_within(tid, deadline_s=10.0), "still spinning after its window"
    finally:
        r.close()


@pytest.mark.skipif(realtime_refusal(1) is not None, reason="SCHED_FIFO is refused here")
@pytest.mark.parametrize("flags", [0, os.SCHED_RESET_ON_FORK], ids=["fifo", "fifo-reset-on-fork"])
def test_a_real_time_front_never_busy_polls(tmp_path: Path, flags: int) -> None:
    """A front thread put in SCHED_FIFO from outside (as `chrt` would, with `-R` or without,
    the reset-on-fork flag the tree's own real-time threads carry), even in the middle of a
    window, sleeps in recv at once: a spinning real-time thread keeps its CPU from every thread
    below it. Mutations: the class is not read (it spins out its 30 s window); the class read
    with the flag left on and checked against FIFO and RR, as at first (the reset-on-fork case
    spins)."""
    r = Rig(tmp_path, busy_poll_s=30.0)
    try:
        tid = r.front._thread.native_id
        assert tid is not None
        os.sched_setscheduler(tid, os.SCHED_FIFO | flags, os.sched_param(1))
        r.send(f.ToolCall(tool="stat", params={"path": "a"}))
        assert r.recv().body == f.ToolResult(value={"path": "a"})
        assert _asleep_within(tid, deadline_s=5.0), "a real-time front busy-polled"
    finally:
        r.close()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to narrow to one")
def test_a_front_pinned_to_one_cpu_never_busy_polls(tmp_path: Path) -> None:
    """A front thread pinned to one CPU from outside (`taskset`, systemd's `CPUAffinity=`: what
    `role_plans` cannot see) sleeps in recv at once after its answer: there the peer it waits
    for could only run while it yields. Mutation: the affinity is not read (it spins out its
    30 s window)."""
    r = Rig(tmp_path, busy_poll_s=30.0)
    try:
        tid = r.front._thread.native_id
        assert tid is not None
        os.sched_setaffinity(tid, {min(os.sched_getaffinity(0))})
        r.send(f.ToolCall(tool="stat", params={"path": "a"}))
        assert r.recv().body == f.ToolResult(value={"path": "a"})
        assert _asleep_within(tid, deadline_s=5.0), "a front on one CPU busy-polled"
    finally:
        r.close()


def test_a_front_that_passed_a_frame_to_the_loop_sleeps_at_once(tmp_path: Path) -> None:
    """After a frame it passes to the loop (here to a loop that is not even running), the front
    blocks without a window: the loop's reply comes after the loop's work, which a spinning
    front would only slow. Mutation: a window after every frame (it spins out its 30 s)."""
    r = Rig(tmp_path, busy_poll_s=30.0)
    try:
        tid = r.front._thread.native_id
        assert tid is not None
        r.send(f.ListLanes())
        wait = time.monotonic() + DEADLINE_MS / 1000
        while r.front.forwarded == 0 and time.monotonic() < wait:
            time.sleep(0.01)
        assert r.front.forwarded == 1
        assert _asleep_within(tid, deadline_s=5.0), "the front busy-polled after a forward"
    finally:
        r.close()

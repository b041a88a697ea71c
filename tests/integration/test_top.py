"""`ctl top` on a real tree: one frame (text, JSON, piped), the JSON stream across the tree going
away, and the interactive view under a real pseudo-terminal quitting on q and Ctrl-C with the
terminal's mode given back."""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest

from orchestra_sup.protocol import frames as f
from tests.integration.harness import Tree, plan, task, wait_until

pytestmark = pytest.mark.integration

DEADLINE_S = 20.0
"""How long a step (a frame, an exit) may take before the test fails as hung."""


def ctl_top(tree: Tree, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(tree.run_dir)]
    return subprocess.run(
        [*argv, "top", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_one_frame_text_json_and_piped(tree: Tree) -> None:
    """--once prints every child and the running lane; --json --once one JSON line with the
    shapes of status and lanes; piped without --once, one frame too."""
    plan_id = tree.submit(plan("p", task("slow", "sleep 300")))

    def running_lane() -> str | None:
        reply = tree.ctl(f.CtlLanes())
        assert isinstance(reply, f.LaneList)
        return next((lane.lane for lane in reply.lanes if lane.state == "running"), None)

    lane = wait_until(running_lane, DEADLINE_S, "the lane to run")
    pids = tree.pids()

    text = ctl_top(tree, "--once")
    assert text.returncode == 0, text.stderr
    assert f"supervisor pid {tree.proc.pid}" in text.stdout
    for name, pid in pids.items():
        assert any(
            ln.startswith(f"{name} ") and f" {pid} " in ln for ln in text.stdout.splitlines()
        )
    assert lane in text.stdout and plan_id in text.stdout

    one = ctl_top(tree, "--once", "--json")
    assert one.returncode == 0, one.stderr
    (line,) = one.stdout.splitlines()
    frame = json.loads(line)
    assert frame["error"] is None
    assert frame["status"]["supervisor"]["pid"] == tree.proc.pid
    assert {c["name"]: c["pid"] for c in frame["status"]["children"]} == pids
    assert [x["lane"] for x in frame["lanes"]["lanes"]] == [lane]

    piped = ctl_top(tree)  # stdout is a pipe: one frame, no screen control
    assert piped.returncode == 0, piped.stderr
    assert f"supervisor pid {tree.proc.pid}" in piped.stdout
    assert "\x1b[?1049h" not in piped.stdout  # no alternate screen


class Lines:
    """Lines from a child's stdout pipe, each read under a deadline."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.buf = b""

    def next(self) -> dict:
        deadline = time.monotonic() + DEADLINE_S
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            assert left > 0, "no line from ctl top --json"
            if select.select([self.fd], [], [], left)[0]:
                chunk = os.read(self.fd, 65536)
                assert chunk, "ctl top --json closed its output"
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


def test_json_stream_outlives_the_tree_and_quits_on_sigint(tree: Tree) -> None:
    """--json streams a frame per refresh; when the tree goes away it keeps going with lines
    that carry the error (and no stale status); SIGINT ends it with exit 0."""
    argv = [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(tree.run_dir)]
    argv += ["top", "--json", "--interval", "0.2", "--timeout", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        lines = Lines(proc)
        for _ in range(2):
            frame = lines.next()
            assert frame["error"] is None and frame["status"]["supervisor"]["pid"] == tree.proc.pid
        assert tree.stop() == 0
        while (frame := lines.next())["error"] is None:
            pass
        assert frame["status"] is None and frame["lanes"] is None
        assert str(tree.run_dir) in frame["error"]
        assert lines.next()["error"] is not None  # still refreshing, not exited
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=DEADLINE_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def read_until(master: int, needle: bytes, proc: subprocess.Popen[bytes]) -> bytes:
    """Read the pty until `needle` has appeared; fail after DEADLINE_S or if the view exits."""
    seen = b""
    deadline = time.monotonic() + DEADLINE_S
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {needle!r} on the terminal; got {seen[-2000:]!r}"
        assert proc.poll() is None, f"ctl top exited {proc.returncode}: {seen[-2000:]!r}"
        if select.select([master], [], [], min(left, 0.2))[0]:
            seen += os.read(master, 65536)
    return seen


def wait_exit(master: int, proc: subprocess.Popen[bytes]) -> int:
    """Drain the pty (so the view is never blocked writing to it) until the process exits."""
    deadline = time.monotonic() + DEADLINE_S
    while proc.poll() is None:
        left = deadline - time.monotonic()
        assert left > 0, "ctl top did not exit"
        if select.select([master], [], [], min(left, 0.1))[0]:
            os.read(master, 65536)
    return proc.returncode


def own_terminal() -> None:
    """In the child, after setsid: make stdin (the pty) the controlling terminal, so Ctrl-C typed
    on it raises SIGINT in the foreground process group as at a real terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@pytest.mark.parametrize(
    "quit_by", ["q", "ctrl-c typed", "sigint"], ids=["q", "ctrl-c-typed", "sigint"]
)
def test_interactive_view_quits_and_restores_the_terminal(tree: Tree, quit_by: str) -> None:
    """Under a pseudo-terminal: a frame is drawn, the terminal is in cbreak while the view runs,
    and q, Ctrl-C typed, or SIGINT sent end it with exit 0 and the terminal's attributes as
    they were before."""
    master, slave = os.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
        before = termios.tcgetattr(slave)
        argv = [sys.executable, "-m", "orchestra_sup", "ctl", "--run-dir", str(tree.run_dir)]
        proc = subprocess.Popen(
            [*argv, "top", "--interval", "0.2"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=own_terminal,
            env={**os.environ, "TERM": "xterm-256color"},
        )
        try:
            read_until(master, b"Ctrl-C quits", proc)
            during = termios.tcgetattr(slave)
            assert not during[3] & termios.ICANON and not during[3] & termios.ECHO
            assert during[3] & termios.ISIG  # Ctrl-C still a signal
            shard = read_until(master, b"shard-1", proc)  # a refresh with the children
            assert shard
            if quit_by == "q":
                os.write(master, b"q")
            elif quit_by == "ctrl-c typed":
                os.write(master, b"\x03")
            else:
                proc.send_signal(signal.SIGINT)
            assert wait_exit(master, proc) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert termios.tcgetattr(slave) == before
    finally:
        os.close(master)
        os.close(slave)

"""Run one shell command for a lane, with its whole process group bounded by the lane's life.

`run_shell` starts `/bin/sh -c COMMAND` as the leader of a new process group, drains stdout and
stderr as the data comes (a command printing hundreds of MB never stalls and never grows memory:
only the last `tail_bytes` are kept), and guarantees that when it returns or raises nothing of
the group is left: the group is sent SIGKILL after the leader exits, on timeout and on
cancellation, and the leader is always reaped (no zombie).

Why `loop.subprocess_exec` with an own protocol rather than `asyncio.create_subprocess_exec`:
on 3.11 `Process.wait()` resolves only once the leader has exited *and* every pipe has reached
EOF, so a background child still holding stdout (`sleep 100 &`) would keep it waiting. The
protocol's `process_exited` tells us when the leader is reaped, independently of the pipes; the
pipes are consumed in its `pipe_data_received` callback, so they are always drained.

Child watching on Python 3.11: `install_child_watcher` puts an `asyncio.PidfdChildWatcher` on the
event-loop policy (no helper thread per child, no SIGCHLD handler) when the kernel supports
pidfds; on Python >= 3.12 the event loop does this itself and the helper is a no-op. The
supervised processes of orchestra-sup run one event loop each, which is what the 3.11 pidfd
watcher supports.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal as _signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

__all__ = ["ShellOutcome", "install_child_watcher", "run_shell"]

_CHUNK = 64 * 1024
"""Largest chunk handed to `on_output` (bytes); bigger reads are split."""

_cleanups: set[asyncio.Future[float]] = set()
"""Clean-ups in flight, held so that one outliving a cancelled caller is not garbage-collected."""


class ShellOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How one command ended.

    - `exit_code`: the command's exit status, or None when a signal ended it.
    - `signal`: the signal number that ended the command (e.g. 9 after a timeout), or None.
    - `timed_out`: the command ran past `timeout_s` and its group was killed.
    - `cancelled`: the lane was cancelled. `run_shell` itself never returns True here (it re-raises
      `CancelledError`, the asyncio convention); callers that record a cancelled lane set it.
    - `duration_s`: wall seconds from spawn to the end of the command (`time.monotonic`).
    - `output_tail`: the last `tail_bytes` of stdout and stderr together, in arrival order, decoded
      as UTF-8 with errors="replace" (a character cut at the start of the tail is dropped).
    - `output_bytes`: the total number of bytes the command wrote on both streams.
    """

    exit_code: int | None
    signal: int | None
    timed_out: bool
    cancelled: bool
    duration_s: float
    output_tail: str
    output_bytes: int


@functools.cache
def _pidfd_supported() -> bool:
    """Whether this kernel and Python offer `os.pidfd_open` (Linux >= 5.3)."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        fd = os.pidfd_open(os.getpid())
    except OSError:
        return False
    os.close(fd)
    return True


def install_child_watcher() -> None:
    """Make the running loop watch its children with pidfds (Python 3.11 only; else a no-op).

    Must be called from a coroutine. Installs an `asyncio.PidfdChildWatcher` on the policy and
    attaches it to the running loop, unless one is already active. Does nothing on Python >= 3.12
    (the loop uses pidfds itself), on a kernel without pidfds, or off the main thread (the policy's
    default thread-based watcher, which works from any thread, is left in place). Safe to call
    any number of times.
    """
    if sys.version_info >= (3, 12) or not _pidfd_supported():
        return
    if threading.current_thread() is not threading.main_thread():
        return
    loop = asyncio.get_running_loop()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        policy = asyncio.get_event_loop_policy()
        watcher = policy.get_child_watcher()
        if isinstance(watcher, asyncio.PidfdChildWatcher):
            if not watcher.is_active():
                watcher.attach_loop(loop)
            return
        pidfd_watcher = asyncio.PidfdChildWatcher()
        policy.set_child_watcher(pidfd_watcher)
        pidfd_watcher.attach_loop(loop)


def _killpg(pgid: int) -> None:
    """SIGKILL every process of group `pgid`.

    An empty group is not an error, nor is a group whose only members we may not signal (e.g. a
    setuid program): there is nothing more this process can do about those.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, _signal.SIGKILL)


class _Tail:
    """Byte count and bounded tail of the combined output (never more than `limit` bytes)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.total = 0
        self.buf = bytearray()

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.limit == 0:
            return
        if len(chunk) >= self.limit:
            self.buf[:] = chunk[-self.limit :]
            return
        self.buf += chunk
        excess = len(self.buf) - self.limit
        if excess > 0:
            del self.buf[:excess]

    def text(self) -> str:
        data = bytes(self.buf)
        if self.total > len(data):
            # The tail may start inside a multi-byte character: drop its continuation bytes.
            skip = 0
            while skip < min(3, len(data)) and 0x80 <= data[skip] <= 0xBF:
                skip += 1
            data = data[skip:]
        return data.decode("utf-8", errors="replace")


class _LaneProtocol(asyncio.SubprocessProtocol):
    """Consumes the command's pipes as data arrives and signals the leader's exit.

    Data is handled synchronously in the loop's read callback (no buffering beyond the tail), so
    the pipes are always drained and memory stays bounded whatever the command prints.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        tail: _Tail,
        on_output: Callable[[str, bytes], None] | None,
    ):
        self.tail = tail
        self.on_output = on_output
        self.pgid = 0
        self.exited: asyncio.Future[None] = loop.create_future()
        self.eof: dict[int, asyncio.Future[None]] = {
            1: loop.create_future(),
            2: loop.create_future(),
        }
        self.error: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self.pgid = transport.get_pid()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.tail.add(data)
        if self.on_output is None or self.error is not None:
            return
        name = "stdout" if fd == 1 else "stderr"
        try:
            for start in range(0, len(data), _CHUNK):
                self.on_output(name, data[start : start + _CHUNK])
        except Exception as exc:
            # Stop the command (so run_shell can report this instead of waiting for it).
            self.error = exc
            _killpg(self.pgid)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        waiter = self.eof.get(fd)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def process_exited(self) -> None:
        # Called once the child watcher has reaped the leader, even if a pipe is still open.
        if not self.exited.done():
            self.exited.set_result(None)


async def _finish(
    transport: asyncio.SubprocessTransport,
    protocol: _LaneProtocol,
    eof_grace_s: float,
    on_stop: Callable[[], None] | None,
) -> float:
    """Kill the group (and call `on_stop`), await the leader's reaping, give the pipes
    `eof_grace_s` to reach EOF, then close them. Returns the `time.monotonic()` at which the
    leader was seen reaped."""
    pgid = transport.get_pid()
    _killpg(pgid)
    if on_stop is not None:
        on_stop()
    await protocol.exited
    reaped = time.monotonic()
    # Killing the group again after the leader is reaped catches anything it forked meanwhile.
    _killpg(pgid)
    # A process that left the group (setsid) may still hold a pipe: stop reading after the grace.
    await asyncio.wait(protocol.eof.values(), timeout=eof_grace_s)
    transport.close()
    await asyncio.sleep(0)  # let the pipe transports run their connection_lost callbacks
    return reaped


async def run_shell(
    command: str,
    *,
    cwd: Path,
    env: dict[str, str],
    timeout_s: float | None,
    on_output: Callable[[str, bytes], None] | None = None,
    tail_bytes: int = 4096,
    kill_grace_s: float = 2.0,
    preexec: Callable[[], None] | None = None,
    on_spawn: Callable[[int], None] | None = None,
    on_stop: Callable[[], None] | None = None,
    nice: int = 0,
    wrap: Sequence[str] = (),
) -> ShellOutcome:
    """Run `/bin/sh -c command` in `cwd` and report how it ended.

    - `env` is the command's whole environment (it replaces `os.environ`; merge it yourself).
    - `timeout_s`: wall seconds the command may run (None: no limit). On expiry the whole process
      group gets SIGKILL and the outcome has `timed_out=True`, `exit_code=None`, `signal=9`.
    - `on_output(stream, chunk)` is called with "stdout" or "stderr" and each chunk (at most
      64 KiB) as it arrives, on the event loop; it must not block.
    - `tail_bytes`: how many bytes of combined output to keep for `output_tail` (>= 0).
    - `kill_grace_s`: seconds the pipes are given to reach end-of-file once the leader has exited
      and its group has been killed, before they are closed. A process that left the group (e.g.
      via `setsid`) and still holds a pipe is not waited for beyond this, nor killed; its
      remaining output is not read.
    - `on_spawn`: called with the leader's pid (= its process group id) once it runs, so the
      caller can signal the group itself (a graceful SIGTERM on stop; SIGKILL stays ours).
    - `on_stop`: called on the loop the moment the group is sent SIGKILL (the leader exited,
      `timeout_s` passed, the call was cancelled or `on_output` raised), before the pipes are
      given `kill_grace_s`: e.g. to kill what left the group (`LaneCgroups.kill_now`), which
      would otherwise run on through the grace. It must not block or raise.
    - `preexec`: called in the child between fork and exec (Popen's `preexec_fn`), after the
      pipes and the process group are set up, e.g. to join a cgroup
      (`system.lanecgroups.LaneCgroups.join_fn`). It must only make plain `os` calls (no locks, no
      logging: other threads' locks may be held forever in the child). None: nothing is called.
    - `nice`: added to the command's niceness before exec (0..19, default 0), after `preexec`,
      so everything the command runs competes for the CPU at that lower priority.
    - `wrap`: an argv prefix that runs the shell, e.g. a bubblewrap invocation ending in "--"
      (`system.isolation.bwrap_argv`); it is the group's leader then, and must keep the shell
      in its process group (no `setsid`). Empty (default): the shell is the leader itself.

    The command is the leader of its own process group, with stdin from /dev/null. When the
    leader exits, the rest of its group (background children such as `sleep 100 &`) is killed
    with SIGKILL, so nothing the command started in its group outlives the call.

    Raises:
        ValueError: `timeout_s` is not positive, `tail_bytes` / `kill_grace_s` is negative, or
            `nice` is outside 0..19.
        OSError: the command could not be spawned (e.g. `cwd` does not exist).
        subprocess.SubprocessError: `preexec` raised in the child (the command did not run).
        asyncio.CancelledError: the calling task was cancelled; the group has been killed and the
            leader reaped before it is re-raised.
        Exception: whatever `on_output` raised; the group has been killed and the leader reaped.
    """
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    if tail_bytes < 0:
        raise ValueError(f"tail_bytes must be >= 0, got {tail_bytes!r}")
    if kill_grace_s < 0:
        raise ValueError(f"kill_grace_s must be >= 0, got {kill_grace_s!r}")
    if not 0 <= nice <= 19:
        raise ValueError(f"nice must be between 0 and 19, got {nice!r}")
    install_child_watcher()

    loop = asyncio.get_running_loop()
    tail = _Tail(tail_bytes)
    started = time.monotonic()
    transport, protocol = await loop.subprocess_exec(
        lambda: _LaneProtocol(loop, tail, on_output),
        *wrap,
        "/bin/sh",
        "-c",
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        process_group=0,
        preexec_fn=_in_child(preexec, nice),
    )
    deadline_hit = False
    try:
        if on_spawn is not None:
            on_spawn(transport.get_pid())
        done, _ = await asyncio.wait([protocol.exited], timeout=timeout_s)
        deadline_hit = not done
    finally:
        # Every way out (normal exit, timeout, cancellation, error) kills the group and reaps the
        # leader; shielded so that a second cancellation cannot leave a zombie behind.
        finish = asyncio.ensure_future(_finish(transport, protocol, kill_grace_s, on_stop))
        _cleanups.add(finish)
        finish.add_done_callback(_cleanups.discard)
        await asyncio.shield(finish)
    ended = finish.result()

    if protocol.error is not None:
        raise protocol.error

    returncode = transport.get_returncode()
    assert returncode is not None
    return ShellOutcome(
        exit_code=returncode if returncode >= 0 else None,
        signal=-returncode if returncode < 0 else None,
        # A leader that exited on its own in the instant the deadline passed did not time out.
        timed_out=deadline_hit and returncode == -_signal.SIGKILL,
        cancelled=False,
        duration_s=ended - started,
        output_tail=tail.text(),
        output_bytes=tail.total,
    )


def _in_child(preexec: Callable[[], None] | None, nice: int) -> Callable[[], None] | None:
    """What runs between fork and exec: `preexec`, then the niceness increment (only `os`
    calls: see `run_shell`)."""
    if not nice:
        return preexec

    def run() -> None:
        if preexec is not None:
            preexec()
        os.nice(nice)  # an increment: never refused

    return run

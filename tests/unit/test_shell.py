"""Tests for `orchestra_sup.shards.shell.run_shell`, against real /bin/sh subprocesses."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from orchestra_sup.shards.shell import ShellOutcome, install_child_watcher, run_shell
from tests.procs import dead as _dead

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}


def _run(command: str, cwd: Path, **kwargs: object) -> ShellOutcome:
    """Run `command` to completion on a fresh event loop."""
    kwargs.setdefault("timeout_s", 30.0)
    return asyncio.run(run_shell(command, cwd=cwd, env=ENV, **kwargs))  # type: ignore[arg-type]


def _reaped(pid: int) -> bool:
    """Whether our child `pid` has been waited for (no zombie left behind)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def _kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _ready_watcher(marker: bytes) -> tuple[asyncio.Event, Callable[[str, bytes], None]]:
    """An event set once `marker` appears on stdout, and the `on_output` callback that sets it."""
    event = asyncio.Event()
    seen = bytearray()

    def on_output(stream: str, chunk: bytes) -> None:
        if stream == "stdout":
            seen.extend(chunk)
            if marker in seen:
                event.set()

    return event, on_output


def test_exit_code_zero_and_nonzero(tmp_path: Path) -> None:
    """The command's exit status comes back as exit_code, with no signal and no timeout."""
    ok = _run("true", tmp_path)
    assert (ok.exit_code, ok.signal, ok.timed_out, ok.cancelled) == (0, None, False, False)
    failed = _run("exit 3", tmp_path)
    assert (failed.exit_code, failed.signal, failed.timed_out) == (3, None, False)
    assert failed.duration_s >= 0


def test_killed_by_signal_reports_signal(tmp_path: Path) -> None:
    """A command ended by a signal has exit_code None and the signal number."""
    out = _run("kill -TERM $$", tmp_path)
    assert out.exit_code is None
    assert out.signal == signal.SIGTERM
    assert not out.timed_out


def test_stdout_and_stderr_both_in_tail_and_callback(tmp_path: Path) -> None:
    """Both streams land in output_tail and reach on_output under their own names."""
    seen: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

    def on_output(stream: str, chunk: bytes) -> None:
        seen[stream].extend(chunk)

    out = _run("echo to-out; echo to-err >&2; echo more-out", tmp_path, on_output=on_output)
    assert out.exit_code == 0
    assert "to-out" in out.output_tail and "to-err" in out.output_tail
    assert out.output_tail.index("to-out") < out.output_tail.index("more-out")
    assert bytes(seen["stdout"]) == b"to-out\nmore-out\n"
    assert bytes(seen["stderr"]) == b"to-err\n"
    assert out.output_bytes == len(b"to-out\nto-err\nmore-out\n")


def test_cwd_env_and_stdin(tmp_path: Path) -> None:
    """The command runs in cwd with exactly env, and stdin is /dev/null (reads hit EOF)."""
    out = _run('pwd; echo "foo=$FOO home=${HOME-unset}"; cat; echo done', tmp_path)
    assert out.exit_code == 0
    lines = out.output_tail.splitlines()
    assert Path(lines[0]).resolve() == tmp_path.resolve()
    assert lines[1:] == ["foo= home=unset", "done"]
    env_out = asyncio.run(
        run_shell('echo "$FOO"', cwd=tmp_path, env={**ENV, "FOO": "bar"}, timeout_s=30)
    )
    assert env_out.output_tail == "bar\n"


def test_fifty_megabytes_finish_with_bounded_tail(tmp_path: Path) -> None:
    """50 MB of output drains without stalling; the byte count is exact and the tail bounded."""
    size = 50 * 1024 * 1024
    chunk_sizes: list[int] = []
    out = _run(
        f"head -c {size} /dev/zero | tr '\\000' x; printf END",
        tmp_path,
        tail_bytes=1000,
        on_output=lambda _stream, chunk: chunk_sizes.append(len(chunk)),
    )
    assert out.exit_code == 0
    assert out.output_bytes == size + 3
    assert sum(chunk_sizes) == size + 3
    assert max(chunk_sizes) <= 64 * 1024
    assert len(out.output_tail) <= 1000
    assert out.output_tail == "x" * 997 + "END"


def test_tail_keeps_last_bytes_in_order(tmp_path: Path) -> None:
    """output_tail is exactly the last tail_bytes of the output."""
    out = _run("seq 1 20000", tmp_path, tail_bytes=64)
    expected = "".join(f"{i}\n" for i in range(1, 20001))
    assert out.output_bytes == len(expected)
    assert out.output_tail == expected[-64:]
    nothing = _run("seq 1 10", tmp_path, tail_bytes=0)
    assert nothing.output_tail == "" and nothing.output_bytes == len(
        "".join(f"{i}\n" for i in range(1, 11))
    )


def test_tail_cut_inside_utf8_character_is_clean(tmp_path: Path) -> None:
    """A tail that starts inside a multi-byte character drops the fragment, no U+FFFD."""
    out = _run(
        "i=0; while [ $i -lt 100 ]; do printf '\\303\\251'; i=$((i+1)); done",
        tmp_path,
        tail_bytes=7,
    )
    assert out.output_bytes == 200
    assert out.output_tail == "\u00e9" * 3


def test_timeout_kills_whole_group(tmp_path: Path) -> None:
    """On timeout the whole group dies, a backgrounded child included, and timed_out is set."""
    pidfile = tmp_path / "pids"
    out = _run(f'sleep 100 & echo "$$ $!" > {pidfile}; wait', tmp_path, timeout_s=1.0)
    leader, background = map(int, pidfile.read_text().split())
    try:
        assert out.timed_out
        assert out.exit_code is None
        assert out.signal == signal.SIGKILL
        assert 1.0 <= out.duration_s < 20
        assert _dead(background), "background sleep outlived the timed-out lane"
        assert _reaped(leader)
    finally:
        _kill_quietly(background)


def test_cancel_kills_group_and_reraises(tmp_path: Path) -> None:
    """Cancelling the caller kills the group, reaps the leader and re-raises CancelledError."""
    pidfile = tmp_path / "pids"

    async def main() -> tuple[int, int]:
        ready, on_output = _ready_watcher(b"ready")
        task = asyncio.create_task(
            run_shell(
                f'sleep 100 & echo "$$ $!" > {pidfile}; echo ready; wait',
                cwd=tmp_path,
                env=ENV,
                timeout_s=None,
                on_output=on_output,
            )
        )
        await asyncio.wait_for(ready.wait(), 20)
        leader, background = map(int, pidfile.read_text().split())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return leader, background

    leader, background = asyncio.run(main())
    try:
        assert _reaped(leader), "leader left as a zombie"
        assert _dead(background), "background sleep outlived the cancelled lane"
    finally:
        _kill_quietly(background)


def test_background_child_holding_stdout_does_not_hang(tmp_path: Path) -> None:
    """A `sleep 100 &` left holding the pipes is killed when the leader exits; no hang."""
    pidfile = tmp_path / "pids"
    out = _run(f'sleep 100 & echo "$$ $!" > {pidfile}; echo started', tmp_path)
    leader, background = map(int, pidfile.read_text().split())
    try:
        assert out.exit_code == 0
        assert out.output_tail == "started\n"
        assert out.duration_s < 20
        assert _dead(background)
        assert _reaped(leader)
    finally:
        _kill_quietly(background)


def test_escaped_child_holding_pipe_is_abandoned_after_grace(tmp_path: Path) -> None:
    """A child that left the group (setsid) and holds stdout stops being read after the grace."""
    pidfile = tmp_path / "pid"
    fifo = tmp_path / "escaped"
    os.mkfifo(fifo)
    began = time.monotonic()
    # The leader waits (on the fifo) until the child has left the group before it exits.
    out = _run(
        f"setsid sh -c 'echo $$ > {fifo}; exec sleep 100' & read pid < {fifo}; "
        f"echo $pid > {pidfile}; echo started",
        tmp_path,
        kill_grace_s=0.2,
    )
    elapsed = time.monotonic() - began
    escaped = int(pidfile.read_text())
    try:
        assert not _dead(escaped, timeout_s=0), "setup: the escaped child must still hold stdout"
        assert out.exit_code == 0
        assert out.output_tail == "started\n"
        assert elapsed < 10
    finally:
        _kill_quietly(escaped)


def test_on_output_error_kills_group_and_propagates(tmp_path: Path) -> None:
    """An exception from on_output kills the command's group and propagates out of run_shell."""
    pidfile = tmp_path / "pids"

    def on_output(_stream: str, chunk: bytes) -> None:
        if b"boom" in chunk:
            raise RuntimeError("callback failed")

    with pytest.raises(RuntimeError, match="callback failed"):
        _run(f'echo "$$" > {pidfile}; echo boom; exec sleep 100', tmp_path, on_output=on_output)
    assert _reaped(int(pidfile.read_text()))


def test_invalid_arguments_and_spawn_failure(tmp_path: Path) -> None:
    """Bad timeout/tail/grace values raise ValueError; a missing cwd raises OSError."""
    with pytest.raises(ValueError, match="timeout_s"):
        _run("true", tmp_path, timeout_s=0)
    with pytest.raises(ValueError, match="tail_bytes"):
        _run("true", tmp_path, tail_bytes=-1)
    with pytest.raises(ValueError, match="kill_grace_s"):
        _run("true", tmp_path, kill_grace_s=-1)
    with pytest.raises(FileNotFoundError):
        _run("true", tmp_path / "missing")


def test_no_children_left_after_many_runs(tmp_path: Path) -> None:
    """Repeated runs on one loop leave no child process behind (everything is reaped)."""

    # Compare with what was there before: in a session that also runs the integration tests,
    # this process is a subreaper and may hold other tests' orphans.
    before = {p.pid for p in psutil.Process().children()}

    async def main() -> None:
        install_child_watcher()
        install_child_watcher()
        outs = await asyncio.gather(
            *(run_shell(f"exit {i}", cwd=tmp_path, env=ENV, timeout_s=30) for i in range(10))
        )
        assert [o.exit_code for o in outs] == list(range(10))

    asyncio.run(main())
    assert [p for p in psutil.Process().children() if p.pid not in before] == []


def _niceness_of(output: str) -> int:
    """Field 19 of /proc/<pid>/stat (after the parenthesised command name) is the niceness."""
    return int(output.rsplit(")", 1)[1].split()[16])


@pytest.mark.parametrize("nice", [0, 7, 19])
def test_nice_lowers_the_commands_priority(tmp_path: Path, nice: int) -> None:
    """The command (and what it runs) gets the niceness added, after `preexec` ran."""
    marker = tmp_path / "preexec-ran"
    out = _run(
        "cat /proc/self/stat",
        tmp_path,
        nice=nice,
        preexec=lambda: os.close(os.open(marker, os.O_CREAT | os.O_WRONLY)),
    )
    assert _niceness_of(out.output_tail) == min(19, os.nice(0) + nice)
    assert marker.exists()


@pytest.mark.parametrize("nice", [-1, 20])
def test_nice_out_of_range_is_refused(tmp_path: Path, nice: int) -> None:
    with pytest.raises(ValueError, match="nice must be between 0 and 19"):
        _run("true", tmp_path, nice=nice)

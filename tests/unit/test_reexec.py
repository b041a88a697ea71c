"""The pieces of a supervisor's re-exec (`supervisor.reexec`) that need no tree: the hand-off, the
directory locks taken over, a child's process held again (real processes, no SIGCHLD handler:
its pidfd is the only way its exit is seen), and a failed new image stopping what it inherited."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import psutil
import pytest

from orchestra_sup.config import Settings, ShardSettings
from orchestra_sup.errors import ConfigError, DirBusy, SupervisionError
from orchestra_sup.logformat import LogFormat
from orchestra_sup.protocol.childargs import ChildArgs
from orchestra_sup.protocol.frames import ExitInfo
from orchestra_sup.supervisor.core import Flags, Worker
from orchestra_sup.supervisor.reexec import Handoff, HandoffChild, check, read_handoff
from orchestra_sup.supervisor.runlock import RunLock
from orchestra_sup.supervisor.seam import ProcessSeam
from orchestra_sup.supervisor.spec import ChildSpec, ChildState

DEADLINE_S = 5.0


def handoff(**changes: object) -> Handoff:
    children = [
        HandoffChild(
            name="custodian",
            generation=3,
            state=ChildState.RUNNING,
            pid=4242,
            create_time=1796001254.24,
            started_at=812.5,
            restarts=2,
            operator_restarts=1,
            last_exit=ExitInfo(signal=9),
            release="/opt/old/bin/python",
            version="0.1.0",
            endpoint="ipc:///run/osup/custodian.ipc",
        ),
        HandoffChild(name="shard-0", generation=1, state=ChildState.STOPPED),
    ]
    fields: dict[str, object] = {
        "boot": "0123456789ab",
        "release": "/opt/new/bin/python",
        "run_lock_fd": 7,
        "state_lock_fd": 8,
        "run_dir": "/run/osup",
        "state_dir": "/var/lib/osup",
        "workspace": None,
        "settings": Settings(shards=ShardSettings(count=1, capabilities=("gpu",))),
        "children": children,
        "exec_at": 900.25,
        "carry": b"\x00rollover\xff",
    }
    fields.update(changes)
    return Handoff(**fields)  # type: ignore[arg-type]


def memfd(data: bytes) -> int:
    fd = os.memfd_create("test-handoff")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


# --- the hand-off --------------------------------------------------------------------------------


def test_handoff_round_trip() -> None:
    """A hand-off read back from its descriptor is the one written, carry bytes included, and
    the descriptor is closed."""
    sent = handoff(log_format=LogFormat.JSON, generation=3)
    fd = memfd(msgspec.msgpack.encode(sent))
    assert read_handoff(fd) == sent
    with pytest.raises(OSError):
        os.fstat(fd)


def test_handoff_from_an_older_writer() -> None:
    """A release that does not know the newest fields (carry, a child's endpoint, the log
    format and the supervisor's generation) writes a hand-off this one still reads, with their
    defaults (msgspec schema evolution): text logs, the second image."""
    raw = msgspec.to_builtins(handoff(log_format=LogFormat.JSON, generation=5))
    for field in ("carry", "log_format", "generation"):
        del raw[field]
    for child in raw["children"]:
        child.pop("endpoint", None)
    got = read_handoff(memfd(msgspec.msgpack.encode(raw)))
    assert got.carry == b"" and got.children[0].endpoint == ""
    assert got.log_format is LogFormat.TEXT and got.generation == 2
    assert got.children[0].create_time == 1796001254.24


def test_unreadable_handoff_is_one_line() -> None:
    """Garbage, or a descriptor that is not open, is a one-line `SupervisionError`."""
    with pytest.raises(SupervisionError, match=r"^hand-off descriptor \d+: ") as garbage:
        read_handoff(memfd(b"\x93not a handoff"))
    assert "\n" not in str(garbage.value)
    fd = memfd(b"")
    os.close(fd)
    with pytest.raises(SupervisionError, match="Bad file descriptor"):
        read_handoff(fd)


def test_a_handoff_of_another_tree_is_refused() -> None:
    """Children other than this tree's, or one neither running nor stopped, are refused before
    anything is touched."""
    seam, _worker, _seen = seam_and_worker()
    workers = [Worker(ChildSpec(name=n, role="x"), Flags(), seam) for n in ("custodian", "shard-0")]
    check(handoff(), workers)
    with pytest.raises(SupervisionError, match="not this release's tree"):
        check(handoff(), workers[:1])
    odd = handoff(
        children=[
            *handoff().children[:1],
            HandoffChild(name="shard-0", generation=2, state=ChildState.BACKOFF),
        ]
    )
    with pytest.raises(SupervisionError, match="shard-0 was handed over backoff"):
        check(odd, workers)


# --- the directory locks -------------------------------------------------------------------------


def test_an_inherited_run_lock_keeps_the_childrens_sockets(tmp_path: Path) -> None:
    """Taking the run directory's lock over by its descriptor sweeps no socket (they are the
    live children's), keeps the directory held, and makes the descriptor close-on-exec."""
    held = RunLock(tmp_path)
    (tmp_path / "shard-0.ipc").touch()
    os.set_inheritable(held.fileno(), True)  # as the old image leaves it
    taken = RunLock.inherited(held.fileno(), tmp_path)
    assert (tmp_path / "shard-0.ipc").exists()
    assert not os.get_inheritable(taken.fileno())
    with pytest.raises(DirBusy):
        RunLock(tmp_path)
    taken.release()


def test_a_descriptor_that_is_not_the_lock_is_refused(tmp_path: Path) -> None:
    """A descriptor of another file, or of the lock file without the lock, is a one-line
    `ConfigError`."""
    held = RunLock(tmp_path)
    other = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT)
    with pytest.raises(ConfigError, match="is not its lock file"):
        RunLock.inherited(other, tmp_path)
    stranger = os.open(tmp_path / "supervisor.lock", os.O_RDWR)
    with pytest.raises(ConfigError, match=r"is not its lock$"):
        RunLock.inherited(stranger, tmp_path)
    for fd in (other, stranger):
        os.close(fd)
    held.release()


# --- a child held again --------------------------------------------------------------------------


class Seen:
    """What the seam reported: after-exit clean-ups, by (name, generation)."""

    def __init__(self) -> None:
        self.after_exit: list[tuple[str, int]] = []


def seam_and_worker() -> tuple[ProcessSeam, Worker, Seen]:
    seen = Seen()

    def make_args(worker: Worker) -> ChildArgs:
        raise AssertionError("nothing is spawned")

    seam = ProcessSeam(make_args, lambda w, g: seen.after_exit.append((w.name, g)), lambda w: None)
    worker = Worker(ChildSpec(name="shard-0", role="shard"), Flags(), seam)
    return seam, worker, seen


def sleeper() -> tuple[int, float]:
    pid = os.posix_spawnp("sleep", ["sleep", "60"], os.environ)
    return pid, psutil.Process(pid).create_time()


async def exited(worker: Worker) -> None:
    async with asyncio.timeout(DEADLINE_S):
        while worker.state is not ChildState.EXITED:
            await asyncio.sleep(0.01)


def test_a_process_with_another_create_time_is_an_exit() -> None:
    """A recorded pid whose process has another create time is not the child: it is neither
    held nor signalled, and the worker is told of an exit (with no status), generation kept."""

    async def scenario() -> None:
        seam, worker, seen = seam_and_worker()
        pid, created = sleeper()
        try:
            worker.resume(4, 10.0)
            assert not seam.adopt(worker, pid, created + 0.01)
            assert worker.name not in seam.procs and pid not in seam.known_pids()
            await exited(worker)
            assert worker.last_exit == ExitInfo(status=None, signal=None)
            assert worker.generation == 4 and seen.after_exit == [("shard-0", 4)]
            assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # never signalled
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)

    asyncio.run(scenario())


def test_a_vanished_process_is_an_exit() -> None:
    """A recorded pid with no process left is an exit too."""

    async def scenario() -> None:
        seam, worker, seen = seam_and_worker()
        pid, created = sleeper()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        worker.resume(1, 0.0)
        assert not seam.adopt(worker, pid, created)
        await exited(worker)
        assert seen.after_exit == [("shard-0", 1)]

    asyncio.run(scenario())


def test_an_adopted_process_is_watched_through_its_pidfd() -> None:
    """The recorded process is held at its generation, and its exit (SIGKILL) reaches the
    worker through the pidfd alone (no SIGCHLD handler here)."""

    async def scenario() -> None:
        seam, worker, _seen = seam_and_worker()
        pid, created = sleeper()
        worker.resume(7, 5.0)
        assert seam.adopt(worker, pid, created)
        assert worker.state is ChildState.RUNNING and worker.pid == pid
        assert worker.generation == 7 and worker.started_at == 5.0
        os.kill(pid, signal.SIGKILL)
        await exited(worker)
        assert worker.last_exit == ExitInfo(signal=signal.SIGKILL)
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped by the seam

    asyncio.run(scenario())


def test_a_child_that_exited_during_the_exec_is_reaped() -> None:
    """A child that became a zombie before it was held again is still that child: held, and
    its exit status reaped at once."""

    async def scenario() -> None:
        seam, worker, _seen = seam_and_worker()
        pid, created = sleeper()
        os.kill(pid, signal.SIGTERM)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # a zombie, not reaped
        worker.resume(2, 0.0)
        assert seam.adopt(worker, pid, created)
        await exited(worker)
        assert worker.last_exit == ExitInfo(signal=signal.SIGTERM)

    asyncio.run(scenario())


# --- a new image that cannot adopt ---------------------------------------------------------------

STOP_SCRIPT = """
import json, os, subprocess, sys, time
from orchestra_sup.supervisor.process import child_pids
from orchestra_sup.supervisor.reexec import stop_children
polite = subprocess.Popen(["sleep", "60"])
stubborn = subprocess.Popen(
    [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
     " print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
stubborn.stdout.readline()  # it ignores SIGTERM now
began = time.monotonic()
count = stop_children(float(sys.argv[1]))
took = time.monotonic() - began
print(json.dumps({"count": count, "took": took, "left": sorted(child_pids()),
                  "polite": polite.poll(), "stubborn": stubborn.poll()}))
"""


def test_stop_children_asks_then_kills_and_reaps() -> None:
    """Every child gets SIGTERM; one that ignores it is SIGKILLed after the grace; all are
    reaped, and nothing is left."""
    out = subprocess.run(
        [sys.executable, "-c", STOP_SCRIPT, "0.5"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    got = json.loads(out.stdout)
    assert got["count"] == 2 and got["left"] == []
    assert 0.5 <= got["took"] < 5
    # reaped by stop_children, so Popen sees no status of its own (ECHILD -> 0)
    assert got["polite"] is not None and got["stubborn"] is not None

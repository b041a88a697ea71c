"""systemd's notify protocol as the supervisor speaks it."""

from __future__ import annotations

import array
import asyncio
import os
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestra_sup.supervisor import notify


def test_no_socket_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside systemd (no NOTIFY_SOCKET) sending does nothing and says so."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify.send("READY=1") is False


def test_datagram_reaches_a_path_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """READY=1 arrives as one datagram on a path socket."""
    path = tmp_path / "n.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as rx:
        rx.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert notify.send("READY=1\nSTATUS=ok")
        assert rx.recv(100) == b"READY=1\nSTATUS=ok"


def test_abstract_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """An '@name' NOTIFY_SOCKET is an abstract unix address."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as rx:
        rx.bind("\0orchestra-sup-test-notify")
        monkeypatch.setenv("NOTIFY_SOCKET", "@orchestra-sup-test-notify")
        assert notify.send("STOPPING=1")
        assert rx.recv(100) == b"STOPPING=1"


@pytest.mark.timeout(20)
def test_a_reader_that_never_reads_never_blocks_the_sender(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the reader's queue is full, messages are dropped instead of blocking the loop."""
    path = tmp_path / "full.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as rx:
        rx.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        results = [notify.send(f"STATUS={i}") for i in range(5000)]
    assert results[0] is True
    assert results[-1] is False


@pytest.fixture
def receiver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A bound notify socket, named in NOTIFY_SOCKET; WATCHDOG_* cleared."""
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as rx:
        rx.bind(str(tmp_path / "n.sock"))
        rx.settimeout(10)
        monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "n.sock"))
        yield rx


def fields(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().split("\n"))


def test_reloading_carries_the_monotonic_clock(receiver: socket.socket) -> None:
    """RELOADING=1 comes with MONOTONIC_USEC= (now, CLOCK_MONOTONIC µs) and a one-line STATUS;
    READY=1 ends it."""
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert notify.reloading("reloading\nconfig")
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    got = fields(receiver.recv(4096))
    assert got.keys() == {"RELOADING", "MONOTONIC_USEC", "STATUS"}
    assert got["RELOADING"] == "1" and got["STATUS"] == "reloading config"
    assert before <= int(got["MONOTONIC_USEC"]) <= after
    assert notify.ready("4/4 children running")
    assert fields(receiver.recv(4096)) == {"READY": "1", "STATUS": "4/4 children running"}
    assert notify.stopping()
    assert fields(receiver.recv(4096))["STOPPING"] == "1"


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        (None, None, None),
        ("0", None, None),
        ("abc", None, None),
        ("-5", None, None),
        ("2000000", None, 1.0),
        ("2000000", "self", 1.0),
        ("2000000", "1", None),
    ],
)
def test_watchdog_interval(
    monkeypatch: pytest.MonkeyPatch, usec: str | None, pid: str | None, expected: float | None
) -> None:
    """Half of WATCHDOG_USEC, in seconds; none when it is unset, not a positive integer, or
    WATCHDOG_PID names another process (inherited variables meant for a parent)."""
    for name, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(os.getpid()) if value == "self" else value)
    assert notify.watchdog_interval() == expected


@pytest.mark.timeout(20)
def test_a_wedged_loop_stops_the_pings(receiver: socket.socket) -> None:
    """keep_alive pings from the loop it runs on: while that loop is blocked no WATCHDOG=1 goes
    out (so systemd's watchdog fires); once it runs again the pings resume."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        receiver.setblocking(False)
        task = asyncio.create_task(notify.keep_alive(0.01))
        try:
            assert await loop.sock_recv(receiver, 100) == b"WATCHDOG=1"
            await loop.sock_recv(receiver, 100)  # pings keep coming while the loop runs
            while True:  # what was sent up to now
                try:
                    receiver.recv(100)
                except BlockingIOError:
                    break
            time.sleep(0.3)  # the wedge: a handler that blocks the loop for 30 intervals
            with pytest.raises(BlockingIOError):
                receiver.recv(100)
            assert await loop.sock_recv(receiver, 100) == b"WATCHDOG=1"
        finally:
            task.cancel()

    asyncio.run(scenario())


def test_receive_closes_a_barrier_descriptor(tmp_path: Path) -> None:
    """BARRIER=1 as sd_notify_barrier(3) sends it (a pipe's write end, SCM_RIGHTS): the sender's
    read end sees the hang-up as soon as `receive` has read the datagram, not before; any
    descriptor kept open would hold the sender until its barrier times out."""
    path = str(tmp_path / "n.sock")
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as rx,
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as tx,
    ):
        rx.bind(path)
        rx.settimeout(10)
        read_end, write_end = os.pipe()
        try:
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [write_end]))]
            tx.sendmsg([b"BARRIER=1"], rights, 0, path)
            os.close(write_end)
            poller = select.poll()
            poller.register(read_end, 0)  # POLLHUP is always reported
            assert poller.poll(0) == []  # in flight: the datagram holds a copy
            before = set(os.listdir("/proc/self/fd"))
            assert notify.receive(rx) == b"BARRIER=1"
            assert set(os.listdir("/proc/self/fd")) <= before
            assert poller.poll(0) == [(read_end, select.POLLHUP)]
        finally:
            os.close(read_end)


def test_receive_reads_a_plain_datagram(receiver: socket.socket) -> None:
    """Without ancillary data `receive` is a plain read of one datagram."""
    notify.send("READY=1\nSTATUS=x")
    notify.send("STATUS=y")
    assert notify.receive(receiver) == b"READY=1\nSTATUS=x"
    assert notify.receive(receiver) == b"STATUS=y"

"""systemd's notify protocol as the supervisor speaks it."""

from __future__ import annotations

import socket
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

"""A real three-member etcd cluster on loopback ports, for tests (issue 21): each member its own
`etcd` process with its own data directory, killed and started again by the test.

`etcd` is Debian's etcd-server (the Makefile installs it where it can, as it does bubblewrap);
where it is missing, the tests that need it skip with that reason.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ETCD = shutil.which("etcd")
START_TIMEOUT_S = 30.0

needs_etcd = pytest.mark.skipif(
    ETCD is None, reason="etcd is not installed (Debian: apt-get install etcd-server)"
)


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


class PortTaken(Exception):
    """A member could not bind its port: another process took it between `_free_port` and
    etcd's own bind."""


class EtcdCluster:
    """Members m0..m{size-1} under `root`, on `address`'s ports; `endpoints` are their client
    URLs, in order."""

    @classmethod
    def up(
        cls, root: Path, size: int = 3, attempts: int = 3, address: str = "127.0.0.1"
    ) -> EtcdCluster:
        """A new cluster under `root`, every member healthy. A port taken by another test
        between choosing it and etcd binding it (pytest-xdist runs two workers) is retried
        with fresh ports, up to `attempts` times; whatever fails, no member is left running."""
        for attempt in range(attempts):
            members = cls(root / f"try{attempt}", size, address)
            members.root.mkdir(parents=True)
            try:
                members.start()
                return members
            except PortTaken:
                members.stop()
            except BaseException:
                members.stop()
                raise
        raise AssertionError(f"etcd: a port was taken on each of {attempts} attempts")

    def __init__(self, root: Path, size: int = 3, address: str = "127.0.0.1") -> None:
        self.root = root
        self.names = [f"m{i}" for i in range(size)]
        self.client = {n: f"http://{address}:{_free_port(address)}" for n in self.names}
        self.peer = {n: f"http://{address}:{_free_port(address)}" for n in self.names}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def endpoints(self) -> list[str]:
        return [self.client[n] for n in self.names]

    def start(self, *names: str) -> None:
        """Start `names` (default: every member not running), then wait until each is healthy
        (`/health`: it has a leader)."""
        initial = ",".join(f"{n}={self.peer[n]}" for n in self.names)
        for name in names or [n for n in self.names if n not in self.procs]:
            data = self.root / name
            log = (self.root / f"{name}.log").open("ab")
            self.procs[name] = subprocess.Popen(
                [
                    str(ETCD),
                    "--name", name,
                    "--data-dir", str(data),
                    "--listen-client-urls", self.client[name],
                    "--advertise-client-urls", self.client[name],
                    "--listen-peer-urls", self.peer[name],
                    "--initial-advertise-peer-urls", self.peer[name],
                    "--initial-cluster", initial,
                    "--initial-cluster-state", "new",
                    "--initial-cluster-token", f"osup-test-{self.root.name}",
                    "--heartbeat-interval", "100",
                    "--election-timeout", "1000",
                ],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
            log.close()
        self.wait_healthy(*(names or self.names))

    def wait_healthy(self, *names: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        for name in names:
            while not self.healthy(name):
                log = (self.root / f"{name}.log").read_text()[-2000:]
                if self.procs[name].poll() is not None:
                    if "address already in use" in log:
                        raise PortTaken(name)
                    raise AssertionError(f"etcd {name} exited: {log}")
                assert time.monotonic() < deadline, (
                    f"etcd {name} not healthy within {START_TIMEOUT_S:g} s: {log}"
                )
                time.sleep(0.1)

    def healthy(self, name: str) -> bool:
        try:
            with urllib.request.urlopen(self.client[name] + "/health", timeout=1) as reply:
                return b'"health":"true"' in reply.read()
        except (urllib.error.URLError, OSError):
            return False

    def kill(self, name: str) -> None:
        """SIGKILL member `name` (its data stays: `start(name)` brings it back)."""
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        for name in list(self.procs):
            self.kill(name)

"""Another machine's network for a test (issue 21): a network namespace joined to this one by a
veth pair. The host's address exists only inside the namespace, the root's on this side; a
process run under `wrap` (`ip netns exec NS`) reaches the root only over the pair, not over
loopback. A partition is `ip link set ... down` on this side (`down`), as a cable pulled.

Needs root and iproute2; where either is missing, or the kernel makes no namespace, the tests
that need it skip with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

IP = shutil.which("ip")


def _ip(*args: str, ns: str | None = None) -> None:
    argv = [str(IP), *(["-n", ns] if ns else []), *args]
    subprocess.run(argv, check=True, capture_output=True, timeout=10)


class HostNet:
    """Namespace `osup-<n>` with `host_ip` on its end of the pair, `root_ip` on this end (a /30
    of 10.213.0.0/16 picked from `n`)."""

    def __init__(self, n: int) -> None:
        self.ns = f"osup-{n}"
        self.root_dev, host_dev = f"osr{n}", f"osh{n}"
        a, b = divmod(n * 4 % 65536, 256)
        self.root_ip, self.host_ip = f"10.213.{a}.{b + 1}", f"10.213.{a}.{b + 2}"
        _ip("netns", "add", self.ns)
        try:
            _ip("link", "add", self.root_dev, "type", "veth", "peer", "name", host_dev)
            _ip("link", "set", host_dev, "netns", self.ns)
            _ip("addr", "add", f"{self.root_ip}/30", "dev", self.root_dev)
            _ip("link", "set", self.root_dev, "up")
            _ip("addr", "add", f"{self.host_ip}/30", "dev", host_dev, ns=self.ns)
            _ip("link", "set", host_dev, "up", ns=self.ns)
            _ip("link", "set", "lo", "up", ns=self.ns)
        except BaseException:
            self.remove()
            raise

    @property
    def wrap(self) -> list[str]:
        """The command prefix that runs a process on the host's network."""
        return [str(IP), "netns", "exec", self.ns]

    def down(self) -> None:
        """Partition: the pair carries nothing either way (TCP segments wait to be resent)."""
        _ip("link", "set", self.root_dev, "down")

    def up(self) -> None:
        _ip("link", "set", self.root_dev, "up")

    def remove(self) -> None:
        """The namespace and the pair go (deleting one end of a veth deletes both)."""
        subprocess.run([str(IP), "link", "del", self.root_dev], capture_output=True, timeout=10)
        subprocess.run([str(IP), "netns", "del", self.ns], capture_output=True, timeout=10)


def host_net(n: int) -> HostNet:
    """A `HostNet`, or a skip saying why this machine cannot make one."""
    if IP is None:
        pytest.skip("iproute2's ip is not installed")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    try:
        return HostNet(n)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot make a network namespace here: {exc.stderr.decode().strip()}")
